"""Upsampling: nearest, nearest-exact, (bi/tri)linear, bicubic, antialiased; with gradients.

Interpolation is separable: along each spatial axis an output position reads a
few input positions ("taps") with fixed weights. The taps and weights are
computed once, statically, with PyTorch's own float arithmetic
(area_pixel_compute_scale / area_pixel_compute_source_index in opmath
precision), so indices match the CPU exactly. The forward gathers each tap
and sums the weighted values axis by axis, innermost axis first as PyTorch's
kernels do; the backward scatter-adds the weighted gradient into the taps.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..registry import lower
from ._ops import aten

_CUBIC_A = -0.75


def _opmath(dtype):
    return np.float64 if dtype == jnp.float64 else np.float32


def _scale_value(scale, n_in, n_out, ft):
    """compute_scales_value: 1/scale_factor when given, else in/out."""
    if scale is not None and scale > 0:
        return ft(1.0 / scale)
    return ft(n_in) / ft(n_out)


def _area_scale(n_in, n_out, align_corners, scale, ft):
    if align_corners:
        return ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0)
    return _scale_value(scale, n_in, n_out, ft)


def _source_index(scale, n_out, align_corners, cubic, ft):
    dst = np.arange(n_out).astype(ft)
    if align_corners:
        return scale * dst
    src = scale * (dst + ft(0.5)) - ft(0.5)
    return src if cubic else np.where(src < 0, ft(0), src)


def _guard(real, n_in, ft):
    """guard_index_and_lambda: floor index (at most n_in - 1) and its fraction in [0, 1].
    (PyTorch floors with floorf, in float32, whatever the precision.)"""
    index = np.minimum(np.floor(real.astype(np.float32)).astype(np.int64), n_in - 1)
    lam = np.clip(real - index.astype(ft), ft(0), ft(1)).astype(ft)
    return index, lam


# Taps along one axis: a list of (input index per output position, weight or None).
def _nearest_taps(n_in, n_out, scale, exact, ft):
    if exact:
        real = _source_index(_scale_value(scale, n_in, n_out, ft), n_out, False, False, ft)
        index = np.floor(real + ft(0.5)).astype(np.int64)
    else:
        index = np.floor(_scale_value(scale, n_in, n_out, ft)
                         * np.arange(n_out).astype(ft)).astype(np.int64)
    return [(np.minimum(index, n_in - 1), None)]


def _linear_taps(n_in, n_out, align_corners, scale, ft):
    if n_out == n_in and not align_corners:
        return [(np.arange(n_out), None)]
    real = _source_index(_area_scale(n_in, n_out, align_corners, scale, ft), n_out,
                         align_corners, False, ft)
    i0, lam1 = _guard(real, n_in, ft)
    i1 = i0 + (i0 < n_in - 1)
    return [(i0, (ft(1) - lam1).astype(ft)), (i1, lam1)]


def _cubic_taps(n_in, n_out, align_corners, scale, ft):
    real = _source_index(_area_scale(n_in, n_out, align_corners, scale, ft), n_out,
                         align_corners, True, ft)
    i, t = _guard(real, n_in, ft)
    a = ft(_CUBIC_A)

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    return [(np.clip(i - 1 + j, 0, n_in - 1), w.astype(ft)) for j, w in enumerate(weights)]


def _aa_filter(kind, x, ft, a=-0.5):
    """PyTorch's resampling filters: triangle (bilinear), Keys cubic (bicubic)."""
    x = np.abs(x)
    if kind == "linear":
        return np.where(x < 1, ft(1) - x, ft(0)).astype(ft)
    a = ft(a)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, ft(0))).astype(ft)


def _resample_weights(n_in, n_out, align_corners, scale, kind, antialias, ft):
    """PyTorch's separable resampling weights, shaped (width, n_out), and their maximum.

    With antialias (_compute_indices_min_size_weights_aa) the filter widens with
    the downscale factor and each output's weights are normalized to sum to 1.
    Without (_compute_indices_min_size_weights, used for uint8 only) there are
    2 or 4 taps at the usual source index, and taps that fall outside the
    input add their weight to the edge element.
    """
    s = _area_scale(n_in, n_out, align_corners, scale, ft)
    taps = 2 if kind == "linear" else 4
    a = -0.5 if antialias else _CUBIC_A
    if antialias:
        support = ft(taps * 0.5 * np.float64(s)) if s >= 1 else ft(taps * 0.5)
        width = int(np.ceil(support)) * 2 + 1
        invscale = ft(1.0 / np.float64(s)) if s >= 1 else ft(1)
    else:
        width = taps
        first, lam = _guard(_source_index(s, n_out, align_corners, taps > 2, ft), n_in, ft)
    index = np.zeros((width, n_out), np.int64)
    weight = np.zeros((width, n_out), ft)
    w_max = ft(0)
    for i in range(n_out):
        if antialias:
            center = ft(np.float64(s) * (i + 0.5))
            lo = max(int(np.float64(center - support) + 0.5), 0)
            size = min(max(min(int(np.float64(center + support) + 0.5), n_in) - lo, 0), width)
            arg = ft((np.float64(ft(np.arange(size) + lo) - center) + 0.5) * invscale)
            w = _aa_filter(kind, arg, ft, a)
            total = ft(0)
            for v in w:  # summed in order, in the weights' precision, as PyTorch does
                total = ft(total + v)
            if total != 0:
                w = (w / total).astype(ft)
                w_max = max(w_max, w.max(initial=ft(0)))
        else:
            unbound = first[i] - taps // 2 + 1
            lo = max(unbound, 0)
            size = min(max(min(first[i] + taps // 2 + 1, n_in) - lo, 0), width)
            w = np.zeros(width, ft)
            k = 0
            for j in range(width):
                v = _aa_filter(kind, np.asarray(ft(j + 1 - taps // 2) - lam[i], ft), ft, a)
                if unbound + j <= 0:
                    k = 0
                elif unbound + j >= n_in - 1:
                    k = size - 1
                w[k] = w[k] + v
                w_max = max(w_max, w[k])
                k += 1
            w = w[:size]
        index[:, i] = lo  # unused taps read the window's first element with weight 0
        index[:size, i] = lo + np.arange(size)
        weight[:size, i] = w
    return index, weight, w_max


def _aa_taps(n_in, n_out, align_corners, scale, kind, ft):
    """Antialiased taps. PyTorch leaves a dimension of unchanged size alone."""
    if n_in == n_out:
        return [(np.arange(n_out), None)]
    index, weight, _ = _resample_weights(n_in, n_out, align_corners, scale, kind, True, ft)
    return [(index[j], weight[j]) for j in range(len(index))]


def _uint8_resample(x, kind, output_size, align_corners, scales, antialias):
    """PyTorch's uint8 resampling (as PIL's): int16 fixed-point weights, integer sums
    rounded and clipped to [0, 255] after each axis, innermost axis first. The cubic
    filter has a = -0.5 with antialias (as PIL's), -0.75 without."""
    nd = len(output_size)
    for i in reversed(range(nd)):
        axis = x.ndim - nd + i
        n_in, n_out = x.shape[axis], output_size[i]
        if n_in == n_out:
            continue
        index, weight, w_max = _resample_weights(n_in, n_out, align_corners, scales[i], kind,
                                                 antialias, np.float64)
        precision = 0
        while precision < 22 and int(0.5 + w_max * (1 << (precision + 1))) < (1 << 15):
            precision += 1
        scaled = weight * (1 << precision)
        fixed = np.where(scaled < 0, (scaled - 0.5).astype(np.int64),
                         (scaled + 0.5).astype(np.int64))
        total = jnp.full(x.shape[:axis] + (n_out,) + x.shape[axis + 1:], 1 << (precision - 1),
                         jnp.int64) if precision else 0
        for j in range(len(index)):
            v = jnp.take(x, jnp.asarray(index[j]), axis=axis).astype(jnp.int64)
            total = total + v * _along(fixed[j], axis, x.ndim)
        x = jnp.clip(total >> precision, 0, 255).astype(x.dtype)
    return x


def _along(v, axis, ndim):
    """A per-output-position vector shaped to broadcast along `axis`."""
    shape = [1] * ndim
    shape[axis] = v.shape[0]
    return jnp.asarray(v.reshape(shape))


def _repeat_factor(taps, n_in):
    """f when the taps are the single index o // f (a whole-number nearest upscale)."""
    if len(taps) != 1 or taps[0][1] is not None:
        return None
    index = taps[0][0]
    f = len(index) // n_in if n_in else 0
    if f >= 1 and len(index) == n_in * f and np.array_equal(index, np.arange(len(index)) // f):
        return f
    return None


def _interpolate(x, taps_per_axis):
    """Apply each axis's taps, innermost axis first; taps_per_axis[i] is for axis -(nd - i)."""
    nd = len(taps_per_axis)
    for i in reversed(range(nd)):
        axis = x.ndim - nd + i
        taps = taps_per_axis[i]
        f = _repeat_factor(taps, x.shape[axis])
        if f is not None:
            x = jnp.repeat(x, f, axis=axis) if f > 1 else x
            continue
        out = None
        for index, weight in taps:
            v = jnp.take(x, jnp.asarray(index), axis=axis)
            if weight is not None:
                v = v * _along(weight.astype(np.dtype(x.dtype)), axis, x.ndim)
            out = v if out is None else out + v
        x = out
    return x


def _interpolate_backward(g, input_size, taps_per_axis):
    """The adjoint of `_interpolate`: each tap's weighted gradient added into its inputs."""
    nd = len(taps_per_axis)
    for i in range(nd):
        axis = g.ndim - nd + i
        n_in = input_size[axis]
        taps = taps_per_axis[i]
        f = _repeat_factor(taps, n_in)
        if f is not None:
            shape = g.shape[:axis] + (n_in, f) + g.shape[axis + 1:]
            g = jnp.sum(g.reshape(shape), axis=axis + 1)
            continue
        moved = jnp.moveaxis(g, axis, 0)
        index = np.concatenate([t[0] for t in taps])
        parts = []
        for _, weight in taps:
            parts.append(moved if weight is None else
                         moved * _along(weight.astype(np.dtype(g.dtype)), 0, moved.ndim))
        values = jnp.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        out = jnp.zeros((n_in,) + moved.shape[1:], g.dtype).at[jnp.asarray(index)].add(values)
        g = jnp.moveaxis(out, 0, axis)
    return g


def _compute(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


# ---------------------------------------------------------------- nearest
def _nearest(x, output_size, scales, exact):
    nd = len(output_size)
    ft = _opmath(x.dtype)
    sizes = x.shape[-nd:]
    taps = [_nearest_taps(n, o, s, exact, ft) for n, o, s in zip(sizes, output_size, scales)]
    return _interpolate(x, taps)


def _nearest_backward(grad, output_size, input_size, scales, exact):
    nd = len(output_size)
    ft = _opmath(grad.dtype)
    taps = [_nearest_taps(n, o, s, exact, ft)
            for n, o, s in zip(input_size[-nd:], output_size, scales)]
    g = _compute(grad)
    return _interpolate_backward(g, tuple(input_size), taps).astype(grad.dtype)


@lower(aten.upsample_nearest1d.default)
def upsample_nearest1d(x, output_size, scales=None):
    return _nearest(x, output_size, [scales], False)


@lower(aten.upsample_nearest2d.default)
def upsample_nearest2d(x, output_size, scales_h=None, scales_w=None):
    return _nearest(x, output_size, [scales_h, scales_w], False)


@lower(aten.upsample_nearest3d.default)
def upsample_nearest3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _nearest(x, output_size, [scales_d, scales_h, scales_w], False)


@lower(aten._upsample_nearest_exact1d.default)
def upsample_nearest_exact1d(x, output_size, scales=None):
    return _nearest(x, output_size, [scales], True)


@lower(aten._upsample_nearest_exact2d.default)
def upsample_nearest_exact2d(x, output_size, scales_h=None, scales_w=None):
    return _nearest(x, output_size, [scales_h, scales_w], True)


@lower(aten._upsample_nearest_exact3d.default)
def upsample_nearest_exact3d(x, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _nearest(x, output_size, [scales_d, scales_h, scales_w], True)


@lower(aten.upsample_nearest1d_backward.default)
def upsample_nearest1d_backward(grad, output_size, input_size, scales=None):
    return _nearest_backward(grad, output_size, input_size, [scales], False)


@lower(aten.upsample_nearest2d_backward.default)
def upsample_nearest2d_backward(grad, output_size, input_size, scales_h=None, scales_w=None):
    return _nearest_backward(grad, output_size, input_size, [scales_h, scales_w], False)


@lower(aten.upsample_nearest3d_backward.default)
def upsample_nearest3d_backward(grad, output_size, input_size, scales_d=None, scales_h=None,
                                scales_w=None):
    return _nearest_backward(grad, output_size, input_size, [scales_d, scales_h, scales_w],
                             False)


@lower(aten._upsample_nearest_exact1d_backward.default)
def upsample_nearest_exact1d_backward(grad, output_size, input_size, scales=None):
    return _nearest_backward(grad, output_size, input_size, [scales], True)


@lower(aten._upsample_nearest_exact2d_backward.default)
def upsample_nearest_exact2d_backward(grad, output_size, input_size, scales_h=None,
                                      scales_w=None):
    return _nearest_backward(grad, output_size, input_size, [scales_h, scales_w], True)


@lower(aten._upsample_nearest_exact3d_backward.default)
def upsample_nearest_exact3d_backward(grad, output_size, input_size, scales_d=None,
                                      scales_h=None, scales_w=None):
    return _nearest_backward(grad, output_size, input_size, [scales_d, scales_h, scales_w],
                             True)


# ------------------------------------------------------- linear and cubic
def _smooth_taps(kind, sizes, output_size, align_corners, scales, ft):
    if kind.endswith("_aa"):
        base = kind.removesuffix("_aa")
        return [_aa_taps(n, o, align_corners, s, base, ft)
                for n, o, s in zip(sizes, output_size, scales)]
    make = _cubic_taps if kind == "cubic" else _linear_taps
    return [make(n, o, align_corners, s, ft) for n, o, s in zip(sizes, output_size, scales)]


def _smooth(x, kind, output_size, align_corners, scales):
    if x.dtype == jnp.uint8:
        base = kind.removesuffix("_aa")
        return _uint8_resample(x, base, output_size, align_corners, scales, kind != base)
    nd = len(output_size)
    taps = _smooth_taps(kind, x.shape[-nd:], output_size, align_corners, scales,
                        _opmath(x.dtype))
    return _interpolate(_compute(x), taps).astype(x.dtype)


def _smooth_backward(grad, kind, output_size, input_size, align_corners, scales):
    nd = len(output_size)
    taps = _smooth_taps(kind, input_size[-nd:], output_size, align_corners, scales,
                        _opmath(grad.dtype))
    return _interpolate_backward(_compute(grad), tuple(input_size), taps).astype(grad.dtype)


@lower(aten.upsample_linear1d.default)
def upsample_linear1d(x, output_size, align_corners, scales=None):
    return _smooth(x, "linear", output_size, align_corners, [scales])


@lower(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _smooth(x, "linear", output_size, align_corners, [scales_h, scales_w])


@lower(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(x, output_size, align_corners, scales_d=None, scales_h=None,
                         scales_w=None):
    return _smooth(x, "linear", output_size, align_corners, [scales_d, scales_h, scales_w])


@lower(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _smooth(x, "cubic", output_size, align_corners, [scales_h, scales_w])


@lower(aten.upsample_linear1d_backward.default)
def upsample_linear1d_backward(grad, output_size, input_size, align_corners, scales=None):
    return _smooth_backward(grad, "linear", output_size, input_size, align_corners, [scales])


@lower(aten.upsample_bilinear2d_backward.default)
def upsample_bilinear2d_backward(grad, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None):
    return _smooth_backward(grad, "linear", output_size, input_size, align_corners,
                            [scales_h, scales_w])


@lower(aten.upsample_trilinear3d_backward.default)
def upsample_trilinear3d_backward(grad, output_size, input_size, align_corners, scales_d=None,
                                  scales_h=None, scales_w=None):
    return _smooth_backward(grad, "linear", output_size, input_size, align_corners,
                            [scales_d, scales_h, scales_w])


@lower(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, scales_h=None,
                                scales_w=None):
    return _smooth_backward(grad, "cubic", output_size, input_size, align_corners,
                            [scales_h, scales_w])


@lower(aten._upsample_bilinear2d_aa.default)
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _smooth(x, "linear_aa", output_size, align_corners, [scales_h, scales_w])


@lower(aten._upsample_bicubic2d_aa.default)
def upsample_bicubic2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _smooth(x, "cubic_aa", output_size, align_corners, [scales_h, scales_w])


@lower(aten._upsample_bilinear2d_aa_backward.default)
def upsample_bilinear2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None,
                                    scales_w=None):
    return _smooth_backward(grad, "linear_aa", output_size, input_size, align_corners,
                            [scales_h, scales_w])


@lower(aten._upsample_bicubic2d_aa_backward.default)
def upsample_bicubic2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None,
                                   scales_w=None):
    return _smooth_backward(grad, "cubic_aa", output_size, input_size, align_corners,
                            [scales_h, scales_w])

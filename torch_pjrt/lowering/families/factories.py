"""Factories and random ops: arange, linspace, eye, full, and the RNG-driven fills.

Random ops receive `key`, a JAX PRNG key derived from the device generator's
(seed, offset), so torch.manual_seed makes runs reproducible.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..checks import require, type_name
from ..registry import lower
from ._ops import aten


# The output length depends on start/end/step, so they are static (part of the key).
@lower(aten.arange.start_out, static=("start", "end", "step"))
def arange(start, end, step=1, *, meta):
    (out,) = meta
    n = out.size  # an out= tensor of the right element count keeps its shape (row-major)
    dtype = out.dtype
    if jnp.issubdtype(dtype, jnp.integer):
        return (start + jnp.arange(n, dtype=jnp.int64) * step).astype(dtype).reshape(out.shape)
    acc = jnp.float64
    values = jnp.asarray(start, acc) + jnp.arange(n, dtype=acc) * jnp.asarray(step, acc)
    return values.astype(dtype).reshape(out.shape)


# Functional factories: in eager they reach the backend as empty + an out= op; compiled
# graphs contain them as they are.
@lower(aten.arange.start_step, aten.arange.start, aten.arange.default, eager=False,
       static=("start", "end", "step"))
def arange_functional(start, end=None, step=1, *, dtype=None, layout=None, device=None,
                      pin_memory=None, meta):
    if end is None:
        start, end = 0, start
    return arange(start, end, step, meta=meta)


@lower(aten.empty.memory_format, aten.empty_strided.default, eager=False)
def empty(size, *args, meta, **kwargs):
    return jnp.zeros(meta[0].shape, meta[0].dtype)


def _linspace(start, end, steps, acc):
    if steps == 1:
        return jnp.full((1,), start, acc)
    start, end = jnp.asarray(start, acc), jnp.asarray(end, acc)
    # XLA turns a division by a constant into a product with its reciprocal, which is an ulp
    # off for 49 (126 / 49): integral results, truncated, then lost 1 where CPU's did not.
    step = (end - start) / jax.lax.optimization_barrier(jnp.asarray(steps - 1, acc))
    i = jnp.arange(steps, dtype=acc)
    # PyTorch fills the first half from start and the second half from end.
    half = steps // 2
    return jnp.where(i < half, start + step * i, end - step * (steps - 1 - i))


_C_TYPES = {"uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int",
            "int64": "int64_t"}


def _integral_ends(start, end, dtype):
    """CPU's kernels take start and end in the result's dtype (Scalar::to, which refuses a
    value out of its range and lets a negative integer wrap around an unsigned type)."""
    if not jnp.issubdtype(dtype, jnp.integer) or str(jnp.dtype(dtype)) not in _C_TYPES:
        return start, end
    info = jnp.iinfo(dtype)
    ends = []
    for v in (start, end):
        v = jnp.asarray(v)
        if jnp.issubdtype(v.dtype, jnp.integer):
            low = -int(info.max) if info.min == 0 else int(info.min)
            ok = (v >= low) & (v <= info.max)
            v = v.astype(jnp.int64).astype(dtype)
        else:
            ok = jnp.isinf(v) | ((v >= info.min) & (v <= info.max))
            v = jnp.trunc(v).astype(dtype)
        require(ok, RuntimeError, "value cannot be converted to type "
                f"{_C_TYPES[str(jnp.dtype(dtype))]} without overflow")
        ends.append(v.astype(jnp.float64))
    return tuple(ends)


def _accumulator(dtype):
    return jnp.complex128 if jnp.issubdtype(dtype, jnp.complexfloating) else jnp.float64


# An out= tensor whose element count is `steps` keeps its shape (CPU and CUDA resize it
# only otherwise): the values go into it in row-major order.
@lower(aten.linspace.out)
def linspace(start, end, steps, *, meta):
    (out,) = meta
    if steps == 1:
        return jnp.full(out.shape, start, out.dtype)
    start, end = _integral_ends(start, end, out.dtype)
    return _linspace(start, end, steps, _accumulator(out.dtype)).astype(out.dtype) \
        .reshape(out.shape)


@lower(aten.logspace.out)
def logspace(start, end, steps, base=10.0, *, meta):
    (out,) = meta
    start, end = _integral_ends(start, end, out.dtype)
    acc = _accumulator(out.dtype)
    return (jnp.asarray(base, acc) ** _linspace(start, end, steps, acc)).astype(out.dtype) \
        .reshape(out.shape)


@lower(aten.eye.out, aten.eye.m_out)
def eye(n, m=None, *, meta):
    (out,) = meta
    return jnp.eye(out.shape[0], out.shape[1], dtype=out.dtype)


@lower(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, meta):
    (out,) = meta
    return jnp.full(out.shape, fill_value, out.dtype)


@lower(aten.full_like.default, eager=False)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None, meta):
    return jnp.full(meta[0].shape, fill_value, meta[0].dtype)


@lower(aten.empty_like.default, eager=False)
def empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None, meta):
    return jnp.zeros(meta[0].shape, meta[0].dtype)


# Backward formulas ask for "efficient" zero tensors; on pjrt they are plain zeros.
@lower(aten._efficientzerotensor.default)
def efficient_zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None, meta):
    return jnp.zeros(meta[0].shape, meta[0].dtype)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None, meta):
    return jnp.asarray(s, meta[0].dtype)


# -------------------------------------------------------------------- random
def _float(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.floating) else jnp.float32


@lower(aten.uniform_.default, aten.uniform.default, random=True)
def uniform_(x, from_=0.0, to=1.0, *, generator=None, key):
    require(jnp.asarray(from_) <= jnp.asarray(to), RuntimeError,
            "uniform_ expects to return a [from, to) range, but found from={0} > to={1}",
            from_, to)
    dt = _float(x.dtype)
    u = jax.random.uniform(key, x.shape, dtype=jnp.float32 if dt != jnp.float64 else dt)
    return (from_ + u * (to - from_)).astype(x.dtype)


@lower(aten.normal_.default, random=True)
def normal_(x, mean=0.0, std=1.0, *, generator=None, key):
    dt = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    return (mean + std * jax.random.normal(key, x.shape, dt)).astype(x.dtype)


@lower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor,
       random=True)
def normal(mean, std, *, generator=None, key, meta):
    (out,) = meta
    require(jnp.asarray(std) >= 0, RuntimeError, "normal expects all elements of std >= 0.0")
    dt = jnp.float64 if out.dtype == jnp.float64 else jnp.float32
    return (mean + std * jax.random.normal(key, out.shape, dt)).astype(out.dtype)


@lower(aten.bernoulli_.float, aten.bernoulli.p, random=True)
def bernoulli_float_(x, p=0.5, *, generator=None, key):
    require((jnp.asarray(p) >= 0) & (jnp.asarray(p) <= 1), RuntimeError,
            "bernoulli_ expects p to be in [0, 1], but got p={0}", p)
    return jax.random.bernoulli(key, p, x.shape).astype(x.dtype)


def _check_probabilities(p) -> None:
    require((p >= 0) & (p <= 1), RuntimeError,
            "Expected p_in >= 0 && p_in <= 1 to be true, but got false.")


@lower(aten.bernoulli_.Tensor, aten.bernoulli.Tensor, random=True)  # (x's shape, p's values)
def bernoulli_tensor_(x, p, *, generator=None, key):
    _check_probabilities(p)
    u = jax.random.uniform(key, x.shape, jnp.float32 if p.dtype != jnp.float64 else p.dtype)
    return (u < jnp.broadcast_to(p, x.shape)).astype(x.dtype)


@lower(aten.bernoulli.default, random=True)
def bernoulli(p, *, generator=None, key):
    _check_probabilities(p)
    u = jax.random.uniform(key, p.shape, jnp.float32 if p.dtype != jnp.float64 else p.dtype)
    return (u < p).astype(p.dtype)


def _randint_inclusive(key, shape, low, high, dtype):
    """Integers uniform in [low, high], int64 bounds (the whole int64 range included),
    drawn in 64 bits as the CPU's kernel does (the remainder of a 64-bit draw)."""
    low = jnp.asarray(low, jnp.int64).astype(jnp.uint64)
    span = jnp.asarray(high, jnp.int64).astype(jnp.uint64) - low + jnp.uint64(1)  # 0: 2**64
    bits = jax.random.bits(key, shape, jnp.uint64)
    drawn = jnp.where(span == 0, bits, bits % jnp.maximum(span, jnp.uint64(1)))
    return (low + drawn).astype(jnp.int64).astype(dtype)


def _randint(key, shape, low, high, dtype):
    """Integers uniform in [low, high)."""
    return _randint_inclusive(key, shape, low, jnp.asarray(high, jnp.int64) - 1, dtype)


def _fit_bounds(from_, to, dtype):
    """The CPU's update_from/update_to for a floating dtype: a bound whose neighbour (from
    + 1, to - 1) rounds past it in the dtype moves in by the dtype's spacing there, so that
    no drawn value rounds out of [from, to) (random_(32752) of float16 draws below 32736)."""
    if not jnp.issubdtype(dtype, jnp.floating):
        return from_, to
    digits = jnp.finfo(dtype).nmant + 1

    def spacing(v):  # 1 << (floor(log2 |v|) - digits + 1)
        n = 63 - jax.lax.clz(jnp.abs(v))
        return jnp.left_shift(jnp.int64(1), jnp.maximum(n - digits + 1, 0))

    from_, to = jnp.asarray(from_, jnp.int64), jnp.asarray(to, jnp.int64)
    after = (from_ + 1).astype(dtype).astype(jnp.int64)
    from_ = jnp.where(after < from_, after + spacing(from_ + 1), from_)
    before = (to - 1).astype(dtype).astype(jnp.int64)
    to = jnp.where(before >= to, before - spacing(to - 1), to)
    return from_, to


def _check_range(from_, to) -> None:
    require(jnp.asarray(from_) < jnp.asarray(to), RuntimeError,
            "random_ expects 'from' to be less than 'to', but got from={0} >= to={1}", from_,
            to)


@lower(getattr(aten.random_, "from"), getattr(aten.random, "from"), random=True)
def random_from_(x, from_, to=None, *, generator=None, key):
    if to is None:  # up to the dtype's largest integer (a float's 2 ** digits), included
        if jnp.issubdtype(x.dtype, jnp.floating):
            from_, _ = _fit_bounds(from_, 1, x.dtype)
            return _randint_inclusive(key, x.shape, from_, 2 ** (jnp.finfo(x.dtype).nmant + 1),
                                      x.dtype)
        high = 1 if x.dtype == jnp.bool_ else min(int(jnp.iinfo(x.dtype).max), 2 ** 63 - 1)
        return _randint_inclusive(key, x.shape, from_, high, x.dtype)
    _check_range(from_, to)
    return _randint(key, x.shape, *_fit_bounds(from_, to, x.dtype), x.dtype)


@lower(aten.random_.to, aten.random.to, random=True)
def random_to_(x, to, *, generator=None, key):
    _check_range(0, to)
    return _randint(key, x.shape, *_fit_bounds(0, to, x.dtype), x.dtype)


@lower(aten.random_.default, aten.random.default, random=True)
def random_(x, *, generator=None, key):
    if x.dtype == jnp.bool_:
        return _randint(key, x.shape, 0, 2, x.dtype)
    if jnp.issubdtype(x.dtype, jnp.integer):
        high = min(int(jnp.iinfo(x.dtype).max), 2 ** 63 - 1)
        return _randint_inclusive(key, x.shape, 0, high, x.dtype)
    return _randint_inclusive(key, x.shape, 0, 2 ** (jnp.finfo(x.dtype).nmant + 1), x.dtype)


@lower(aten.exponential_.default, random=True)
def exponential_(x, lambd=1.0, *, generator=None, key):
    return (jax.random.exponential(key, x.shape, _float(x.dtype)) / lambd).astype(x.dtype)


@lower(aten.geometric_.default, random=True)
def geometric_(x, p, *, generator=None, key):
    """Trials to the first success, drawn in floating point for every dtype (PyTorch's
    decomposition draws torch.rand_like(x), which integer dtypes refuse; the CPU's and
    CUDA's kernels fill them too)."""
    require((jnp.asarray(p) > 0) & (jnp.asarray(p) < 1), RuntimeError,
            "geometric_ expects p to be in (0, 1), but got p={0}", p)
    dt = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    u = jax.random.uniform(key, x.shape, dt)
    return (jnp.floor(jnp.log1p(-u) / jnp.log1p(-jnp.asarray(p, dt))) + 1).astype(x.dtype)


@lower(aten.randperm.generator_out, random=True)
def randperm(n, *, generator=None, key, meta):
    (out,) = meta
    return jax.random.permutation(key, out.shape[0]).astype(out.dtype)


def _check_distribution(p, num_samples, replacement):
    """The CPU's checks of multinomial's probabilities, with its messages: one path for a
    single draw or no replacement, another (per entry) for several draws with replacement."""
    if not replacement or num_samples == 1:
        require((jnp.max(p) < jnp.inf) & (jnp.min(p) >= 0), RuntimeError,
                "probability tensor contains either `inf`, `nan` or element < 0")
    else:
        require(p >= 0, RuntimeError,
                "invalid multinomial distribution (encountering probability entry < 0)")
        require(jnp.isfinite(p), RuntimeError, "invalid multinomial distribution "
                "(encountering probability entry = infinity or NaN)")
    require(jnp.sum(p.astype(jnp.float32), axis=-1) > 0, RuntimeError,
            "invalid multinomial distribution (sum of probabilities <= 0)")


@lower(aten.multinomial.default, random=True)
def multinomial(p, num_samples, replacement=False, *, generator=None, key, meta):
    # The CPU kernel's checks of the arguments (PyTorch's meta kernel has fewer).
    if not jnp.issubdtype(p.dtype, jnp.floating):
        raise RuntimeError("multinomial only supports floating-point dtypes for input, got: "
                           f"{type_name(p.dtype)}")
    if meta[0].dtype != jnp.int64:
        raise RuntimeError(f"multinomial expects Long tensor out, got: {type_name(meta[0].dtype)}")
    if p.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if p.shape[-1] > 2 ** 24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > p.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if p.size == 0:  # no rows (a row of no categories: the CPU's check refused it)
        return jnp.zeros(meta[0].shape, jnp.int64)
    _check_distribution(p, num_samples, replacement)
    logits = jnp.log(p.astype(jnp.float32))
    if replacement:
        keys = jax.random.split(key, num_samples)
        draws = jax.vmap(lambda k: jax.random.categorical(k, logits, axis=-1))(keys)
        return jnp.moveaxis(draws, 0, -1).astype(jnp.int64)
    # Without replacement: Gumbel top-k.
    g = jax.random.gumbel(key, logits.shape, jnp.float32)
    return jax.lax.top_k(logits + g, num_samples)[1].astype(jnp.int64)

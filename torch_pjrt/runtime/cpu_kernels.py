"""libtorch's CPU kernels inside XLA:CPU programs (native/cpu_kernels.cpp).

XLA:CPU's dots run at about 80% of MKL's speed on a transformer's linear layers,
its batched products and layer norm far less (docs/xla-cpu-performance.md). On
the cpu platform:

- layer norm's and GELU's lowerings call ATen's kernels (`layer_norm`, `gelu`, and
  their backward);
- programs with matrix products are traced once more before XLA sees them: each
float32 `dot_general` on matrices big enough to matter becomes a custom call into
the shim's GEMM (and so does each batched product whose batch dimensions lead), with
transposes of its operands folded into the call's flags (a
transpose feeding a dot costs XLA nothing; in front of a custom call it would be a
copy). The substitution is one pass over the program's jaxpr, so every mode (strict,
fused, debug, torch.compile) gets it; it runs on the programs of the lowerings
registered with `products=True` (lowering/registry.py).

Off with TORCH_PJRT_CPU_KERNELS=0, and off by itself where libtorch has no MKL.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import source_info_util
from jax.extend.core import Literal

from .. import _env, counters

GEMM = "torch_pjrt_cpu_gemm"
_LAYER_NORM = "torch_pjrt_cpu_layer_norm"
_LAYER_NORM_BACKWARD = "torch_pjrt_cpu_layer_norm_backward"
_GELU = "torch_pjrt_cpu_gelu"
_GELU_BACKWARD = "torch_pjrt_cpu_gelu_backward"
PREFIX = "torch_pjrt_cpu_"  # of every target's name
# Smaller products stay XLA's: its inlined small dots beat a call into the BLAS.
_MIN_FLOPS = 2 * 64 * 64 * 64
_INLINED = ("pjit", "jit")  # nested jit calls are inlined so transposes meet their dots


@functools.cache
def available() -> bool:
    """Whether programs for the cpu platform use libtorch's kernels (registered on first use)."""
    from . import client

    if not _env.flag("TORCH_PJRT_CPU_KERNELS") or client.platform() != "cpu":
        return False
    from . import shim

    handlers = shim().cpu_kernels()
    if not handlers:  # a torch build without MKL
        return False
    for name, handler in handlers.items():
        jax.ffi.register_ffi_target(name, handler, platform="cpu")
    _registered.update(handlers)
    return True


_registered: set[str] = set()  # the kernels this build of the shim has


def _has(target: str) -> bool:
    """Whether `target` can be called: kernels on, and this build of the shim has it."""
    return available() and target in _registered


def rewrite(fn: Callable, products: bool) -> Callable:
    """`fn`, traced so that its large float32 matrix products call the MKL GEMM.

    `products`: whether fn runs a lowering registered with products=True; a program
    without one is left alone (the second trace would cost it 10-20% of its compile)."""
    if not products or not available():
        return fn

    @functools.wraps(fn)
    def traced(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat = jax.tree.leaves(args)
        outs = _eval(closed.jaxpr, closed.consts, flat, {})
        return jax.tree.unflatten(jax.tree.structure(shape), outs)

    return traced


def _eval(jaxpr, consts, args, transposed: dict[int, tuple[Any, Any]]) -> list:
    """Evaluate `jaxpr` on traced values, with eligible dots replaced by the GEMM.

    `transposed` maps id(value) of a transpose of the last two dimensions to (value,
    the transpose's operand)."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    scope = source_info_util.current_name_stack()
    for eqn in jaxpr.eqns:
        # each op keeps its name scope (the ATen op it lowers, in the HLO's metadata)
        with source_info_util.user_context(eqn.source_info.traceback,
                                           name_stack=scope + eqn.source_info.name_stack):
            outs = _eval_eqn(eqn, [read(v) for v in eqn.invars], transposed)
        for v, out in zip(eqn.outvars, outs):
            env[v] = out
    return [read(v) for v in jaxpr.outvars]


def _eval_eqn(eqn, invals: list, transposed: dict) -> list:
    name = eqn.primitive.name
    if name in _INLINED:
        inner = eqn.params["jaxpr"]
        return _eval(inner.jaxpr, inner.consts, invals, transposed)
    outs = _gemm(eqn.params, invals, transposed) if name == "dot_general" else None
    if outs is None:
        with eqn.ctx.manager:
            outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
        if not eqn.primitive.multiple_results:
            outs = [outs]
    if name == "transpose" and _swaps_last_two(eqn.params["permutation"]):
        transposed[id(outs[0])] = (outs[0], invals[0])
    return outs


def _gemm(params, operands, transposed) -> list | None:
    """[the GEMM's result] for an eligible dot_general, else None: float32 matrices, or
    stacks of them whose batch dimensions lead on both sides."""
    a, b = operands
    (ca, cb), (ba, bb) = params["dimension_numbers"]
    out_type = params.get("preferred_element_type")
    rank = np.ndim(a)
    batch = tuple(range(rank - 2))
    if (rank < 2 or np.ndim(b) != rank or tuple(ba) != batch or tuple(bb) != batch
            or a.dtype != jnp.float32 or b.dtype != jnp.float32
            or (out_type is not None and out_type != jnp.float32)):
        return None
    ta, tb = tuple(ca) == (rank - 2,), tuple(cb) == (rank - 1,)
    if not (ta or tuple(ca) == (rank - 1,)) or not (tb or tuple(cb) == (rank - 2,)):
        return None
    m, k = (a.shape[-1], a.shape[-2]) if ta else a.shape[-2:]
    n = b.shape[-2] if tb else b.shape[-1]
    if 2 * math.prod(a.shape[:-2]) * m * n * k < _MIN_FLOPS or max(m, n, k) >= 2**31:
        return None  # small, or past the 32-bit sizes of the BLAS interface
    a, ta = _untransposed(a, ta, transposed)
    b, tb = _untransposed(b, tb, transposed)
    counters.count("cpu_gemm_traced")
    call = jax.ffi.ffi_call(GEMM, jax.ShapeDtypeStruct(a.shape[:-2] + (m, n), jnp.float32))
    return [call(_hint(a), a, b, ta=ta, tb=tb)]


def _swaps_last_two(permutation) -> bool:
    r = len(permutation)
    return r >= 2 and tuple(permutation) == (*range(r - 2), r - 1, r - 2)


def _untransposed(x, flag: bool, transposed):
    """(operand, flag): the transpose's input with the flag flipped when x is one."""
    found = transposed.get(id(x))
    if found is not None and found[0] is x:
        counters.count("cpu_gemm_folded_transposes")
        return found[1], not flag
    return x, flag


def _hint(x):
    """The kernels' first operand, which they ignore: the argmax of a few hundred of
    x's elements. XLA:CPU runs a program whose cost model counts under 1000 flops inline
    on the calling thread, and a custom call counts as none; without this a program that
    is one kernel call (a strict `mm`) would block its caller instead of running
    asynchronously. About a microsecond."""
    return jnp.argmax(x.reshape(-1)[:512])


# ------------------------------------------------------------------ layer norm
def layer_norm_applies(x, normalized_shape, weight, bias=None) -> bool:
    """Whether ATen's layer norm kernels take this call: float32 with a weight (and a
    bias, for the forward) of the normalized shape, nothing empty, on the cpu platform."""
    f32 = jnp.float32
    return (x.dtype == f32 and weight is not None and weight.dtype == f32
            and tuple(weight.shape) == tuple(normalized_shape)
            and (bias is None or (bias.dtype == f32 and bias.shape == weight.shape))
            and x.size > 0 and weight.size > 0 and _has(_LAYER_NORM))


def layer_norm(x, normalized_shape, weight, bias, eps: float):
    """(y, mean, rstd) of ATen's native_layer_norm; mean and rstd keep x's rank."""
    counters.count("cpu_layer_norm_traced")
    n = math.prod(normalized_shape)
    rows = x.size // n
    stats = x.shape[:x.ndim - len(normalized_shape)] + (1,) * len(normalized_shape)
    f32 = jnp.float32
    call = jax.ffi.ffi_call(_LAYER_NORM, (jax.ShapeDtypeStruct((rows, n), f32),
                                          jax.ShapeDtypeStruct((rows,), f32),
                                          jax.ShapeDtypeStruct((rows,), f32)))
    y, mean, rstd = call(_hint(x), x.reshape(rows, n), weight.reshape(n), bias.reshape(n),
                         eps=np.float32(eps))
    return y.reshape(x.shape), mean.reshape(stats), rstd.reshape(stats)


def layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight):
    """(dx, dweight, dbias) of ATen's native_layer_norm_backward."""
    counters.count("cpu_layer_norm_traced")
    n = math.prod(normalized_shape)
    rows = x.size // n
    f32 = jnp.float32
    call = jax.ffi.ffi_call(_LAYER_NORM_BACKWARD, (jax.ShapeDtypeStruct((rows, n), f32),
                                                   jax.ShapeDtypeStruct((n,), f32),
                                                   jax.ShapeDtypeStruct((n,), f32)))
    dx, dw, db = call(_hint(x), grad.reshape(rows, n), x.reshape(rows, n), mean.reshape(rows),
                      rstd.reshape(rows), weight.reshape(n))
    return dx.reshape(x.shape), dw.reshape(weight.shape), db.reshape(weight.shape)


# ------------------------------------------------------------------ GELU
_MIN_ELEMENTS = 1 << 14  # below this XLA's fused elementwise code is as good


def gelu_applies(*arrays) -> bool:
    """Whether ATen's GELU kernels take this call: float32 arrays of one shape, large.
    Lowerings ask for exact GELU only: XLA's tanh form is 3x faster than ATen's."""
    x = arrays[0]
    return (all(a.dtype == jnp.float32 and a.shape == x.shape for a in arrays)
            and x.size >= _MIN_ELEMENTS and _has(_GELU))


def gelu(x, approximate: str):
    counters.count("cpu_gelu_traced")
    call = jax.ffi.ffi_call(_GELU, jax.ShapeDtypeStruct(x.shape, jnp.float32))
    return call(_hint(x), x, tanh=approximate == "tanh")


def gelu_backward(grad, x, approximate: str):
    counters.count("cpu_gelu_traced")
    call = jax.ffi.ffi_call(_GELU_BACKWARD, jax.ShapeDtypeStruct(x.shape, jnp.float32))
    return call(_hint(x), grad, x, tanh=approximate == "tanh")


# ------------------------------------------------------------------ attention
_ATTENTION = "torch_pjrt_cpu_attention"
_ATTENTION_BACKWARD = "torch_pjrt_cpu_attention_backward"


def attention_applies(q, k, v, bias, dropout_p: float) -> bool:
    """Whether ATen's CPU flash attention takes this call: float32 (B, H, L, E) queries,
    keys and values of one head size, with as many key heads as query heads (or a
    divisor, for grouped queries), no mask or bias tensor, no dropout, nothing empty,
    on the cpu platform: the cases native CPU eager sends to the same kernel."""
    f32 = jnp.float32
    return (bias is None and dropout_p == 0 and q.ndim == 4 and k.ndim == 4 and v.ndim == 4
            and q.dtype == f32 and k.dtype == f32 and v.dtype == f32
            and q.shape[0] == k.shape[0] == v.shape[0] and k.shape[1:3] == v.shape[1:3]
            and q.shape[-1] == k.shape[-1] == v.shape[-1]
            and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
            and q.size > 0 and k.size > 0 and v.size > 0 and _has(_ATTENTION))


def _blhe(t):
    """(B, H, L, E) -> (B, L, H, E): the kernels' memory layout. A transformer's q, k, v
    are transposes of that layout already, so XLA cancels the two transposes."""
    return jnp.swapaxes(t, 1, 2)


def attention(q, k, v, causal: bool, scale: float, keys=None):
    """(out (B, H, L, Ev), logsumexp (B, H, L)) of ATen's CPU flash attention over the first
    `keys` rows of k and v (a run-time int64 scalar; None: all of them)."""
    counters.count("cpu_attention_traced")
    b, h, length, _ = q.shape
    f32 = jnp.float32
    call = jax.ffi.ffi_call(_ATTENTION, (
        jax.ShapeDtypeStruct((b, length, h, v.shape[-1]), f32),
        jax.ShapeDtypeStruct((b, h, length), f32)))
    keys = jnp.asarray(k.shape[2] if keys is None else keys, jnp.int64).reshape(())
    out, lse = call(_hint(q), _blhe(q), _blhe(k), _blhe(v), keys, causal=causal,
                    scale=np.float64(scale))
    return _blhe(out), lse


def attention_backward(grad, q, k, v, out, lse, causal: bool, scale: float):
    """(dq, dk, dv) of ATen's CPU flash attention, each shaped as its input."""
    counters.count("cpu_attention_traced")
    f32 = jnp.float32
    call = jax.ffi.ffi_call(_ATTENTION_BACKWARD, tuple(
        jax.ShapeDtypeStruct(_blhe(t).shape, f32) for t in (q, k, v)))
    grads = call(_hint(q), _blhe(grad.astype(f32)), _blhe(q), _blhe(k), _blhe(v),
                 _blhe(out.astype(f32)), lse.astype(f32), causal=causal,
                 scale=np.float64(scale))
    return tuple(_blhe(g) for g in grads)


# ------------------------------------------------------------------ paged attention
_PAGED_ATTENTION = "torch_pjrt_cpu_paged_attention"


def paged_attention_applies(query, kv_cache, block_table) -> bool:
    """Whether the shim's paged attention takes this call: a float32 query [T, H, D] and
    cache [blocks, block_size, 2, kv_heads, D] (kv_heads dividing H), an int32 table, on
    the cpu platform."""
    return (query.ndim == 3 and kv_cache.ndim == 5 and block_table.ndim == 2
            and query.dtype == jnp.float32 and kv_cache.dtype == jnp.float32
            and kv_cache.shape[2] == 2 and kv_cache.shape[4] == query.shape[2]
            and kv_cache.shape[3] > 0 and query.shape[1] % kv_cache.shape[3] == 0
            and query.size > 0 and _has(_PAGED_ATTENTION))


def paged_attention(query, kv_cache, block_table, query_start_loc, seq_lens, scale: float,
                    max_query_len: int):
    """Causal attention of ragged requests' query rows over their pages of a paged KV
    cache, read in place (XLA can only gather the pages into a padded copy first):
    request r owns the rows query_start_loc[r]:query_start_loc[r + 1] (at most
    max_query_len), the last of its seq_lens[r] positions. Rows no request owns are
    zeros. The pure-XLA form of the same is the caller's (integrations/vllm)."""
    counters.count("cpu_paged_attention_traced")
    i32 = jnp.int32
    call = jax.ffi.ffi_call(_PAGED_ATTENTION, jax.ShapeDtypeStruct(query.shape, jnp.float32))
    return call(_hint(query), query, kv_cache, block_table.astype(i32),
                query_start_loc.astype(i32), seq_lens.astype(i32), scale=np.float64(scale),
                max_query_len=np.int64(max_query_len))

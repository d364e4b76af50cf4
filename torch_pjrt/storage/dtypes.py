"""The dtypes a pjrt tensor can have, as data: torch dtype <-> JAX dtype."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(jnp.bool_),
    torch.uint8: np.dtype(jnp.uint8),
    torch.int8: np.dtype(jnp.int8),
    torch.int16: np.dtype(jnp.int16),
    torch.int32: np.dtype(jnp.int32),
    torch.int64: np.dtype(jnp.int64),
    torch.uint16: np.dtype(jnp.uint16),
    torch.uint32: np.dtype(jnp.uint32),
    torch.uint64: np.dtype(jnp.uint64),
    torch.float16: np.dtype(jnp.float16),
    torch.bfloat16: np.dtype(jnp.bfloat16),
    torch.float32: np.dtype(jnp.float32),
    torch.float64: np.dtype(jnp.float64),
    torch.complex64: np.dtype(jnp.complex64),
    torch.complex128: np.dtype(jnp.complex128),
    torch.float8_e4m3fn: np.dtype(jnp.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(jnp.float8_e5m2),
    # the fnuz formats (no negative zero, one NaN: AMD MI300's); XLA converts to them as
    # PyTorch does, overflow to NaN included (tests/storage/test_dtypes.py)
    torch.float8_e4m3fnuz: np.dtype(jnp.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: np.dtype(jnp.float8_e5m2fnuz),
}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}
# complex32 (complex half) has no XLA type. Its storage holds float16 (real, imaginary)
# pairs, byte for byte as PyTorch lays it out (so views as float16, view_as_real and
# transfers are plain bytes), and a program computes on it in complex64, rounding each
# part to float16 where it stores a result (storage/views.py: complex32 parts), as the
# CPU's and CUDA's kernels compute ComplexHalf in complex<float>.
COMPLEX32_PARTS = np.dtype(jnp.float16)
_COMPUTED_AS = {torch.complex32: np.dtype(jnp.complex64)}
_E4M3 = np.dtype(jnp.float8_e4m3fn)


def convert(x, dtype) -> jnp.ndarray:
    """x as `dtype` (a JAX dtype) by PyTorch's rules where XLA's differ: a floating or
    complex value becomes an unsigned integer through int64 (c10's
    static_cast_with_inter_type, on CPU and CUDA alike: -1.5 is 255 in uint8, 300.2 is
    44), where XLA saturates (0 and 255); a value (floating or integer) past float8_e4m3fn's
    range becomes its largest finite value, +-448 (CPU's conversion, and CUDA's SATFINITE
    one), where XLA gives NaN; a complex value to a real dtype keeps its real part."""
    x = jnp.asarray(x)
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if jnp.issubdtype(x.dtype, jnp.complexfloating) and not jnp.issubdtype(
            dtype, jnp.complexfloating):
        x = jnp.real(x)
    if jnp.issubdtype(dtype, jnp.unsignedinteger) and jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.int64)
    elif dtype == _E4M3 and jnp.issubdtype(x.dtype, jnp.number) and x.dtype != _E4M3:
        x = jnp.clip(x, -448, 448)  # NaN stays NaN; an integer past 448 saturates too
    return x.astype(dtype)


# Dtypes a platform's PJRT plugin cannot hold (checked when a tensor is made).
UNSUPPORTED_ON: dict[str, frozenset[torch.dtype]] = {
    "tpu": frozenset({torch.float64, torch.complex128}),
    "neuron": frozenset({torch.float64, torch.complex128, torch.complex64, torch.complex32}),
}


def supported(platform: str) -> frozenset[torch.dtype]:
    """The dtypes a pjrt tensor can have on `platform`."""
    return (frozenset(TORCH_TO_JAX) | frozenset(_COMPUTED_AS)) - UNSUPPORTED_ON.get(
        platform, frozenset())


def to_jax(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype a program computes `dtype` in (complex64 for complex32)."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        if dtype in _COMPUTED_AS:
            return _COMPUTED_AS[dtype]
        supported = ", ".join(str(d).removeprefix("torch.")
                              for d in (*TORCH_TO_JAX, *_COMPUTED_AS))
        # NotImplementedError, as PyTorch's kernels raise for a dtype they lack: a
        # TypeError inside `x + y` becomes Python's "unsupported operand type(s)"
        raise NotImplementedError(
            f"pjrt: dtype {dtype} is not supported on the pjrt device (supported: {supported})"
        ) from None


def buffer(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype of the flat buffer a storage of `dtype` tensors holds: to_jax's, but
    float16 for complex32 (its parts)."""
    return COMPLEX32_PARTS if dtype is torch.complex32 else to_jax(dtype)


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


def check_platform(dtype: torch.dtype, platform: str) -> None:
    if dtype in UNSUPPORTED_ON.get(platform, ()):
        raise TypeError(f"pjrt: dtype {dtype} is not supported on the {platform} platform")

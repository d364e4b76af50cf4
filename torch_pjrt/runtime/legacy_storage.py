"""`torch.pjrt.FloatStorage` and the other legacy typed-storage classes, as torch.cuda has them."""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

# PyTorch finds a device's legacy class as `getattr(torch.<device>, name)`
# (TypedStorage._get_legacy_storage_class, which Tensor.storage_type() returns) and a class's
# device from the last part of its __module__, so the classes say they are torch.pjrt's.
MODULE = "torch.pjrt"

# The legacy names of the dtypes pjrt holds: PyTorch's map less the quantized dtypes, which
# pjrt refuses (torch.cuda has the same twelve).
_QUANTIZED = {torch.qint8, torch.qint32, torch.quint8, torch.quint4x2, torch.quint2x4}


class _PjrtLegacyStorage(_LegacyStorage):
    """A typed storage on the pjrt device; what a host-memory storage does is refused."""

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: not available for pjrt storage (it reads host memory)")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: not available for pjrt storage")

    @classmethod
    def _new_shared(cls, size):
        raise RuntimeError("_new_shared: not available for pjrt storage (shared host memory)")

    @classmethod
    def _new_shared_filename(cls, *args, **kwargs):
        raise RuntimeError("_new_shared_filename: not available for pjrt storage")


def _legacy_class(name: str, dtype: torch.dtype) -> type:
    def public_dtype(cls) -> torch.dtype:
        _warn_typed_storage_removal()
        return dtype

    def internal_dtype(cls) -> torch.dtype:
        return dtype

    return type(name, (_PjrtLegacyStorage,), {
        "__module__": MODULE, "__qualname__": name,
        "__doc__": f"Legacy typed storage of {dtype} on the pjrt device (deprecated, as "
                   "TypedStorage is: prefer tensors and torch.UntypedStorage).",
        "dtype": classproperty(public_dtype),
        "_dtype": classproperty(internal_dtype),
    })


CLASSES: dict[str, type] = {
    name: _legacy_class(name, dtype)
    for dtype, name in torch.storage._dtype_to_storage_type_map().items()
    if dtype not in _QUANTIZED
}

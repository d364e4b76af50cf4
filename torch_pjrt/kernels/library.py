"""The operators kernels are registered for: resolving what users pass, and our Libraries."""

from __future__ import annotations

import torch
from torch._library import custom_ops

OpOverload = torch._ops.OpOverload

_libraries: dict[tuple[str, str], torch.library.Library] = {}


def library(namespace: str, kind: str = "IMPL") -> torch.library.Library:
    """One Library per (namespace, kind), kept alive for the process (its registrations
    end with it)."""
    key = (namespace, kind)
    if key not in _libraries:
        _libraries[key] = torch.library.Library(namespace, kind)
    return _libraries[key]


def overload(op, caller: str) -> OpOverload:
    """The OpOverload that `op` names: a CustomOpDef (torch.library.custom_op), an
    OpOverload, an OpOverloadPacket with one overload, or "ns::name" / "ns::name.overload"
    (torch.library.define)."""
    if isinstance(op, custom_ops.CustomOpDef):
        return op._opoverload
    if isinstance(op, OpOverload):
        return op
    if isinstance(op, torch._ops.OpOverloadPacket):
        names = op.overloads()
        if len(names) != 1:
            raise ValueError(f"{caller}: {op} has overloads {names}; pass one of them "
                             f"(e.g. {op}.{names[0]})")
        return getattr(op, names[0])
    if isinstance(op, str) and "::" in op:
        ns, name = op.split("::", 1)
        name, _, over = name.partition(".")
        packet = getattr(getattr(torch.ops, ns), name, None)
        if packet is None:
            raise ValueError(f"{caller}: no operator {op!r} (define it first with "
                             "torch.library.custom_op or torch.library.define)")
        return getattr(packet, over or "default")
    raise TypeError(f"{caller}: expected an operator (a torch.library.custom_op, an "
                    f"OpOverload such as torch.ops.mylib.op.default, or 'mylib::op'), "
                    f"got {op!r}")


def custom_op_def(op: OpOverload) -> custom_ops.CustomOpDef | None:
    """The CustomOpDef behind `op` when torch.library.custom_op made it, else None."""
    return custom_ops._maybe_get_opdef(op)


def qualname(op: OpOverload) -> str:
    return op._schema.name


def name_in_namespace(op: OpOverload) -> str:
    """"name" or "name.overload", as Library.impl takes it."""
    name = op._schema.name.split("::")[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def has_fake(op: OpOverload) -> bool:
    """Whether `op` has a fake (meta) implementation of its own."""
    opdef = custom_op_def(op)
    if opdef is not None:
        return opdef._abstract_fn is not None
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname(op), "Meta")


def mutated_args(op: OpOverload) -> list[int]:
    """Indices of the arguments the op writes (Tensor(a!))."""
    return [i for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]

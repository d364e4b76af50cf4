"""Fused eager: the end of an optimizer step runs the pending graph.

A training loop that reads no value in its steps would grow one graph up to the size
cap (TORCH_PJRT_FUSED_MAX_OPS) and flush it wherever the cap falls, at another point
of the step each time: a new program, of thousands of ops, per flush. Flushing after
`optimizer.step()` makes each step one graph, compiled once and a cache hit from then
on, which is what loops that read their loss every step get anyway. The flush only
launches the program; nothing waits for it.

The hook lives outside the modules Dynamo is told to skip: a compiled step inlines it
as nothing instead of breaking its graph there.
"""

from __future__ import annotations

import torch


def _after_step(optimizer, args, kwargs) -> None:
    if torch.compiler.is_compiling():
        return
    from .eager import graph
    from .runtime import watch

    if graph.pending:
        graph.flush("optimizer step")
    watch.stepped()  # after the flush: the step's programs compile in their step


def install() -> None:
    """Register the hook for every optimizer (once)."""
    global _handle
    if _handle is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _handle = register_optimizer_step_post_hook(_after_step)


_handle = None

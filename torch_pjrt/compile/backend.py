"""`torch.compile(backend="pjrt")`: Dynamo and AOTAutograd graphs lowered to XLA.

Dynamo captures the program, AOTAutograd splits forward and backward and
decomposes to core ATen (keeping the ops torch-pjrt lowers directly, such as
softmax, layer norm and the matmul family), and each graph becomes one XLA
program through the same lowering table as eager. A graph with an op that has
no lowering runs eagerly instead (said once), or raises when
TORCH_PJRT_CPU_FALLBACK=0.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator, Mapping

import torch
import torch.utils._pytree as pytree

from .. import _env, counters
from ..lowering import registry
from ..runtime import sites
from . import graph, warm

_warned: set[str] = set()


@functools.cache
def decompositions() -> dict:
    """Core ATen decompositions, minus the ops with a direct lowering (faster in XLA)."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    lowered = set(registry.table())
    return {op: fn for op, fn in table.items() if op not in lowered}


class _LazyDecompositions(Mapping):
    """decompositions(), built when AOTAutograd first reads it: a warm start that finds
    its graphs in the cache never traces, and skips building the table (50-80 ms)."""

    def __getitem__(self, op):
        return decompositions()[op]

    def __iter__(self) -> Iterator:
        return iter(decompositions())

    def __len__(self) -> int:
        return len(decompositions())


def _compile_graph(gm: torch.fx.GraphModule, example_inputs: list,
                   user_outputs: int | None = None,
                   lines: dict | None = None) -> warm.PjrtOutputCode:
    """AOTAutograd's forward, backward and inference compiler. `lines`: the line of user
    code of each node of the graph Dynamo captured, by node name."""
    return compile_output(gm, example_inputs, _internal_outputs_from(user_outputs),
                          lines=lines)


def compile_output(gm: torch.fx.GraphModule, example_inputs: list, internal_from: int | None,
                   name: str | None = None, lines: dict | None = None
                   ) -> warm.PjrtOutputCode:
    """One graph as one XLA program (or, without a lowering for one of its ops, run op by
    op); also how a warm start rebuilds a graph from the AOTAutograd cache."""
    try:
        compiled = graph.CompiledGraph(gm, list(example_inputs), internal_from, name, lines)
    except graph.Unsupported as e:
        if str(e) != "a graph without tensor inputs":  # else nothing to offload: run it as is
            if not _env.flag("TORCH_PJRT_CPU_FALLBACK"):
                raise RuntimeError(f"pjrt: torch.compile graph uses {e}, which has no lowering "
                                   "(and TORCH_PJRT_CPU_FALLBACK=0)") from None
            counters.count("compile_eager_graphs")
            if str(e) not in _warned:
                _warned.add(str(e))
                warnings.warn(f"pjrt: a torch.compile graph uses {e}, which has no lowering; "
                              "that graph runs op by op in eager mode instead", stacklevel=3)
        return warm.PjrtOutputCode(fn=_eager(gm), gm=gm, internal_from=internal_from)
    counters.count("compiled_graphs")
    return warm.PjrtOutputCode(fn=compiled, gm=gm, internal_from=internal_from,
                               name=compiled.name)


def _internal_outputs_from(user_outputs: int | None) -> int | None:
    """Where a training forward graph's outputs stop being the user's: after the mutated
    inputs and the model's own outputs come the activations saved for the backward, which
    only our own backward graph reads, so their layout is ours to choose."""
    if user_outputs is None:
        return None
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return None
    return meta.num_mutated_inp_runtime_indices + user_outputs


def _eager(gm: torch.fx.GraphModule):
    """The graph run op by op. Its code is generated afresh: a graph a warm start loaded
    from the cache has none yet."""
    from torch._functorch.aot_autograd import make_boxed_func

    gm.recompile()
    return make_boxed_func(gm.forward)


_CPU_GRAPH = ("pjrt: torch.compile(backend=\"pjrt\") got a graph with no pjrt tensor; it runs "
              "as it is, op by op on their device (move the model and its inputs to the "
              "\"pjrt\" device to compile them for it)")


def pjrt_backend(gm: torch.fx.GraphModule, example_inputs: list):
    """The Dynamo backend registered as "pjrt"."""
    from torch._dynamo.backends.common import aot_autograd

    from .. import runtime

    runtime.ensure_initialized()
    if graph.pjrt_device(gm, example_inputs) is None:
        if _CPU_GRAPH not in _warned:
            _warned.add(_CPU_GRAPH)
            warnings.warn(_CPU_GRAPH, stacklevel=2)
        return gm.forward
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    user_outputs = len(pytree.arg_tree_leaves(*out_node.args))
    # the user's lines, for profiles and dumps (AOTAutograd's nodes name Dynamo's)
    lines = {n.name: site for n in gm.graph.nodes
             if (site := sites.from_traceback(n.meta.get("stack_trace"))) is not None}
    compile_graph = functools.partial(_compile_graph, lines=lines)
    compilers = {"fw_compiler": functools.partial(compile_graph, user_outputs=user_outputs),
                 "inference_compiler": compile_graph, "bw_compiler": compile_graph}
    cached = warm.enabled()
    if cached:  # AOTAutograd's result kept on disk for the next process (see warm.py)
        compilers = {k: warm.serializable(fn) for k, fn in compilers.items()}
    backend = aot_autograd(**compilers, decompositions=_LazyDecompositions(),
                           keep_inference_input_mutations=True)
    with warm.scope() if cached else contextlib.nullcontext():
        return backend(gm, example_inputs)

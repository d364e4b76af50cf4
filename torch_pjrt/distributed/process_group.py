"""The c10d process group of backend `pjrt`: torch.distributed's calls as XLA collectives.

PyTorch calls these methods for every collective of the group (torch.distributed's
functions, DDP's reducer, FSDP2, DTensor and the functional collectives). Collectives of
pjrt tensors run as XLA programs over the group's devices (collectives.py), each after
the ranks agreed on it (agreement.py); CPU tensors go to a gloo group of the same ranks.
Every collective completes at once from the host's point of view, as NCCL's do: its
results are device buffers that later programs wait for, so Work.wait() returns at once.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .. import _env
from ..runtime import DEVICE_TYPE
from . import agreement, buffers, collectives


def _work(result=None) -> dist.Work:
    fut = torch.futures.Future()
    fut.set_result(result if result is not None else [])
    return _create_work_from_future(fut)


def _op(reduce_op) -> tuple[str, float | None]:
    """(RedOpType name, PREMUL_SUM factor) of a ReduceOp or RedOpType."""
    if hasattr(reduce_op, "op"):  # a ReduceOp (isinstance accepts a RedOpType too)
        factor = reduce_op.factor if reduce_op.op == dist.ReduceOp.PREMUL_SUM else None
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return reduce_op.op.name, factor
    return reduce_op.name, None


def _shape(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


class ProcessGroupPjrt(dist.ProcessGroup):
    """A process group whose collectives of pjrt tensors are XLA collectives."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta,
                 global_ranks: list[int], name: str):
        super().__init__(rank, size)
        self._name = name
        # A group made again under the same name (destroy_process_group, then
        # init_process_group) may find the first one's keys in the store: its own prefix.
        incarnation = (store.add("pjrt/groups_made", 1) - 1) // size
        store = dist.PrefixStore(f"pjrt{incarnation}/", store)
        self._store = store
        self._timeout = timeout
        self._ranks = global_ranks
        self._xla = collectives.Group(global_ranks, rank)
        self._device = self._xla.index
        self._agreement = (agreement.Agreement(store, rank, global_ranks, timeout, name)
                           if _env.flag("TORCH_PJRT_DIST_CHECK") else None)
        self._gloo_group = self._make_gloo()
        self._pairs: dict[tuple[int, int], collectives.Group] = {}
        self._p2p: list[tuple] = []  # (src, dst, tensor) of sends and receives not run yet

    # ------------------------------------------------------------ identity
    def getBackendName(self) -> str:
        return "pjrt"

    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    # ------------------------------------------------------------- helpers
    def _make_gloo(self) -> dist.ProcessGroup:
        """A gloo group of the same ranks, for CPU tensors. Its backend is registered for
        both device types, so that PyTorch finds one for the pjrt device too (c10d asks
        for it when init_process_group gets a device_id); calls reach this class first."""
        store = dist.PrefixStore("gloo/", self._store)
        gloo = dist.ProcessGroupGloo(store, self.rank(), self.size(), self._timeout)
        group = dist.ProcessGroup(store, self.rank(), self.size())
        kind = dist.ProcessGroup.BackendType.GLOO
        group._register_backend(torch.device("cpu"), kind, gloo)
        group._set_default_backend(kind)
        self._register_backend(torch.device("cpu"), kind, gloo)
        self._register_backend(torch.device(DEVICE_TYPE), dist.ProcessGroup.BackendType.CUSTOM,
                               gloo)
        return group

    def _gloo(self) -> dist.ProcessGroup:
        return self._gloo_group

    def _on_cpu(self, name: str, tensors) -> bool:
        """Whether the call's tensors are CPU tensors (all of them), checking they are
        this rank's pjrt device's otherwise."""
        tensors = [t for t in tensors if t is not None]
        if tensors and all(t.device.type == "cpu" for t in tensors):
            return True
        for t in tensors:
            if t.device.type != DEVICE_TYPE or (t.device.index or 0) != self._device:
                raise RuntimeError(
                    f"pjrt: {name}: a tensor on {t.device}, but this rank's process group "
                    f"{self._name!r} runs on pjrt:{self._device} (all tensors of a "
                    "collective must be on it, or all on the CPU)")
        return False

    def _begin(self, desc: str, parts: tuple[int, ...] | None = None) -> None:
        """Before a collective: run what was pending, agree with the other ranks."""
        if self._p2p and desc.split("(")[0] not in ("send", "recv"):
            self._run_p2p()
        buffers.settle()
        if self._agreement is not None and self.size() > 1:
            self._agreement.check(desc, parts)
        self._xla.label = desc

    def _run(self, kind: str, params: tuple, tensors: list[torch.Tensor]):
        return self._xla.run(kind, params, [buffers.flat(t) for t in tensors])

    # --------------------------------------------------------- all_reduce
    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if isinstance(opts, dist.AllreduceOptions) else opts
        return self._all_reduce("all_reduce", tensors, op or dist.ReduceOp.SUM)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._all_reduce("all_reduce_coalesced", tensors, opts.reduceOp)

    def _all_reduce(self, name: str, tensors, reduce_op):
        if self._on_cpu(name, tensors):
            if name == "all_reduce":
                return self._gloo().allreduce(tensors, _options(dist.AllreduceOptions,
                                                                reduceOp=reduce_op))
            return self._gloo().allreduce_coalesced(tensors, _options(
                dist.AllreduceCoalescedOptions, reduceOp=reduce_op))
        op, factor = _op(reduce_op)
        self._begin(f"{name}({', '.join(map(_shape, tensors))}, {op})")
        for t, out in zip(tensors, self._run("all_reduce", (op, factor), tensors)):
            buffers.write(t, out)
        return _work(tensors)

    def reduce(self, tensors, opts):
        if self._on_cpu("reduce", tensors):
            return self._gloo().reduce(tensors, opts)
        op, factor = _op(opts.reduceOp)
        self._begin(f"reduce({_shape(tensors[0])}, {op}, root {opts.rootRank})")
        outs = self._run("all_reduce", (op, factor), tensors)
        if self.rank() == opts.rootRank:
            for t, out in zip(tensors, outs):
                buffers.write(t, out)
        return _work(tensors)

    # ---------------------------------------------------------- broadcast
    def broadcast(self, tensors, opts):
        if self._on_cpu("broadcast", tensors):
            return self._gloo().broadcast(tensors, opts)
        root = opts.rootRank
        self._begin(f"broadcast({', '.join(map(_shape, tensors))}, root {root})")
        outs = self._run("broadcast", (root,), tensors)
        if self.rank() != root:
            for t, out in zip(tensors, outs):
                buffers.write(t, out)
        return _work(tensors)

    # ---------------------------------------------------------- all_gather
    def allgather(self, output_lists, inputs, opts=None):
        if self._on_cpu("all_gather", [*inputs, *output_lists[0]]):
            return self._gloo().allgather(output_lists, inputs, opts or dist.AllgatherOptions())
        self._check_list("all_gather", output_lists[0], inputs[0])
        self._begin(f"all_gather({_shape(inputs[0])})")
        (out,) = self._run("all_gather", (), inputs[:1])
        self._split_into(out, output_lists[0])
        return _work(output_lists)

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        if self._on_cpu("all_gather_into_tensor", [*outputs, *inputs]):
            return self._gloo().all_gather_single_coalesced(
                outputs, inputs, opts or dist.AllgatherOptions())
        for o, i in zip(outputs, inputs):
            self._check_sizes("all_gather_into_tensor", o, i, self.size())
        self._begin(f"all_gather_into_tensor({', '.join(map(_shape, inputs))})")
        for o, value in zip(outputs, self._run("all_gather", (), inputs)):
            buffers.write(o, value)
        return _work(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        if self._on_cpu("all_gather_coalesced", inputs):
            return self._gloo().allgather_coalesced(output_lists, inputs,
                                                    opts or dist.AllgatherOptions())
        for outs, i in zip(output_lists, inputs):
            self._check_list("all_gather_coalesced", outs, i)
        self._begin(f"all_gather_coalesced({', '.join(map(_shape, inputs))})")
        for outs, value in zip(output_lists, self._run("all_gather", (), inputs)):
            self._split_into(value, outs)
        return _work(output_lists)

    def gather(self, output_lists, inputs, opts):
        if self._on_cpu("gather", inputs):
            return self._gloo().gather(output_lists, inputs, opts)
        root = opts.rootRank
        if self.rank() == root:
            self._check_list("gather", output_lists[0], inputs[0])
        self._begin(f"gather({_shape(inputs[0])}, root {root})")
        (out,) = self._run("all_gather", (), inputs[:1])
        if self.rank() == root:
            self._split_into(out, output_lists[0])
        return _work(output_lists)

    # ------------------------------------------------------- reduce_scatter
    def reduce_scatter(self, outputs, input_lists, opts):
        if self._on_cpu("reduce_scatter", [*outputs, *input_lists[0]]):
            return self._gloo().reduce_scatter(outputs, input_lists, opts)
        self._check_list("reduce_scatter", input_lists[0], outputs[0])
        flat_in = torch.cat([t.reshape(-1) for t in input_lists[0]])
        return self._reduce_scatter("reduce_scatter", outputs, [flat_in], opts)

    def reduce_scatter_single(self, output, input, opts):
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        if self._on_cpu("reduce_scatter_tensor", [*outputs, *inputs]):
            return self._gloo().reduce_scatter_single_coalesced(outputs, inputs, opts)
        for o, i in zip(outputs, inputs):
            self._check_sizes("reduce_scatter_tensor", i, o, self.size())
        return self._reduce_scatter("reduce_scatter_tensor", outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter(self, name: str, outputs, inputs, opts):
        op, factor = _op(opts.reduceOp)
        self._begin(f"{name}({', '.join(map(_shape, inputs))}, {op})")
        for o, value in zip(outputs, self._run("reduce_scatter", (op, factor), inputs)):
            buffers.write(o, value)
        return _work(outputs)

    # --------------------------------------------------------- all_to_all
    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        if self._on_cpu("all_to_all_single", [output, input]):
            return self._gloo().all_to_all_single(output, input, output_splits, input_splits,
                                                  opts or dist.AllToAllOptions())
        n = self.size()
        row_in = input[0].numel() if input.dim() and input.shape[0] else 0
        row_out = output[0].numel() if output.dim() and output.shape[0] else 0
        even = not input_splits and not output_splits
        in_splits = list(input_splits) or _even(input, n, "input")
        out_splits = list(output_splits) or _even(output, n, "output")
        if sum(in_splits) != (input.shape[0] if input.dim() else 1) or \
                sum(out_splits) != (output.shape[0] if output.dim() else 1):
            raise ValueError(f"pjrt: all_to_all_single: split sizes {in_splits} / "
                             f"{out_splits} do not add up to the first dimensions of the "
                             f"input {_shape(input)} / output {_shape(output)}")
        rows = f"{str(input.dtype).removeprefix('torch.')}{list(input.shape[1:])}"
        self._begin(f"all_to_all_single(rows {rows}, {'even' if even else 'split'})")
        received = self._exchange(input.reshape(-1), [s * row_in for s in in_splits],
                                  [s * row_out for s in out_splits], even)
        output.copy_(torch.cat(received).reshape(output.shape))
        return _work([output])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):
        if self._on_cpu("all_to_all", [*outputs, *inputs]):
            return self._gloo().alltoall(outputs, inputs, opts or dist.AllToAllOptions())
        self._begin(f"all_to_all({str(inputs[0].dtype).removeprefix('torch.')})")
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        received = self._exchange(flat_in, [t.numel() for t in inputs],
                                  [t.numel() for t in outputs], False)
        for o, r in zip(outputs, received):
            o.copy_(r.reshape(o.shape))
        return _work(outputs)

    def _exchange(self, flat_in: torch.Tensor, chunks_in: list[int], chunks_out: list[int],
                  even: bool) -> list[torch.Tensor]:
        """All-to-all of chunks of any sizes (chunk i of `flat_in` to rank i): each padded
        to the largest chunk any rank sends (a first all-gather of the sizes, unless they
        are even), exchanged, unpadded. The chunks received, in rank order."""
        width = chunks_in[0] if chunks_in else 0
        if not even:
            sizes = torch.tensor(chunks_in, dtype=torch.int64, device=f"pjrt:{self._device}")
            (everyone,) = self._run("all_gather", (), [sizes])
            width = int(everyone.max()) if everyone.shape[0] else 0
            pieces, start = [], 0
            for c in chunks_in:
                piece = flat_in[start:start + c]
                pieces.append(torch.cat([piece, piece.new_zeros(width - c)]))
                start += c
            flat_in = torch.cat(pieces)
        (got,) = self._run("all_to_all", (), [flat_in])
        got = buffers.wrap(got, (self.size(), width), flat_in.dtype, self._device)
        return [got[i, :c] for i, c in enumerate(chunks_out)]

    # ------------------------------------------------------------- scatter
    def scatter(self, outputs, input_lists, opts):
        if self._on_cpu("scatter", [*outputs, *(input_lists[0] if input_lists else [])]):
            return self._gloo().scatter(outputs, input_lists, opts)
        root, out = opts.rootRank, outputs[0]
        self._begin(f"scatter({_shape(out)}, root {root})")
        if self.rank() == root:
            self._check_list("scatter", input_lists[0], out)
            source = torch.cat([t.reshape(-1) for t in input_lists[0]])
        else:
            source = out.new_zeros(out.numel() * self.size())
        (value,) = self._xla.run("scatter", (root,), [buffers.flat(source)])
        buffers.write(out, value)
        return _work(outputs)

    # ------------------------------------------------------------- barrier
    def barrier(self, opts=None):
        self._begin("barrier()")
        token = torch.zeros(1, dtype=torch.int32, device=f"pjrt:{self._device}")
        (out,) = self._run("all_reduce", ("SUM", None), [token])
        out.block_until_ready()
        return _work()

    # ---------------------------------------------------------------- p2p
    def send(self, tensors, dst: int, tag: int = 0):
        return self._point_to_point("send", tensors, self.rank(), dst, tag)

    def recv(self, tensors, src: int, tag: int = 0):
        return self._point_to_point("recv", tensors, src, self.rank(), tag)

    def recv_anysource(self, tensors, tag: int = 0):
        raise RuntimeError("pjrt: recv from any source is not supported (XLA collectives "
                           "name both ends): pass src")

    def _point_to_point(self, name: str, tensors, src: int, dst: int, tag: int):
        if self._on_cpu(name, tensors):
            gloo = self._gloo()
            return (gloo.send(tensors, dst, tag) if name == "send"
                    else gloo.recv(tensors, src, tag))
        self._p2p.append((src, dst, tensors[0], tag))
        return _PendingP2P(self, tensors)

    def _run_p2p(self) -> None:
        """Run the sends and receives called so far: per pair of ranks, the transfers from
        the lower rank first, each in call order (both ends order them alike)."""
        ops, self._p2p = self._p2p, []
        ops.sort(key=lambda o: (min(o[0], o[1]), max(o[0], o[1]), o[0] > o[1]))
        for src, dst, t, tag in ops:
            pair = (min(src, dst), max(src, dst))
            group = self._pairs.get(pair)
            if group is None:
                group = self._pairs[pair] = collectives.Group(
                    [self._ranks[pair[0]], self._ranks[pair[1]]], 0 if self.rank() == pair[0]
                    else 1)
            self._begin(f"send({_shape(t)}, {src} -> {dst}, tag {tag})", pair)
            group.label = self._xla.label
            local = (0, 1) if src < dst else (1, 0)
            (value,) = group.run("send", ((local,),), [buffers.flat(t)])
            if dst == self.rank():
                buffers.write(t, value)

    # ------------------------------------------------------------ checks
    def _check_list(self, name: str, tensors, like: torch.Tensor) -> None:
        if len(tensors) != self.size():
            raise ValueError(f"pjrt: {name}: expected a list of {self.size()} tensors (one "
                             f"per rank), got {len(tensors)}")
        for t in tensors:
            if t.numel() != like.numel() or t.dtype != like.dtype:
                raise ValueError(f"pjrt: {name}: every tensor of the list must have the "
                                 f"input's size and dtype ({_shape(like)}), got {_shape(t)}")

    def _check_sizes(self, name: str, big: torch.Tensor, small: torch.Tensor, n: int) -> None:
        if big.numel() != small.numel() * n or big.dtype != small.dtype:
            raise ValueError(f"pjrt: {name}: the large tensor must have {n} (the group size) "
                             f"times the elements of the small one, and its dtype: got "
                             f"{_shape(big)} and {_shape(small)}")

    def _split_into(self, value, outputs) -> None:
        n = self.size()
        whole = buffers.wrap(value, (n, value.shape[0] // n), outputs[0].dtype, self._device)
        for i, o in enumerate(outputs):
            o.copy_(whole[i].reshape(o.shape))


class _PendingP2P(dist.Work):
    """A send or receive: run (with the others called so far) when waited for, or at the
    group's next collective."""

    def __init__(self, group: ProcessGroupPjrt, tensors):
        super().__init__()
        self._group = group
        self._tensors = tensors

    def wait(self, timeout=None) -> bool:
        if self._group._p2p:
            self._group._run_p2p()
        return True

    def is_completed(self) -> bool:
        return not self._group._p2p

    def get_future(self):
        self.wait()
        fut = torch.futures.Future()
        fut.set_result(self._tensors)
        return fut


def _even(t: torch.Tensor, n: int, which: str) -> list[int]:
    rows = t.shape[0] if t.dim() else 1
    if rows % n:
        raise ValueError(f"pjrt: all_to_all_single: the {which} tensor's first dimension "
                         f"({rows}) must divide by the group size ({n}) without split sizes")
    return [rows // n] * n


def _options(cls, **values):
    opts = cls()
    for k, v in values.items():
        setattr(opts, k, v)
    return opts

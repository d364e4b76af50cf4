"""Rank code of test_collectives.py: every collective on pjrt tensors against gloo on the
same values as CPU tensors (the same process group: "cpu:gloo,pjrt:pjrt"), in each eager
mode. Each check's outcome is "ok" or what differed."""

from __future__ import annotations

import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import torch_pjrt

MODES = ("strict", "fused", "debug")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
          torch.int32, torch.uint8)
R = dist.ReduceOp


def _values(shape, dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Rank-dependent values every dtype holds exactly (small integers, halves)."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype.is_floating_point:
        return (torch.randint(-8, 9, shape, generator=g) / 2).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    lo = 0 if dtype == torch.uint8 else -6
    return torch.randint(lo, 7, shape, generator=g).to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor) -> str | None:
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if not torch.equal(got, want):
        return f"got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}"
    return None


def _dev(t: torch.Tensor) -> torch.Tensor:
    return t.to("pjrt")


# -------------------------------------------------------------------- checks
# Each check runs one collective on pjrt tensors and on CPU tensors (gloo) and returns
# what differed, or None. `rank`, `n`: this rank and the group size.
def all_reduce(dtype, op):
    def check(rank, n):
        x = _values((3, 5), dtype, rank)
        d, c = _dev(x), x.clone()
        dist.all_reduce(d, op=op)
        if op in (R.AVG,):  # gloo has no AVG: the sum over the group size
            c = _sum_of_all(x, n) / n if dtype.is_floating_point else None
        elif getattr(op, "op", None) == R.PREMUL_SUM:
            c = _sum_of_all((x * 0.5).to(dtype), n)
        else:
            dist.all_reduce(c, op=op)
        return _same(d, c.to(dtype))
    return check


def _sum_of_all(x, n):
    total = x.clone()
    dist.all_reduce(total)  # gloo
    return total


def all_reduce_view():
    """A non-contiguous view and a slice at an offset: the base gets the result."""
    def check(rank, n):
        base = _values((4, 6), torch.float32, rank)
        d = _dev(base)
        col, c_col = d[:, 1], base[:, 1].clone()
        dist.all_reduce(col)
        dist.all_reduce(c_col)
        want = base.clone()
        want[:, 1] = c_col
        row = d[2, 1:4]
        c_row = want[2, 1:4].clone()
        dist.all_reduce(row, op=R.MAX)
        dist.all_reduce(c_row, op=R.MAX)
        want[2, 1:4] = c_row
        return _same(d, want)
    return check


def broadcast(dtype, src):
    def check(rank, n):
        x = _values((7,), dtype, rank)
        d, c = _dev(x), x.clone()
        dist.broadcast(d, src)
        dist.broadcast(c, src)
        return _same(d, c)
    return check


def all_gather(dtype):
    def check(rank, n):
        x = _values((2, 3), dtype, rank)
        outs = [torch.empty(2, 3, dtype=dtype, device="pjrt") for _ in range(n)]
        couts = [torch.empty(2, 3, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, _dev(x))
        dist.all_gather(couts, x)
        return _first(_same(o, c) for o, c in zip(outs, couts))
    return check


def all_gather_into_tensor(dtype):
    def check(rank, n):
        x = _values((2, 3), dtype, rank)
        out, cout = torch.empty(2 * n, 3, dtype=dtype, device="pjrt"), \
            torch.empty(2 * n, 3, dtype=dtype)
        dist.all_gather_into_tensor(out, _dev(x))
        dist.all_gather_into_tensor(cout, x)
        return _same(out, cout)
    return check


def reduce_scatter_tensor(dtype, op):
    def check(rank, n):
        x = _values((2 * n, 3), dtype, rank)
        out, cout = torch.empty(2, 3, dtype=dtype, device="pjrt"), torch.empty(2, 3,
                                                                               dtype=dtype)
        dist.reduce_scatter_tensor(out, _dev(x), op=op)
        if op == R.AVG:
            dist.reduce_scatter_tensor(cout, x)
            cout = cout / n
        else:
            dist.reduce_scatter_tensor(cout, x, op=op)
        return _same(out, cout.to(dtype))
    return check


def reduce_scatter_list(dtype):
    def check(rank, n):
        xs = [_values((4,), dtype, rank, i) for i in range(n)]
        out, cout = torch.empty(4, dtype=dtype, device="pjrt"), torch.empty(4, dtype=dtype)
        dist.reduce_scatter(out, [_dev(x) for x in xs])
        dist.reduce_scatter(cout, xs)
        return _same(out, cout)
    return check


def all_to_all_single(dtype, uneven):
    def check(rank, n):
        if uneven:  # rank r sends r + i + 1 rows to rank i
            ins = [r + i + 1 for r in [rank] for i in range(n)]
            outs = [i + rank + 1 for i in range(n)]
        else:
            ins = outs = None
        rows = sum(ins) if ins else 2 * n
        x = _values((rows, 3), dtype, rank)
        out_rows = sum(outs) if outs else 2 * n
        out = torch.empty(out_rows, 3, dtype=dtype, device="pjrt")
        cout = torch.empty(out_rows, 3, dtype=dtype)
        dist.all_to_all_single(out, _dev(x), outs, ins)
        dist.all_to_all_single(cout, x, outs, ins)
        return _same(out, cout)
    return check


def all_to_all_list(dtype):
    def check(rank, n):
        xs = [_values((3, 2), dtype, rank, i) for i in range(n)]  # gloo: one size
        outs = [torch.empty(3, 2, dtype=dtype, device="pjrt") for _ in range(n)]
        couts = [torch.empty(3, 2, dtype=dtype) for _ in range(n)]
        dist.all_to_all(outs, [_dev(x) for x in xs])
        dist.all_to_all(couts, xs)
        return _first(_same(o, c) for o, c in zip(outs, couts))
    return check


def reduce(dtype, dst):
    def check(rank, n):
        x = _values((5,), dtype, rank)
        d, c = _dev(x), x.clone()
        dist.reduce(d, dst)
        dist.reduce(c, dst)
        return _same(d, c) if rank == dst else _same(d, x)
    return check


def gather(dtype, dst):
    def check(rank, n):
        x = _values((3,), dtype, rank)
        outs = [torch.empty(3, dtype=dtype, device="pjrt") for _ in range(n)] \
            if rank == dst else None
        couts = [torch.empty(3, dtype=dtype) for _ in range(n)] if rank == dst else None
        dist.gather(_dev(x), outs, dst)
        dist.gather(x, couts, dst)
        return _first(_same(o, c) for o, c in zip(outs, couts)) if rank == dst else None
    return check


def scatter(dtype, src):
    def check(rank, n):
        xs = [_values((2, 2), dtype, rank, i) for i in range(n)]
        out, cout = torch.empty(2, 2, dtype=dtype, device="pjrt"), torch.empty(2, 2,
                                                                               dtype=dtype)
        dist.scatter(out, [_dev(x) for x in xs] if rank == src else None, src)
        dist.scatter(cout, xs if rank == src else None, src)
        return _same(out, cout)
    return check


def barrier():
    def check(rank, n):
        dist.barrier()
        dist.barrier()
        return None
    return check


def send_recv(dtype):
    def check(rank, n):
        x = _values((4,), dtype, 0)
        if rank == 0:
            dist.send(_dev(x), 1)
            return None
        if rank == 1:
            got = torch.empty(4, dtype=dtype, device="pjrt")
            dist.recv(got, 0)
            return _same(got, x)
        return None
    return check


def batch_isend_irecv():
    """A ring: each rank sends to the next and receives from the previous one."""
    def check(rank, n):
        x = _values((6,), torch.float32, rank)
        got = torch.empty(6, device="pjrt")
        ops = [dist.P2POp(dist.isend, _dev(x), (rank + 1) % n),
               dist.P2POp(dist.irecv, got, (rank - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return _same(got, _values((6,), torch.float32, (rank - 1) % n))
    return check


def async_ops():
    def check(rank, n):
        x = _values((8,), torch.float32, rank)
        d, c = _dev(x), x.clone()
        work = dist.all_reduce(d, async_op=True)
        work.wait()
        dist.all_reduce(c)
        return _same(d, c)
    return check


def queued():
    """Collectives queue behind device work and behind each other: the host returns from two
    all_reduces of the results of slow device work long before that work is done (it waited
    for the first collective before launching the second until December 3)."""
    def check(rank, n):
        if torch_pjrt.get_eager_mode() == "debug":
            return None  # debug mode waits for every op
        g = torch.Generator().manual_seed(7)
        w = (torch.randn(768, 768, generator=g) / 28).to("pjrt")

        def slow():
            x = w
            for _ in range(16):
                x = torch.tanh(x @ w)
            return x

        def collectives():
            dist.barrier()  # both ranks start together: the check waits for no late rank
            y, z = slow(), torch.ones(4, device="pjrt")
            start = time.perf_counter()
            dist.all_reduce(y)
            dist.all_reduce(z)
            return time.perf_counter() - start, y, z

        for _ in range(2):  # compile (fused mode: the graphs of the steady state)
            collectives()
            torch.pjrt.synchronize()
        start = time.perf_counter()
        y = slow()
        torch.pjrt.synchronize()
        compute = time.perf_counter() - start
        calls, y, z = collectives()
        torch.pjrt.synchronize()
        if calls > 0.5 * compute:
            return (f"the two all_reduce calls took {calls * 1e3:.1f} ms, the device work "
                    f"before them {compute * 1e3:.1f} ms: the host waited for it")
        want = slow().cpu() * n
        return _same(z, torch.full((4,), float(n))) or (
            None if torch.allclose(y.cpu(), want, atol=1e-5) else "wrong all_reduce sum")
    return check


def profiled():
    """torch.profiler shows each collective on the device's collectives track, named by its
    call, next to the programs."""
    def check(rank, n):
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        d = _dev(_values((64,), torch.float32, rank))
        w = _dev(_values((384, 384), torch.float32, rank)) / 400

        def work():  # device work the all_reduce waits for
            x = w
            for _ in range(8):
                x = torch.tanh(x @ w)
            return x.sum(0)[:64] + d

        dist.all_reduce(work())  # compile
        torch.pjrt.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
            dist.all_reduce(work())
            dist.broadcast(d, 1)
            torch.pjrt.synchronize()
        events = [e for e in p.events() if e.device_type == DeviceType.PrivateUse1]
        collectives = [e for e in events if e.name.startswith("pjrt collective: ")]
        # in call order; ties of start (an all_reduce whose bar is ended at once) by name
        collectives.sort(key=lambda e: (e.time_range.start, e.name))
        names = [e.name for e in collectives]
        want = ["pjrt collective: all_reduce(float32[64], SUM)",
                "pjrt collective: broadcast(float32[64], root 1)"]
        if names != want:
            return f"collectives in the profile: {names}"
        if collectives[1].time_range.start < collectives[0].time_range.end - 1:
            return "the broadcast starts before the all_reduce called before it ends"
        # the all_reduce's bar starts once the program computing its input has ended
        start = collectives[0].time_range.start
        before = [e for e in events if e not in collectives
                  and e.time_range.start < start and "device to host" not in e.name
                  and "host to device" not in e.name]
        last = max(before, key=lambda e: e.time_range.end, default=None)
        if last is not None and start < last.time_range.end - 1:
            return (f"the all_reduce starts at {start:.0f} us, before the program that "
                    f"computes its input ends ({last.time_range.end:.0f} us): "
                    f"{last.name!r} from {last.time_range.start:.0f} us; all: "
                    + "; ".join(f"{e.name[:50]!r} {e.time_range.start:.0f}-"
                                f"{e.time_range.end:.0f}" for e in events))
        return None
    return check


def functional(kind):
    def check(rank, n):
        x = _values((2 * n, 3), torch.float32, rank)
        d = _dev(x)
        group = dist.group.WORLD
        if kind == "all_reduce":
            got, want = funcol.all_reduce(d, "sum", group), x.clone()
            dist.all_reduce(want)
        elif kind == "all_gather":
            got = funcol.all_gather_tensor(d, 0, group)
            want = torch.empty(2 * n * n, 3)
            dist.all_gather_into_tensor(want, x)
        elif kind == "reduce_scatter":
            got = funcol.reduce_scatter_tensor(d, "sum", 0, group)
            want = torch.empty(2, 3)
            dist.reduce_scatter_tensor(want, x)
        elif kind == "all_to_all":
            got = funcol.all_to_all_single(d, None, None, group)
            want = torch.empty_like(x)
            dist.all_to_all_single(want, x)
        else:  # broadcast
            got = funcol.broadcast(d, 1, group)
            want = x.clone()
            dist.broadcast(want, 1)
        return _same(funcol.wait_tensor(got) if isinstance(got, torch.Tensor) else got, want)
    return check


def _first(items):
    for item in items:
        if item is not None:
            return item
    return None


def checks() -> dict:
    out = {}
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        ops = [R.SUM, R.MAX, R.MIN, R.PRODUCT]
        if dtype.is_floating_point:
            ops += [R.AVG, dist._make_nccl_premul_sum(0.5)]
        else:
            ops += [R.BAND, R.BOR, R.BXOR]
        for op in ops:
            label = op.op.name if hasattr(op, "op") else op.name
            out[f"all_reduce[{name},{label}]"] = all_reduce(dtype, op)
        out[f"broadcast[{name},src0]"] = broadcast(dtype, 0)
        out[f"broadcast[{name},src1]"] = broadcast(dtype, 1)
        out[f"all_gather[{name}]"] = all_gather(dtype)
        out[f"all_gather_into_tensor[{name}]"] = all_gather_into_tensor(dtype)
        for op in (R.SUM, R.MAX) + ((R.AVG,) if dtype.is_floating_point else ()):
            out[f"reduce_scatter_tensor[{name},{op.name}]"] = reduce_scatter_tensor(dtype, op)
        out[f"reduce_scatter[{name}]"] = reduce_scatter_list(dtype)
        out[f"all_to_all_single[{name},even]"] = all_to_all_single(dtype, False)
        out[f"all_to_all_single[{name},uneven]"] = all_to_all_single(dtype, True)
        out[f"all_to_all[{name}]"] = all_to_all_list(dtype)
        out[f"reduce[{name},dst1]"] = reduce(dtype, 1)
        out[f"gather[{name},dst0]"] = gather(dtype, 0)
        out[f"scatter[{name},src1]"] = scatter(dtype, 1)
        out[f"send_recv[{name}]"] = send_recv(dtype)
    out["all_reduce[view]"] = all_reduce_view()
    out["barrier"] = barrier()
    out["batch_isend_irecv"] = batch_isend_irecv()
    out["async_op"] = async_ops()
    out["queued"] = queued()
    out["profiled"] = profiled()
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        out[f"functional[{kind}]"] = functional(kind)
    return out


NAMES = [f"{mode}:{name}" for mode in MODES for name in checks()]


def run_all() -> dict:
    """Every check in every mode; after a check raises the ranks may be out of step, so
    the rest are not run (they report that)."""
    dist.init_process_group("cpu:gloo,pjrt:pjrt", timeout=timedelta(seconds=30))
    rank, n = dist.get_rank(), dist.get_world_size()
    results = dict.fromkeys(NAMES, "not run: an earlier check raised")
    try:
        for mode in MODES:
            with torch_pjrt.set_eager_mode(mode):
                for name, check in checks().items():
                    results[f"{mode}:{name}"] = check(rank, n) or "ok"
    except Exception:  # noqa: BLE001 - reported as that check's outcome
        results[f"{mode}:{name}"] = traceback.format_exc(limit=-6)
        return results
    dist.destroy_process_group()
    return results

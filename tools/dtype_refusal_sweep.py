"""Sweep: calls PyTorch refuses for their dtype on the CPU and on CUDA, run on pjrt.

PyTorch's OpInfos state, for each op, the dtypes its CPU and CUDA kernels take, and its
own test suite checks that every other dtype raises. For each OpInfo and each dtype that
neither the CPU nor CUDA takes, the first samples run on the CPU (which must raise) and
on pjrt: a call pjrt computes is a silent success where PyTorch raises. A dtype CUDA takes
and the CPU does not is left out on purpose: pjrt, a device like CUDA, may compute it.

    python tools/dtype_refusal_sweep.py [--mode strict|fused] [--samples N] [ops...]

prints each call pjrt computes with the CPU's error; tests/eager/test_dtype_refusals.py
checks that none is left outside its known list.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from torch_pjrt.eager.refusals import ANY, REFUSAL, SHARED_CHECK, base_name

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32,
          torch.complex64, torch.complex128]

def refused_dtypes(opinfo) -> list[torch.dtype]:
    """The dtypes of DTYPES that neither the op's CPU nor its CUDA kernels take."""
    taken = set(opinfo.supported_dtypes("cpu")) | set(opinfo.supported_dtypes("cuda"))
    return [d for d in DTYPES if d not in taken]


def silent_successes(opinfo, dtype: torch.dtype, samples: int = 2,
                     time_limit: float = 60.0) -> list[tuple[str, str]]:
    """(sample, the CPU's error) of each of the first `samples` samples of `opinfo` in
    `dtype` that the CPU refuses and pjrt computes."""
    from torch_pjrt import conformance as c

    found = []
    try:
        with c.quiet(), c.time_limit_of(time_limit):
            for sample in list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))[:samples]:
                try:
                    c._call(opinfo, sample)
                    continue  # the CPU computes it: the OpInfo's list is out of date
                except Exception as e:  # noqa: BLE001
                    cpu_error = c.first_line(e)
                try:
                    c.sync_result(c._call_on_pjrt(opinfo, c.to_pjrt(sample)))
                except Exception:  # noqa: BLE001 - pjrt refuses too: as it should
                    continue
                found.append((sample.summary() if hasattr(sample, "summary") else
                              repr(sample)[:120], cpu_error))
    except Exception:  # noqa: BLE001 - no samples in this dtype, or the time limit
        pass
    return found


def sweep(opinfos, samples: int = 2) -> list[tuple[str, torch.dtype, str, str]]:
    """(op name, dtype, sample, the CPU's error) of every silent success."""
    from torch_pjrt import conformance as c

    out = []
    for opinfo in opinfos:
        for dtype in refused_dtypes(opinfo):
            for sample, error in silent_successes(opinfo, dtype, samples):
                out.append((c.op_name(opinfo), dtype, sample, error))
        c.release_compiled()
    return out


def cpu_refusals(opinfos, samples: int = 2) -> dict[str, set[str]]:
    """The aten ops whose CPU kernels refuse a dtype that the OpInfo says CUDA takes:
    {base name: {dtype name in the CPU's message, or ANY for another NotImplementedError}}.
    pjrt computes those: eager/refusals.py's CUDA_TAKES is this."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch_pjrt import conformance as c

    found: dict[str, set[str]] = {}

    class Refusals(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            try:
                return func(*args, **(kwargs or {}))
            except NotImplementedError as e:
                m = REFUSAL.search(str(e))
                if m or SHARED_CHECK.search(str(e)):
                    found.setdefault(base_name(func), set()).add(m.group(2) if m else ANY)
                raise

    for opinfo in opinfos:
        cpu = set(opinfo.supported_dtypes("cpu"))
        for dtype in set(opinfo.supported_dtypes("cuda")) - cpu:
            if dtype not in DTYPES:
                continue
            try:
                with c.quiet(), c.time_limit_of(60.0):
                    for sample in list(opinfo.sample_inputs("cpu", dtype))[:samples]:
                        try:
                            with Refusals():
                                c._call(opinfo, sample)
                        except Exception:  # noqa: BLE001
                            pass
            except Exception:  # noqa: BLE001 - no samples in this dtype, or the time limit
                pass
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ops", nargs="*", help="OpInfo names (default: all of op_db)")
    p.add_argument("--mode", default="strict", choices=["strict", "fused"])
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--cpu-only-holes", action="store_true",
                   help="list the aten ops whose CPU kernels refuse a dtype CUDA takes")
    args = p.parse_args()
    if args.cpu_only_holes:
        from torch_pjrt import conformance as c

        for op, names in sorted(cpu_refusals(c.select_ops(args.ops or None)).items()):
            print(f"{op}\t{' '.join(sorted(names))}")
        return 0
    import torch_pjrt
    from torch_pjrt import conformance as c

    start = time.perf_counter()
    with torch_pjrt.set_eager_mode(args.mode):
        found = sweep(c.select_ops(args.ops or None), args.samples)
    for name, dtype, sample, error in found:
        print(f"{name}\t{str(dtype)[6:]}\t{error}\t{sample}")
    ops = sorted({(n, str(d)[6:]) for n, d, *_ in found})
    print(f"{len(found)} calls computed on pjrt that the CPU and CUDA refuse, {len(ops)} "
          f"(op, dtype) pairs, {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

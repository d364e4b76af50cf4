"""A warm process takes an op signature's layout from the record an earlier process wrote
(eager/meta_record.py, runtime/warm_start.py) instead of running PyTorch's meta kernel:
the results must be the CPU's either way, with every kind of value a record holds (fresh
outputs, tuples, outputs that are a written argument, out= tensors resized, undefined
gradients, computation dtypes)."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from torch_pjrt.eager import meta_record, opspec
from torch_pjrt.eager.meta import run_meta
from torch_pjrt.lowering import apply
from torch_pjrt.runtime import warm_start
from torch_pjrt.runtime.cache_files import CacheWarning

# Each line computes `out` from tensors on DEV; every kind of record is among them.
_CASES = textwrap.dedent("""
    x = torch.arange(12.0, device=DEV).reshape(3, 4); i = torch.arange(12, device=DEV)
    h = torch.arange(6, dtype=torch.float16, device=DEV) * 0.3
    out = {}
    out["promote"] = (i.reshape(3, 4) + 2.5) * x
    out["int_div"] = i / 3
    out["compare"] = (x > 4).to(torch.int64)
    c = torch.empty(1, device=DEV); torch.add(x, 1, out=c); out["resized"] = c
    f = torch.empty(6, device=DEV); torch.add(h, h, out=f); out["half_out"] = f
    y = x.clone(); y.mul_(3).add_(1); out["in_place"] = y
    v, k = torch.max(x, dim=1); out["max_v"], out["max_k"] = v, k
    s, j = torch.sort(-x, dim=1); out["sort_v"], out["sort_k"] = s, j
    out["cpu_scalar"] = x * torch.tensor(2.0)
    out["gather"] = torch.gather(x, 1, torch.tensor([[0, 3], [1, 1], [2, 0]], device=DEV))
    w = torch.ones(4, device=DEV, requires_grad=True)
    b = torch.zeros(4, device=DEV, requires_grad=True)
    z = torch.nn.functional.batch_norm(x.reshape(3, 4, 1), None, None, w, b, True)
    z.sum().backward(); out["bn_grad_w"] = w.grad; out["bn_out"] = z.detach()
    out["sum_dtype"] = i.sum(dtype=torch.float64)
""")

_SCRIPT = textwrap.dedent("""
    import json, sys, torch, torch_pjrt
    torch_pjrt.set_eager_mode(sys.argv[1])
    DEV = "pjrt"
    exec(sys.argv[2])
    m = torch_pjrt.metrics()
    print("RESULT " + json.dumps({"out": {k: v.cpu().double().tolist() for k, v in out.items()},
                                  "used": m.get("meta_records_used", 0)}))
""")


def _in_a_new_process(script: str, cache, *args: str) -> str:
    """`script`'s standard output, run with `args` in a new process on the cache `cache`."""
    env = dict(os.environ, TORCH_PJRT_CACHE_DIR=str(cache))
    done = subprocess.run([sys.executable, "-c", script, *args], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _run(mode: str, cache: str) -> dict:
    stdout = _in_a_new_process(_SCRIPT, cache, mode, _CASES)
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_warm_process_computes_from_the_records_what_the_cpu_computes(tmp_path, mode):
    scope = {"torch": torch, "DEV": "cpu"}
    exec(_CASES, scope)
    expected = {k: v.double().tolist() for k, v in scope["out"].items()}
    cold = _run(mode, str(tmp_path))
    warm = _run(mode, str(tmp_path))
    assert cold["used"] == 0
    assert warm["used"] > 20  # every signature of the cases, from the records
    for name, value in expected.items():
        for got in (cold, warm):
            assert torch.allclose(torch.tensor(got["out"][name], dtype=torch.float64),
                                  torch.tensor(value, dtype=torch.float64), rtol=1e-3), name


def _roundtrip(op, values):
    spec = opspec.spec(op)
    metas, out = run_meta(spec, values)
    first = [t for t in (out if isinstance(out, (tuple, list)) else [out])
             if isinstance(t, torch.Tensor)]
    compute = apply.promotion(spec, metas, first[0].dtype if first else None)
    text = meta_record.encode(spec, metas, out, compute, [])
    assert text is not None and b"\n" not in text
    return spec, metas, out, compute, meta_record.decode(spec, values, [], text)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.shape == b.shape and a.stride() == b.stride()
                and a.dtype == b.dtype and a.storage_offset() == b.storage_offset())
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_a_record_gives_back_the_layouts_aliases_and_dtypes():
    x = torch.zeros(3, 4, device="pjrt")
    # a tuple of fresh outputs, transposed strides
    spec, metas, out, compute, (metas2, out2, compute2) = _roundtrip(
        torch.ops.aten.sort.default, [x.t(), 0, False])
    assert _same(out, out2) and compute == compute2
    # an in-place op: its result is its first argument, the same object after decoding
    spec, metas, out, compute, (metas2, out2, compute2) = _roundtrip(
        torch.ops.aten.add_.Tensor, [x, torch.ones(4, device="pjrt"), 1])
    assert out2 is metas2[0] and _same(out, out2) and compute == compute2
    # out= resized: the written argument's new shape
    c = torch.empty(1, dtype=torch.float64, device="pjrt")
    spec, metas, out, compute, (metas2, out2, compute2) = _roundtrip(
        torch.ops.aten.add.out, [x, x.to(torch.float16), 1, c])
    assert tuple(metas2[3].shape) == (3, 4) and out2 is metas2[3]
    assert _same(metas[3], metas2[3]) and compute == compute2
    # promotion of an integer tensor and a float: computation dtypes
    i = torch.zeros(5, dtype=torch.int64, device="pjrt")
    *_, compute, (_, _, compute2) = _roundtrip(torch.ops.aten.div.Tensor,
                                               [i, torch.ones(5, dtype=torch.int32,
                                                              device="pjrt")])
    assert compute == compute2 and compute is not None


def test_a_record_stands_only_for_the_same_run_time_numbers(tmp_path):
    """fill_(5) on int8 recorded, fill_(1000) in the next process: the meta kernel runs
    again and raises as the CPU does (the signature holds the number's type, not its
    value)."""
    with pytest.raises(RuntimeError, match="without overflow") as cpu:
        torch.zeros(2, dtype=torch.int8).fill_(1000)
    script = ("import torch, torch_pjrt, sys\n"
              "t = torch.zeros(2, dtype=torch.int8, device='pjrt')\n"
              "try:\n    print(t.fill_(int(sys.argv[1])).tolist())\n"
              "except RuntimeError as e:\n    print('raised', e)\n"
              "print(torch_pjrt.metrics().get('meta_records_used', 0))\n")
    seen = [_in_a_new_process(script, tmp_path, str(value)).split("\n")[:2]
            for value in (5, 5, 1000)]
    assert seen[0] == ["[5, 5]", "0"] and seen[1][0] == "[5, 5]"
    assert seen[2][0] == "raised " + str(cpu.value)
    # the second process took zeros' and fill_'s records, the third only zeros'
    assert int(seen[1][1]) == int(seen[2][1]) + 1 >= 2


def test_deterministic_algorithms_run_the_checks_a_record_was_made_without(tmp_path):
    """put_ recorded in a process without deterministic algorithms; the next process turns
    them on: put_ raises its nondeterminism alert as the CPU does, not the record's silence."""
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="deterministic") as cpu:
            torch.zeros(3).put_(torch.tensor([0, 1]), torch.ones(2))
    finally:
        torch.use_deterministic_algorithms(False)
    script = ("import torch, torch_pjrt, sys\n"
              "torch.use_deterministic_algorithms(sys.argv[1] == '1')\n"
              "t = torch.zeros(3, device='pjrt')\n"
              "try:\n"
              "    t.put_(torch.tensor([0, 1], device='pjrt'), torch.ones(2, device='pjrt'))\n"
              "    print(t.tolist())\n"
              "except RuntimeError as e:\n    print('raised', str(e).splitlines()[0])\n")
    seen = [_in_a_new_process(script, tmp_path, deterministic).strip().splitlines()[-1]
            for deterministic in ("0", "1")]
    assert seen[0] == "[1.0, 1.0, 0.0]"
    assert seen[1] == "raised " + str(cpu.value).splitlines()[0]


def test_a_torn_line_of_the_records_is_left_out_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warm_start.LAYOUTS, "loaded", None)
    name = "a" * 64
    warm_start.LAYOUTS.note(name, b'[[],["t",[2],[1],0,"torch.float32"],null]')
    path = warm_start._file(warm_start.LAYOUTS.file)
    with open(path, "ab") as f:
        f.write(b"b" * 64 + b' [[],["t",[2\n')
    monkeypatch.setattr(warm_start.LAYOUTS, "loaded", None)  # as a new process
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert warm_start.LAYOUTS.get(name) is not None
        assert warm_start.LAYOUTS.get("b" * 64) is None
    assert sum(issubclass(w.category, CacheWarning) for w in record) == 1
    with open(path, "rb") as f:
        assert f.read().count(b"\n") == 1  # rewritten with its good line
    monkeypatch.setattr(warm_start.LAYOUTS, "loaded", None)

"""torch_pjrt._compat, the one place for differences between torch releases, and the build
backend that compiles the native extension against the installed torch."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import torch_pjrt
from torch_pjrt import _compat
from torch_pjrt.lowering import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_aten_overloads_leaves_out_what_this_torch_lacks():
    found = _compat.aten_overloads("add.Tensor", "no_such_op.default", "add.no_such_overload")
    assert found == [torch.ops.aten.add.Tensor]


def test_cholesky_lowered_exactly_where_the_op_exists():
    torch_pjrt.ensure_initialized()  # (the lowerings register as PJRT starts)
    has = hasattr(torch.ops.aten, "cholesky")
    lowered = [op for op in registry.table() if op.name() == "aten::cholesky"]
    assert bool(lowered) == has
    assert has == (_compat.torch_release() < (2, 14))


def _backend():
    spec = importlib.util.spec_from_file_location(
        "torch_pjrt_build", ROOT / "build_backend" / "torch_pjrt_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_backend_borrows_the_installed_torch(monkeypatch):
    backend = _backend()
    found = backend.installed()
    # the distribution's version: PyPI's CUDA wheels say 2.14.1 where torch.__version__ says
    # 2.14.1+cu130 (the CPU build's wheel says 2.13.0+cpu, as torch does)
    assert found["torch"]["version"].split("+")[0] == torch.__version__.split("+")[0]
    assert pathlib.Path(found["torch"]["path"], "torch") == pathlib.Path(torch.__file__).parent
    monkeypatch.chdir(ROOT)
    assert backend.missing() == []  # nothing for pip to install into the build
    assert backend.project_requirement("torch").startswith("torch>=2.13")
    monkeypatch.setattr(backend, "installed", lambda: {})
    assert backend.missing() == [backend.project_requirement("torch"),
                                 backend.project_requirement("jaxlib")]


def test_a_program_compiles_with_the_options_this_xla_knows():
    """compile_lowered asks XLA with every option first (no probe compiles where it knows
    them all) and leaves out the ones it names as unknown."""
    import jax
    import numpy as np

    lowered = jax.jit(lambda x: x * 2 + 1).lower(np.arange(4.0, dtype=np.float32))
    for options in ({}, {"xla_backend_optimization_level": 0},
                    {"xla_backend_optimization_level": 0, "xla_no_such_option_anywhere": True}):
        run = _compat.compile_lowered(lowered, options)
        assert np.asarray(run(np.arange(4.0, dtype=np.float32))).tolist() == [1, 3, 5, 7]
    with pytest.raises(Exception, match="(?i)type|shape|invalid|unknown"):
        _compat.compile_lowered(lowered, {"xla_backend_optimization_level": "not a number"})


def test_xla_options_leaves_out_what_this_xla_lacks():
    import jax

    asked = {"xla_backend_optimization_level": 0, "xla_no_such_option_anywhere": True}
    assert _compat.xla_options(asked) == {"xla_backend_optimization_level": 0}
    kept = _compat.xla_options({"xla_cpu_use_fusion_emitters": False})
    # jaxlib 0.10 has it (measured), 0.12 does not: compiling with it fails there
    if jax.__version_info__ < (0, 11):
        assert kept == {"xla_cpu_use_fusion_emitters": False}
    elif jax.__version_info__ >= (0, 12):
        assert kept == {}


_NO_DYNAMO_YET = """
import json, sys, torch, torch_pjrt
from torch_pjrt import _compat
x = torch.arange(12.0, device="pjrt").reshape(3, 4)
out = {}
for mode in ("strict", "fused"):
    with torch_pjrt.set_eager_mode(mode):
        y = ((x + 1).exp().softmax(-1) * 2 - x.mean()).sum(0)
        out[mode] = y.cpu().tolist()
out["dynamo_after_ops"] = "torch._dynamo" in sys.modules
out["marked"] = len(_compat._DEFERRED_DISABLES)

def inner_of(ref):
    # torch._refs.exp's wrappers, down to _disable_dynamo's: the function it disables
    fn = ref
    for _ in range(8):
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        if fn.__code__.co_name == "inner" and "recursive" in cells:
            return cells["fn"].cell_contents
        fn = cells["fn"].cell_contents
    return None

target = inner_of(torch._refs.exp)
out["marked_exp"] = getattr(target, "__dynamo_disable", None) is target
f = torch.compile(lambda a: (a + 1).exp().softmax(-1), backend="pjrt")
out["compiled"] = f(x).sum(-1).cpu().tolist()
out["marks_left"] = len(_compat._DEFERRED_DISABLES)
torch.empty(2, device="meta").exp()  # the wrapper builds Dynamo's own disabled form now
out["exp_disable_is_dynamos"] = getattr(target, "__dynamo_disable", None) not in (None, target)
print("RESULT " + json.dumps(out))
"""


def test_eager_ops_import_no_dynamo_and_compile_still_works():
    """PyTorch's Python meta kernels import torch._dynamo at their first call (0.75-3.5 s
    of a first op); until Dynamo is imported they run as themselves (_compat.
    defer_dynamo_import), and torch.compile, which imports it, gets Dynamo's wrappers."""
    env = dict(os.environ, TORCH_PJRT_COMPILE_CACHE="0")
    done = subprocess.run([sys.executable, "-c", _NO_DYNAMO_YET], capture_output=True,
                          text=True, timeout=300, env=env)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and line, done.stderr[-3000:]
    out = json.loads(line[-1][len("RESULT "):])
    x = torch.arange(12.0).reshape(3, 4)
    expected = ((x + 1).exp().softmax(-1) * 2 - x.mean()).sum(0).tolist()
    for mode in ("strict", "fused"):
        assert out[mode] == pytest.approx(expected, rel=1e-6)
    assert out["dynamo_after_ops"] is False and out["marked"] > 100 and out["marked_exp"]
    assert out["compiled"] == pytest.approx([1.0, 1.0, 1.0], rel=1e-6)
    assert out["marks_left"] == 0 and out["exp_disable_is_dynamos"]

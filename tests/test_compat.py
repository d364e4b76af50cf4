"""torch_pjrt._compat, the one place for differences between torch releases, and the build
backend that compiles the native extension against the installed torch."""

import importlib.util
import pathlib

import torch

from torch_pjrt import _compat
from torch_pjrt.lowering import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_aten_overloads_leaves_out_what_this_torch_lacks():
    found = _compat.aten_overloads("add.Tensor", "no_such_op.default", "add.no_such_overload")
    assert found == [torch.ops.aten.add.Tensor]


def test_cholesky_lowered_exactly_where_the_op_exists():
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

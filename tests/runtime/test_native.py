"""The native extension is built at install time (setup.py) and only loaded at import: a build
for another torch, or older than the C++ sources beside it, is refused with what to do, and
importing never runs a compiler nor writes a build directory."""

import importlib
import os
import subprocess
import sys
import types

import pytest
import torch

from torch_pjrt import runtime
from torch_pjrt.runtime import native


def _built():
    return importlib.import_module("torch_pjrt.runtime.native._build_info")


def _info(**changes):
    """The build info of this build, with `changes`."""
    fields = {k: getattr(_built(), k) for k in ("TORCH", "JAXLIB", "SOURCES")}
    return types.SimpleNamespace(**{**fields, **changes})


def test_the_loaded_extension_lies_in_the_package_and_matches_its_build():
    runtime.register()
    assert os.path.dirname(runtime.shim().__file__) == os.path.dirname(native.__file__)
    native.check_build(_built())  # raises if stale
    assert _built().TORCH == torch.__version__


def test_a_build_for_another_torch_is_refused_naming_both_versions():
    with pytest.raises(ImportError, match=r"built against torch 2\.0\.0 and torch "
                       + torch.__version__.replace(".", r"\.").replace("+", r"\+")):
        native.check_build(_info(TORCH="2.0.0"))


def test_a_build_older_than_its_sources_is_refused():
    with pytest.raises(ImportError, match="C\\+\\+ sources .* changed after"):
        native.check_build(_info(SOURCES="0" * 64))


def test_no_build_is_refused_saying_how_to_build():
    with pytest.raises(ImportError, match="not built.*pip install"):
        native.check_build(None)


def test_import_runs_no_compiler_and_writes_no_build_directory(tmp_path):
    """No compiler on PATH, a fresh cache home: the device works and nothing was built."""
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare), "CXX": "false-compiler", "CC": "false-compiler",
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "HOME": str(tmp_path),
           "TORCH_PJRT_CACHE_DIR": str(tmp_path / "programs")}
    script = "import torch; print((torch.ones(2, device='pjrt') * 3).sum().item())"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["6.0"]
    assert not (tmp_path / "cache" / "torch_pjrt" / "native").exists()
    assert "building" not in out.stderr

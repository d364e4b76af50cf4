"""The PEP 517 build backend of torch-pjrt: setuptools, with the native extension built against
the torch (and jaxlib) of the environment being installed into, not a fresh one of its own."""

# Why (docs/compatibility.md): the extension links against libtorch and refuses to load beside
# another torch. Under pip's build isolation a plain `torch` build requirement would install a
# second torch (the newest in range, a multi-GB CUDA build from PyPI) into a throw-away build
# environment and compile against that, whatever torch the user has. So torch and jaxlib are
# no static build requirements: where the environment being installed into has them, the build
# borrows them (their folder is appended to the build's sys.path, after the build's own
# packages); only where it lacks one does the build ask for it, within the project's range.
# pip runs this backend with the interpreter it installs into (its isolation only filters
# sys.path), so that interpreter, started with -E (without pip's PYTHONPATH), says what the
# environment has. `python -m build` and other front ends with an interpreter of their own find
# nothing there and build against the torch they install, which the wheel then requires at
# import (runtime/native checks it).

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the hooks this module does not change)

BORROWED = ("torch", "jaxlib")  # what the extension compiles and links against

_FIND = """
import importlib.metadata, importlib.util, json, os
found = {}
for name in %r:
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        found[name] = {"version": importlib.metadata.version(name),
                       "path": os.path.dirname(list(spec.submodule_search_locations)[0])}
print(json.dumps(found))
"""


def installed() -> dict[str, dict[str, str]]:
    """{name: {"version", "path"}} of torch and jaxlib as the installing interpreter sees them
    without the build's isolation (-E: no PYTHONPATH, so pip's path filter is off)."""
    out = subprocess.run([sys.executable, "-E", "-c", _FIND % (BORROWED,)], capture_output=True,
                         text=True, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    if out.returncode != 0:
        return {}
    return json.loads(out.stdout.strip().splitlines()[-1])


def project_requirement(name: str) -> str:
    """The requirement on `name` in pyproject.toml's [project] dependencies (the one place the
    supported range is written)."""
    import tomllib

    with open("pyproject.toml", "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    for requirement in dependencies:
        if re.match(rf"{name}\s*([<>=!~;\[]|$)", requirement):
            return requirement
    raise LookupError(f"pyproject.toml's [project] dependencies name no {name}")


def borrow() -> dict[str, dict[str, str]]:
    """Append the folders of the installed torch and jaxlib to sys.path (after the build's own
    packages), and say what was borrowed."""
    found = installed()
    for name, where in found.items():
        if where["path"] not in sys.path:
            sys.path.append(where["path"])
        print(f"torch-pjrt: building against the installed {name} {where['version']} "
              f"({where['path']})", file=sys.stderr)
    return found


def missing() -> list[str]:
    """The build requirements: torch and jaxlib, each where the environment installed into
    lacks it (setuptools' own hooks would run setup.py, which imports torch, to find
    setup_requires; there are none)."""
    have = installed()
    return [project_requirement(name) for name in BORROWED if name not in have]


def get_requires_for_build_wheel(config_settings=None):
    return missing()


def get_requires_for_build_editable(config_settings=None):
    return missing()


def get_requires_for_build_sdist(config_settings=None):
    return missing()


def build_sdist(sdist_directory, config_settings=None):
    borrow()
    return _setuptools.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    borrow()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    borrow()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    borrow()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    borrow()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)

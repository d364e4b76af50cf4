"""Compile-check the native extension's sources against another torch's headers, without
installing that torch: each torch_pjrt/runtime/native/*.cpp is compiled with
-fsyntax-only against the headers of a torch wheel (or an include directory).

    python tools/native_header_check.py /path/to/torch-2.14.1-cp311-....whl
    python tools/native_header_check.py /path/to/site-packages/torch/include

Prints one line per source and exits 1 if any fails (docs/accelerator.md, "PyTorch
versions", has the results).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

NATIVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "torch_pjrt", "runtime", "native")


def torch_include(path: str, scratch: str) -> tuple[str, str]:
    """(the include directory, the torch version) of a wheel or an include directory."""
    if path.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist()
                     if n.startswith("torch/include/") or n == "torch/version.py"]
            wheel.extractall(scratch, names)
        path = os.path.join(scratch, "torch", "include")
    found: dict = {}
    version_file = os.path.join(os.path.dirname(os.path.abspath(path)), "version.py")
    if os.path.isfile(version_file):
        with open(version_file) as f:
            exec(f.read(), {}, found)  # torch's own version file
    return path, found.get("__version__", "?")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("torch", help="a torch wheel, or a torch/include directory")
    args = p.parse_args()
    import jaxlib

    jaxlib_include = os.path.join(os.path.dirname(jaxlib.__file__), "include")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="pjrt-headers-") as scratch:
        include, version = torch_include(args.torch, scratch)
        flags = ["-std=c++20", "-fsyntax-only", "-w", f"-I{include}",
                 f"-I{os.path.join(include, 'torch', 'csrc', 'api', 'include')}",
                 f"-I{os.path.join(include, 'kineto')}", f"-I{jaxlib_include}",
                 f"-I{sysconfig.get_paths()['include']}", "-DUSE_KINETO",
                 "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C"]
        for source in sorted(glob.glob(os.path.join(NATIVE, "*.cpp"))):
            out = subprocess.run(["g++", *flags, source], capture_output=True, text=True)
            errors = [line for line in out.stderr.splitlines() if "error" in line]
            ok = out.returncode == 0
            failed += not ok
            print(f"torch {version}: {os.path.basename(source)}: "
                  f"{'ok' if ok else 'FAILED'}" + ("" if ok else "\n  " + "\n  ".join(errors[:8])))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

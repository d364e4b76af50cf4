"""Builds torch-pjrt's native extension (every runtime/native/*.cpp) at install time, against
the torch and jaxlib of the build environment, and records what it was built against."""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import shutil

from setuptools import setup
from setuptools.errors import PlatformError

# torch imports the backends installed (autoload): a torch-pjrt installed before, perhaps not
# built yet or built for another torch, must not be loaded into its own build.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch.utils import cpp_extension  # noqa: E402

NATIVE = os.path.join("torch_pjrt", "runtime", "native")
BUILD_INFO = os.path.join(NATIVE, "_build_info.py")  # generated; read by runtime/native


def native_sources() -> list[str]:
    """Every C++ file of runtime/native: a new one builds without a change here."""
    return sorted(glob.glob(os.path.join(NATIVE, "*.cpp")))


def loader():
    """runtime/native/__init__.py, the loader (by path: the package itself is not imported
    at build time), whose source_digest() the build records."""
    spec = importlib.util.spec_from_file_location("torch_pjrt_native_loader",
                                                  os.path.join(NATIVE, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def jaxlib_include_dir() -> str:
    """XLA's FFI headers, which jaxlib ships (cpu_kernels.cpp), found without importing
    jaxlib."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        raise PlatformError("torch-pjrt's native extension needs jaxlib's FFI headers: "
                            "install jaxlib first")
    return os.path.join(spec.submodule_search_locations[0], "include")


def jaxlib_version() -> str:
    from importlib.metadata import version

    return version("jaxlib")


def arch_flags() -> list[str]:
    """x86-64 builds of torch compile their ATen kernels for AVX2 and AVX-512, which
    shapes the kernels' dispatch stubs; cpu_kernels.cpp calls stubs only where it knows
    their layout."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ["-DHAVE_AVX512_CPU_DEFINITION", "-DHAVE_AVX2_CPU_DEFINITION",
                "-DTORCH_PJRT_ATEN_STUBS"]
    return []


def kineto_flags() -> tuple[list[str], list[str]]:
    """(cflags, include paths) for the profiler hooks: the Kineto headers torch ships, where
    this build of torch has Kineto."""
    import torch

    include = os.path.join(os.path.dirname(torch.__file__), "include", "kineto")
    if not os.path.isfile(os.path.join(include, "IActivityProfiler.h")):
        return [], []
    return ["-DUSE_KINETO"], [include]


def native_headers() -> list[str]:
    return sorted(glob.glob(os.path.join(NATIVE, "*.h")))


def build_info(extension) -> dict[str, str]:
    """What the library is built from and against: the torch it was built against
    (runtime/native refuses another), the digest of its sources (a checkout whose sources
    changed since refuses the stale build), jaxlib and the flags."""
    import torch

    flags = extension.extra_compile_args + extension.extra_link_args
    return {"TORCH": torch.__version__, "JAXLIB": jaxlib_version(),
            "SOURCES": loader().source_digest(native_sources() + native_headers()),
            "FLAGS": " ".join(flags)}


def write_build_info(path: str, info: dict[str, str]) -> None:
    with open(path, "w") as f:
        f.write('"""What the native extension was built against (written by setup.py)."""\n\n')
        f.writelines(f"{key} = {value!r}\n" for key, value in info.items())


def read_build_info(path: str) -> dict[str, str] | None:
    if not os.path.isfile(path):
        return None
    found: dict[str, str] = {}
    with open(path) as f:
        exec(f.read(), {}, found)  # our own file, written by write_build_info
    return {key: value for key, value in found.items() if key.isupper()}


class BuildNative(cpp_extension.BuildExtension):
    """torch's BuildExtension, after a check that a C++ compiler is there (else a clear
    error instead of a compiler's command failing), writing the build info next to the
    library. A library already in the tree (an editable install's) that was built from the
    same sources, flags, torch and jaxlib is taken as it is (a wheel built from a checkout
    then compiles nothing); else it always builds: ninja recompiles what changed, the torch
    it builds against included (setuptools' own check looks at the sources' times only)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.force = True

    def build_extensions(self) -> None:
        extension = self.extensions[0]
        library = self.get_ext_fullpath(extension.name)
        self.build_info = os.path.join(os.path.dirname(library), os.path.basename(BUILD_INFO))
        info = build_info(extension)
        in_tree = os.path.join(NATIVE, os.path.basename(library))
        if read_build_info(BUILD_INFO) == info and os.path.isfile(in_tree):
            print(f"torch-pjrt: {in_tree} was built from these sources against torch "
                  f"{info['TORCH']}: taken as it is")
            self.mkpath(os.path.dirname(library))
            if os.path.abspath(in_tree) != os.path.abspath(library):
                self.copy_file(in_tree, library, level=self.verbose)
        else:
            self.check_compiler()
            super().build_extensions()
        write_build_info(self.build_info, info)

    def check_compiler(self) -> None:
        cxx = self.compiler.compiler_cxx[0] if hasattr(self.compiler, "compiler_cxx") else None
        if cxx and shutil.which(cxx) is None:
            raise PlatformError(
                f"torch-pjrt builds a C++ extension at install time and found no C++ compiler "
                f"({cxx!r} is not on PATH; the CXX variable names another). Install one "
                f"(Debian/Ubuntu: apt-get install g++; Fedora: dnf install gcc-c++; macOS: "
                f"xcode-select --install), then install torch-pjrt again.")

    def copy_extensions_to_source(self) -> None:
        """Editable installs and --inplace: the library and its build info into the tree."""
        super().copy_extensions_to_source()
        self.copy_file(self.build_info, BUILD_INFO, level=self.verbose)


def native_extension() -> cpp_extension.CppExtension:
    kineto_cflags, kineto_include = kineto_flags()
    return cpp_extension.CppExtension(
        "torch_pjrt.runtime.native._C", native_sources(), depends=native_headers(),
        include_dirs=[jaxlib_include_dir(), *kineto_include],
        # -g0: no debug information (Python's own CFLAGS ask for it: 20x the library's size)
        extra_compile_args=["-O2", "-g0", *arch_flags(), *kineto_cflags],
        extra_link_args=["-ldl"],
    )


setup(ext_modules=[native_extension()], cmdclass={"build_ext": BuildNative})

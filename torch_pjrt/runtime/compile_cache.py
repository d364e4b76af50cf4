"""The persistent compile cache: XLA executables on disk, shared by every mode.

Each program (one op in strict mode, one graph in fused mode, one graph under
torch.compile) has a digest of its cache key plus everything else that shapes
the program (platform_key()): the torch, jax and torch-pjrt versions (torch-pjrt by
a hash of its sources), the platform, device kind and count, the compiler's flags and,
on the CPU, the processor's instruction set. A warm process deserializes the
executable instead of tracing, lowering and compiling it; a cache packed by
runtime/cache_bundle.py carries the same key to other machines.

Entries are written to a temporary file and renamed into place, so readers in
other processes never see a partial entry; a damaged entry (unreadable, bad magic,
length or checksum, or a failed deserialization) is deleted and recompiled, and
one that another user owns or others can write is not loaded (runtime/cache_files.py
does the checking, for every file of the cache). When the directory grows past its
size limit the least recently used entries are evicted.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _env, counters
from . import cache_files, device_trace, dumps, watch

MAGIC = b"TPJRTXC1"
SUFFIX = ".xc"

_total_bytes: int | None = None  # this process's running estimate of the cache size


def enabled() -> bool:
    """Whether programs are kept on disk: on (TORCH_PJRT_COMPILE_CACHE), and the cache
    directory is this user's alone (or shared on purpose: cache_files.usable)."""
    return _env.flag("TORCH_PJRT_COMPILE_CACHE") and cache_files.usable(root())


def root() -> str:
    """The cache directory (TORCH_PJRT_CACHE_DIR): xla/ and aot/ are under it."""
    return os.path.abspath(_env.cache_dir())


def max_bytes() -> int:
    return int(float(_env.get("TORCH_PJRT_CACHE_MAX_BYTES")))


def directory() -> str:
    return os.path.join(root(), "xla")


# The parts of torch-pjrt whose code shapes the compiled programs.
_PROGRAM_SOURCES = ("eager", "lowering", "storage", "compile")
_PROGRAM_FILES = ("runtime/cpu_kernels.py", "runtime/native/cpu_kernels.cpp")


@functools.cache
def _source_hash() -> str:
    """A hash of torch-pjrt's own sources: a changed lowering must not reuse old programs."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in (walked for part in _PROGRAM_SOURCES
                                         for walked in os.walk(os.path.join(package, part))):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".cpp")):
                with open(os.path.join(dirpath, name), "rb") as f:
                    h.update(name.encode() + f.read())
    for name in _PROGRAM_FILES:
        with open(os.path.join(package, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()[:16]


# register_jax kernels' code (outside torch-pjrt) by the hash of the file defining each
_kernel_sources: dict[str, str] = {}


def note_kernel_source(fn: Callable) -> None:
    """A registered JAX kernel's code shapes the programs that call it: the hash of the
    file that defines `fn` joins every program's digest, so that an edited kernel never
    reuses a program compiled from its old code (code it imports from other files is not
    covered). A function without a readable file (built at run time) counts by its name."""
    import inspect

    fn = inspect.unwrap(fn)
    try:
        path = inspect.getsourcefile(fn) or ""
        with open(path, "rb") as f:
            text = f.read()
    except (TypeError, OSError):
        path, text = "", repr(fn).encode()
    name = f"{getattr(fn, '__module__', '')}:{os.path.basename(path)}"
    digest = hashlib.sha256(text).hexdigest()[:16]
    if _kernel_sources.get(name) != digest:
        _kernel_sources[name] = digest
        _prefix.cache_clear()


_COMPILER_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "NEURON_CC_FLAGS")


@functools.cache
def platform_key(device_index: int = 0) -> dict[str, str]:
    """Everything besides a program's own code that decides whether a stored program may
    run here: versions, torch-pjrt's sources, the device, the compiler's flags. Part of
    every entry's digest, and the key a shipped cache carries (runtime/cache_bundle.py)."""
    import jax
    import jaxlib
    import torch

    from . import client, cpu_kernels

    d = client.device(device_index)
    parts = {"torch": torch.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
             "src": _source_hash(), "platform": d.platform, "kind": d.device_kind,
             "devices": str(client.device_count())}
    # compiler options given through the environment change the program XLA builds
    parts.update({v: os.environ.get(v, "") for v in _COMPILER_ENV})
    parts["cpu_kernels"] = str(cpu_kernels.available())  # custom calls in the programs
    # lowerings that pick another formulation by a switch (convolutions as patches)
    parts["conv_patches"] = str(_env.flag("TORCH_PJRT_CONV_PATCHES"))
    parts["opt_level"] = _opt_level()  # default_options
    if d.platform == "cpu":  # XLA:CPU compiles for this processor's instruction set
        parts["host"] = _host_cpu()
    return parts


def _host_cpu() -> str:
    """The processor's architecture and a hash of its feature flags: a program compiled
    for one x86 machine's instructions (AVX-512, say) must not run on another's."""
    import platform

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = " ".join(sorted(line.split(":", 1)[1].split()))
                    break
    except OSError:
        flags = platform.processor()
    return f"{platform.machine()}-{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


@functools.cache
def _prefix(device_index: int) -> str:
    """platform_key, and the register_jax kernels' files (part of each program's digest, not
    of the platform: a shipped cache is imported by a process that has not loaded them)."""
    prefix = "".join(f"{k}={v};" for k, v in platform_key(device_index).items())
    if _kernel_sources:
        prefix += "kernels=" + ",".join(f"{k}={v}" for k, v in sorted(_kernel_sources.items()))
    return prefix


def digest(key: Any, device_index: int) -> str:
    import torch

    text = _prefix(device_index) + f"mm={torch.get_float32_matmul_precision()};" + repr(key)
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def quick_options() -> dict:
    """XLA options for programs compiled to run soon rather than fast (eager/tiers.py's op
    programs while a fused program compiles): on XLA:CPU, LLVM without optimization and
    the older loop emitters compile an op's program in 40% of the time (measured:
    docs/compile-cost.md); {} elsewhere (not measured there) and with
    TORCH_PJRT_QUICK_OPS=0. Read once per process; an option this jaxlib's XLA no longer
    has is left out where a program compiles (_compat.compile_lowered)."""
    from . import client

    if client.platform() != "cpu" or not _env.flag("TORCH_PJRT_QUICK_OPS"):
        return {}
    return {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def _opt_level() -> str:
    return _env.get("TORCH_PJRT_XLA_CPU_OPT_LEVEL") or "2"


@functools.cache
def default_options() -> dict:
    """XLA options for every program compiled without quick_options: on XLA:CPU, LLVM at
    TORCH_PJRT_XLA_CPU_OPT_LEVEL (2) instead of XLA's 3. Level 3 spends most of a small
    program's compile in LLVM passes that make its code no faster here: threefry's random
    bits compile in 142 ms instead of 606 ms and run as fast (16M uniforms: 262 ms against
    278 ms), a PyTorch index_reduce test's 636 programs in 87 s instead of 224 s, and the
    zoo's steps are no slower (docs/compile-cost.md). {} elsewhere (not measured there)."""
    from . import client

    level = _opt_level()
    if client.platform() != "cpu" or level == "3":
        return {}
    return {"xla_backend_optimization_level": int(level)}


def _path(name: str) -> str:
    return os.path.join(directory(), name[:2], name + SUFFIX)


def stored(name: str) -> bool:
    """Whether a program is in the disk cache (a stat, nothing read): loading it costs
    milliseconds where compiling it costs tens (eager/tiers.py weighs the two)."""
    return enabled() and os.path.exists(_path(name))


@functools.cache
def _prepare_custom_calls() -> None:
    """Set up what the custom calls of a program from disk call into. JAX does this while
    lowering (LAPACK's function table on CPU); a program that skipped lowering would call
    through null pointers (a segfault) in its first eigh, svd or solve."""
    try:
        from jax._src.lax import linalg
        linalg.initialize_lapack()
    except (ImportError, AttributeError):  # another jaxlib layout: JAX sets it up itself
        pass


def load(name: str, device: int, probe: bool = False):
    """(executable, side info, bytes on disk) stored under `name`, or None (missing or
    damaged: then recompiled). `probe`: asked only whether it is there (a tiered flush's
    fused program, whose ops run one by one if not): a missing entry is no miss, since
    nothing is compiled for it."""
    if not enabled():
        return None
    path = _path(name)
    payload = cache_files.read(path, root(), "program", "disk_cache", MAGIC)
    if payload is None:
        if not probe:
            counters.count("disk_cache_misses")
        return None
    try:
        from jax.experimental.serialize_executable import deserialize_and_load

        from . import client, cpu_kernels

        serialized, side = pickle.loads(payload)
        if b"lapack" in payload:  # the targets' names are in the stored program
            _prepare_custom_calls()  # (70 ms: it imports scipy.linalg)
        if cpu_kernels.PREFIX.encode() in payload:
            cpu_kernels.available()  # registers the kernels' handlers
        compiled = deserialize_and_load(*serialized,
                                        execution_devices=[client.device(device)])
    except Exception as e:  # noqa: BLE001 - a damaged entry is recompiled, never fatal
        cache_files.damaged(path, "program", "disk_cache", f"does not load: {e!r:.200}")
        counters.count("disk_cache_misses")  # and a miss: it is compiled again
        return None
    counters.count("disk_cache_hits")
    try:
        os.utime(path)  # most recently used
    except OSError:
        pass
    return compiled, side, len(payload)


def store(name: str, compiled, side: Any = None) -> int | None:
    """Write `compiled` (and `side`, what tracing learned that the program does not say,
    e.g. which outputs are device-side check flags) under `name` atomically; evict old
    entries past the size limit. Returns the program's size serialized (None: not
    serialized)."""
    if not enabled() or not cache_files.writable(root()):
        return None
    try:
        from jax.experimental.serialize_executable import serialize

        payload = pickle.dumps((serialize(compiled), side), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - some executables cannot be serialized: skip them
        counters.count("disk_cache_unserializable")
        return None
    if not cache_files.write(_path(name), root(), MAGIC, payload):
        return len(payload)
    counters.count("disk_cache_writes")
    _account(len(payload))
    return len(payload)


def compile(jitted, args: tuple, name: str, device: int, get_side=None, set_side=None,
            drop: Callable[[], None] | None = None):
    """`jitted` compiled for `args`: from the disk cache, else by XLA (then stored).

    get_side() is called after tracing for the side info to store with the program;
    set_side(info) restores it when the program comes from disk instead. drop() makes the
    caller let go of the program (it compiles it again, from disk, at its next use): called
    when the process holds too many programs (see _hold)."""
    return finish(obtain(jitted, args, name, device, get_side), name, set_side, drop)


class Built:
    """A program obtain() loaded or compiled, for finish() to take into use."""

    __slots__ = ("compiled", "side", "source", "seconds", "lowered", "began", "jitted", "args",
                 "nbytes")

    def __init__(self, compiled, side, source: str, seconds: float, lowered, began: int,
                 jitted, args: tuple, nbytes: int | None):
        self.compiled = compiled
        self.side = side
        self.source = source  # "disk" or "compiled"
        self.seconds = seconds
        self.lowered = lowered
        self.began = began
        self.jitted = jitted
        self.args = args
        self.nbytes = nbytes  # its size serialized (None: not serialized)


def obtain(jitted, args: tuple, name: str, device: int, get_side=None,
           build: bool = True, options: dict | None = None) -> Built | None:
    """`jitted` for `args` (arrays or their avals) from the disk cache, else compiled by
    XLA (with these compiler `options`, which `name` must reflect) and stored; None where
    it is not on disk and `build` is false. Safe on a compile thread
    (runtime/compile_pool.py): it changes only counters and files."""
    start = time.perf_counter()
    began = device_trace.now() if watch.profiling else 0
    found = load(name, device, probe=not build)
    if found is not None:
        return Built(found[0], found[1], "disk", time.perf_counter() - start, None, began,
                     jitted, args, found[2])
    if not build:
        return None
    lowered = jitted.lower(*args)
    options = options if options is not None else default_options()
    from .. import _compat

    compiled = _compat.compile_lowered(lowered, options)
    side = get_side() if get_side is not None else None
    nbytes = store(name, compiled, side)
    return Built(compiled, side, "compiled", time.perf_counter() - start, lowered, began,
                 jitted, args, nbytes)


def finish(built: Built, name: str, set_side=None, drop: Callable[[], None] | None = None):
    """A program obtain() gave, taken into use on the user's thread: its side info
    restored (from disk), noted for the metrics, dumps and profiles; its entry point."""
    if built.source == "disk" and set_side is not None:
        set_side(built.side)
    program = watch.compiled(name, built.source, built.seconds, built.nbytes)
    if watch.dumping:
        dumps.write(program, built.compiled, built.lowered or built.jitted.lower(*built.args))
    if built.began:
        device_trace.compiled(program, built.began, built.source)
    if drop is not None:
        _hold(drop)
    _staged()
    return _entry_point(built.compiled)


# ------------------------------------------------------------------ JAX's staging caches
# JAX keeps what it staged for every program traced and compiled through it (the jaxpr, the
# lowered module, the pjit call caches), keyed on the jitted function: about 1.5 MB per
# compiled XLA:CPU program, measured, never freed while the function lives, which for pjrt
# is as long as the op's or graph's cache entry (a test-suite worker passed 4 GB). pjrt's
# entries hold their executables themselves, so those caches are let go every
# _CLEAR_EVERY programs taken, while no background compile runs; JAX traces again what is
# used again (a program let go by _hold, a jitted helper) at its next use.
_CLEAR_EVERY = 256
_taken_since_clear = 0


def _staged() -> None:
    global _taken_since_clear
    _taken_since_clear += 1
    if _taken_since_clear < _CLEAR_EVERY:
        return
    from . import compile_pool

    if not compile_pool.idle():
        return  # (tried again at the next program)
    import jax

    jax.clear_caches()
    _taken_since_clear = 0
    counters.count("jax_caches_cleared")


# ------------------------------------------------------------------ live programs
# Each loaded XLA:CPU program maps its code and data (about 9 memory mappings each,
# measured): past vm.max_map_count (65530 by default) the next mmap fails and XLA crashes
# in the middle of a load or a compile. A long process reaches that (a test-suite worker
# died at 61,500 mappings, about 6,800 programs), so the oldest programs are let go past a limit
# derived from it; the disk cache brings them back in milliseconds when they are used.
# Programs of many kernels map more (a worker of PyTorch's test_indexing.py held 53,000
# mappings under that limit, and test_view_ops.py's died in LLVM with "Cannot allocate
# memory"), so every _MAP_CHECK_EVERY programs the process's mappings are counted too, and
# past half the limit the oldest programs go as well.
_live: dict[int, Callable[[], None]] = {}  # in the order the programs were taken
_MAPS_PER_PROGRAM = 10
_MAP_CHECK_EVERY = 64
_held_since_map_check = 0


@functools.cache
def max_map_count() -> int | None:
    """The kernel's limit on a process's memory mappings (None where there is none)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


@functools.cache
def max_live() -> int:
    """How many programs a process holds at most (a quarter of them go past it)."""
    limit = max_map_count()
    if limit is None:
        return 1 << 30  # no such limit here
    return max(256, limit // 2 // _MAPS_PER_PROGRAM)


def map_count() -> int | None:
    """How many memory mappings the process has now (tens of milliseconds at 50,000)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def _too_many_maps() -> bool:
    global _held_since_map_check
    _held_since_map_check += 1
    if _held_since_map_check < _MAP_CHECK_EVERY:
        return False
    _held_since_map_check = 0
    limit, count = max_map_count(), map_count()
    return limit is not None and count is not None and count > limit // 2


def _hold(drop: Callable[[], None]) -> None:
    _live[id(drop)] = drop
    if len(_live) <= max_live() and not _too_many_maps():
        return
    from . import sync

    sync.drain()  # nothing let go while it runs
    oldest = list(_live)[:len(_live) // 4]
    for key in oldest:
        _live.pop(key)()
    counters.count("programs_let_go", len(oldest))


def _entry_point(compiled):
    """The program's C++ call path: jax.stages.Compiled.__call__ is a Python frame in front
    of it, a measurable part of a small op's cost. Falls back to the Compiled object."""
    try:
        call = compiled._call or compiled._executable.create_cpp_call(compiled._params)
    except AttributeError:
        return compiled
    if call is None:
        return compiled
    compiled._call = call
    return call


# ------------------------------------------------------------------ eviction
def _entries() -> list[tuple[float, int, str]]:
    return cache_files.entries(directory(), SUFFIX)


_size_lock = threading.Lock()  # programs are stored from compile threads too


def _account(nbytes: int) -> None:
    global _total_bytes
    with _size_lock:
        if _total_bytes is None:
            _total_bytes = sum(size for _, size, _ in _entries())
        else:
            _total_bytes += nbytes
        if _total_bytes > max_bytes():
            evict(int(max_bytes() * 0.8))


def forget_size() -> None:
    """Entries were added from outside this process's writes (an import): count again."""
    global _total_bytes
    _total_bytes = None


def evict(target_bytes: int) -> int:
    """Delete least recently used entries until the cache holds at most target_bytes."""
    global _total_bytes
    entries = sorted(_entries())
    total = sum(size for _, size, _ in entries)
    removed = 0
    for _, size, path in entries:
        if total <= target_bytes:
            break
        if cache_files.remove(path):
            total -= size
            removed += 1
    counters.count("disk_cache_evictions", removed)
    _total_bytes = total
    return removed


def info() -> dict[str, Any]:
    entries = _entries()
    newest = max((m for m, _, _ in entries), default=None)
    return {
        "directory": directory(),
        "enabled": enabled(),
        "entries": len(entries),
        "bytes": sum(size for _, size, _ in entries),
        "max_bytes": max_bytes(),
        "newest": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest)) if newest else None,
    }


def clear() -> int:
    """Delete every entry; returns how many there were."""
    n = 0
    for _, _, path in _entries():
        n += cache_files.remove(path)
    from . import warm_start

    warm_start.forget()
    global _total_bytes
    _total_bytes = 0
    return n

"""Warm starts of `torch.compile(backend="pjrt")`: AOTAutograd's work kept on disk.

A cold compile of a training step spends most of its time in XLA, whose programs
the persistent compile cache (runtime/compile_cache.py) already keeps. What a
warm process still paid was AOTAutograd: tracing the joint forward and backward,
functionalizing and partitioning it, for each graph Dynamo hands the backend.

PyTorch's AOTAutogradCache can skip that for any backend whose compilers return
a serializable `OutputCode` ("bundled" entries, the way aot_eager does it).
Two of its defaults do not fit us, so they are replaced while our backend
compiles (and only then):

- its cache key hashes Inductor's whole configuration and registers every
  Inductor code generator to do so: 0.9 s in a fresh process, more than the
  tracing it saves. Our key hashes what shapes a pjrt graph instead: Dynamo's
  graph (code, constants, input metadata), AOTAutograd's settings and global
  state, and what keys our XLA programs (versions, torch-pjrt's sources,
  platform, matmul precision, bucketing);
- its entries live in Inductor's cache directory as bare pickles; ours are
  under TORCH_PJRT_CACHE_DIR/aot with a checksum, checked as every file of our
  cache is (runtime/cache_files.py): a damaged one is deleted and compiled again,
  one another user owns or others can write is not unpickled.

Everything else is AOTAutograd's own: its guards on dynamic sizes, the runtime
wrappers it rebuilds on a hit. Dynamo still traces the user's code (and checks
its guards) in every process. The cache is on when the persistent compile cache
is (TORCH_PJRT_COMPILE_CACHE) and PyTorch's own switches for it are
(torch.compiler.config.force_disable_caches, TORCHINDUCTOR_AUTOGRAD_CACHE).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._inductor.output_code import OutputCode

from .. import _env, counters
from ..runtime import cache_files, compile_cache
from . import AOT_FOLDER
from . import AOT_MAGIC as _MAGIC
from . import AOT_SUFFIX as _SUFFIX

_MAX_SHARE = 0.1  # of the compile cache's size limit, for these entries


def enabled() -> bool:
    from torch._functorch._aot_autograd.autograd_cache import should_use_local_autograd_cache

    return compile_cache.enabled() and should_use_local_autograd_cache()


def directory() -> str:
    return os.path.join(compile_cache.root(), AOT_FOLDER)


# ------------------------------------------------------------------ the output code
@dataclasses.dataclass
class PjrtOutputCode(OutputCode):
    """What our compilers return to AOTAutograd: the compiled graph, and what rebuilds it
    in another process (the graph, pickled, and the name its XLA programs are stored
    under). Calls take AOTAutograd's boxed list of inputs."""

    fn: Callable | None = None
    gm: torch.fx.GraphModule | None = None
    internal_from: int | None = None
    name: str | None = None
    _pickled_gm: bytes | None = None

    def __post_init__(self) -> None:
        self._boxed_call = True

    def __call__(self, inputs: list) -> Any:
        return self.fn(inputs)

    def prepare_for_serialization(self) -> None:
        """Called on a shallow copy: the live graph and its program stay untouched."""
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
        from torch.fx._graph_pickler import Options

        try:
            with _only_values(self.gm):
                self._pickled_gm = _graph_pickler().dumps(self.gm, Options(ops_filter=None))
        except Exception as e:  # noqa: BLE001 - e.g. an op no other process could import
            counters.count("aot_cache_bypasses")
            raise BypassAOTAutogradCache(f"pjrt: graph not serializable: {e}") from e
        self.fn = None
        self.gm = None

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        """A cache hit: the graph compiled again from its stored copy. Its XLA programs
        come from the persistent compile cache when they run."""
        if self.fn is not None:
            return
        from torch._subclasses import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        from .backend import compile_output

        gm = _graph_pickler().loads(self._pickled_gm, FakeTensorMode(shape_env=ShapeEnv()))
        inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
        rebuilt = compile_output(gm, inputs, self.internal_from, self.name)
        self.fn, self.gm, self._pickled_gm = rebuilt.fn, gm, None
        if not graph_kwargs.get("is_backward"):  # one hit per Dynamo graph
            counters.count("aot_cache_hits")

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


@contextlib.contextmanager
def _only_values(gm: torch.fx.GraphModule) -> Iterator[None]:
    """The graph's nodes with only the metadata our lowering reads (their fake values)
    while it is pickled: stack traces, provenance and the partitioner's tags were most
    of each stored graph and of the time a warm start spent loading it."""
    nodes = list(gm.graph.nodes)
    metas = [n.meta for n in nodes]
    for n, meta in zip(nodes, metas):
        n.meta = {"val": meta["val"]} if "val" in meta else {}
    try:
        yield
    finally:
        for n, meta in zip(nodes, metas):
            n.meta = meta


@functools.cache
def _graph_pickler() -> type:
    """torch.fx's GraphPickler, with a shortcut for the common fake tensor (static sizes,
    not a view): rebuilt from its sizes, strides and dtype in a few microseconds instead
    of through the meta converter (which halves the time a warm start spends loading a
    graph). Every other value takes GraphPickler's own way."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx._graph_pickler import GraphPickler

    class Pickler(GraphPickler):
        def reducer_override(self, obj: object) -> Any:
            if type(obj) is FakeTensor and obj.layout == torch.strided and not obj._is_view() \
                    and obj.storage_offset() == 0 and not obj.is_conj() and not obj.is_neg() \
                    and all(type(s) is int for s in (*obj.shape, *obj.stride())):
                return _plain_fake, (self._unpickle_state, tuple(obj.shape), obj.stride(),
                                     obj.dtype, obj.device, obj.requires_grad)
            return super().reducer_override(obj)

    return Pickler


def _plain_fake(state: Any, shape: tuple, stride: tuple, dtype: torch.dtype,
                device: torch.device, requires_grad: bool) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        t = FakeTensor(state.fake_mode, meta, device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def serializable(compiler: Callable) -> Any:
    """`compiler` marked for AOTAutograd as returning an OutputCode (which makes it look
    its result up in the cache, and store it)."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    return SerializableAOTDispatchCompiler(PjrtOutputCode, compiler)


# ------------------------------------------------------------------ the cache key
class _KeyParts:
    """Everything a cached AOTAutograd result depends on (pickled for the key with
    AOTAutogradCache's own pickler, which reduces graphs to their code, tensors to their
    metadata and sizes to their symbols)."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, aot_config,
                 more: tuple = ()) -> None:
        from . import buckets

        self.more = more  # the key function's arguments after the config, where given
        self.gm = gm
        self.example_inputs = example_inputs
        self.aot_config = aot_config
        self.constants = _constants_digest(gm)
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = {d: torch.get_autocast_dtype(d)
                         for d in torch._C._autocast_supported_devices()
                         if torch.is_autocast_enabled(d)}
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.default_dtype = torch.get_default_dtype()
        self.functorch_config = torch._functorch.config.save_config()
        self.tag = torch.compiler.config.cache_key_tag
        self.python = sys.version_info[:2]  # what wrote the pickled entry
        self.pjrt = (compile_cache.digest("torch.compile", _device_index(example_inputs)),
                     buckets.steps_per_octave(), _env.flag("TORCH_PJRT_CPU_FALLBACK"))


def _device_index(example_inputs) -> int:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "pjrt":
            return x.device.index or 0
    return 0


def _constants_digest(gm: torch.fx.GraphModule) -> str:
    """Values of the tensors the graph holds as constants (the key pickler keeps their
    metadata only); parameters and buffers are not: AOTAutograd makes them inputs."""
    h = hashlib.sha256()
    inputs = {name for name, _ in gm.named_parameters()} | {name for name, _ in
                                                            gm.named_buffers()}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = getattr(gm, node.target, None)
        if isinstance(value, torch.Tensor) and node.target not in inputs:
            h.update(node.target.encode())
            h.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                     .numpy().tobytes())  # (bytes: bfloat16 has no numpy dtype)
    return h.hexdigest()


def _key(mod, example_inputs, aot_config, compiler_config_extra=None,
         *more) -> tuple[str, list]:
    """Replaces AOTAutogradCache's key function while our backend compiles. Arguments
    later releases add (2.14: the activations' input paths) go into the key as they come:
    a signature that refused them turned every lookup into a silent bypass."""
    from torch._functorch._aot_autograd import autograd_cache

    gm = mod.gm if isinstance(mod, torch._dynamo.utils.GmWrapper) else mod
    try:
        with autograd_cache.sanitize_gm_for_cache(gm):
            autograd_cache.check_cacheable(gm)  # only ops whose meaning the key captures
            parts = _KeyParts(gm, example_inputs, aot_config, more)
            key = "pjrt" + autograd_cache.AOTAutogradCachePickler(gm).get_hash(parts)
    except Exception:
        counters.count("aot_cache_bypasses")  # AOTAutograd compiles it, uncached
        raise
    counters.count("aot_cache_lookups")
    return key, []


# ------------------------------------------------------------------ storage
def _entry_dir(key: str) -> str:
    return os.path.join(directory(), key)


def _candidates(cls, local: bool, remote_cache, key: str) -> Iterator[tuple[Any, bytes, bool]]:
    """Replaces AOTAutogradCache.iterate_over_candidates: the entries stored for `key`
    (one per set of guards on dynamic sizes); a damaged one is deleted (and so missed,
    compiled and stored again)."""
    if not local:
        return
    folder = _entry_dir(key)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(_SUFFIX))
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        content = cache_files.read(path, compile_cache.root(), "AOTAutograd entry",
                                   "aot_cache", _MAGIC)
        if content is None:
            continue
        try:
            entry = pickle.loads(content)
        except Exception as e:  # noqa: BLE001 - a damaged entry is compiled again, never fatal
            cache_files.damaged(path, "AOTAutograd entry", "aot_cache",
                                f"does not unpickle: {e!r:.200}")
            continue
        with contextlib.suppress(OSError):
            os.utime(path)  # most recently used
        yield entry, content, True


def _write(key: str, content: bytes) -> None:
    """Replaces AOTAutogradCache._write_to_local_cache: atomic, with a checksum."""
    path = os.path.join(_entry_dir(key), hashlib.sha256(content).hexdigest()[:32] + _SUFFIX)
    if not cache_files.write(path, compile_cache.root(), _MAGIC, content):
        return
    counters.count("aot_cache_writes")
    _evict(int(compile_cache.max_bytes() * _MAX_SHARE))


def _entries() -> list[tuple[float, int, str]]:
    return cache_files.entries(directory(), _SUFFIX)


def _evict(limit: int) -> None:
    """Least recently used entries go once the directory passes `limit` bytes."""
    entries = sorted(_entries())
    total = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if total <= limit:
            break
        if cache_files.remove(path):
            total -= size


def info() -> dict:
    """Where the AOTAutograd entries are, how many, how many bytes."""
    entries = _entries()
    return {"directory": directory(), "entries": len(entries),
            "bytes": sum(size for _, size, _ in entries)}


def clear() -> int:
    """Delete every entry; returns how many there were."""
    return sum(cache_files.remove(path) for _, _, path in _entries())


# ------------------------------------------------------------------ the scope
_depth = [0]


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """While our backend compiles: AOTAutograd bundles its result with our output code,
    compiles the backward right away (so the entry is complete and stored now, not at
    the first backward), and uses our key and storage. Restored on exit; nested uses
    share the outermost."""
    if _depth[0]:
        _depth[0] += 1
        try:
            yield
        finally:
            _depth[0] -= 1
        return
    from torch._functorch._aot_autograd import autograd_cache

    cache = autograd_cache.AOTAutogradCache
    _depth[0] = 1
    try:
        with _replaced(autograd_cache, "autograd_cache_key", _key), \
                _replaced(cache, "iterate_over_candidates", classmethod(_candidates)), \
                _replaced(cache, "_write_to_local_cache", staticmethod(_write)), \
                torch._functorch.config.patch(bundled_autograd_cache=True,
                                              force_non_lazy_backward_lowering=True):
            yield
    finally:
        _depth[0] = 0


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside (an inherited attribute is shadowed, then unshadowed)."""
    missing = object()
    own = vars(owner).get(name, missing)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, own)

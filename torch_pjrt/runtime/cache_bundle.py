"""The compile cache packed into one file, to ship to machines of the same platform and versions.

`export(path)` packs every entry under TORCH_PJRT_CACHE_DIR (the XLA programs of xla/, the
note of traced ops, torch.compile's AOTAutograd entries of aot/: each kind registered by
the module that owns it) with a manifest: the key of this machine and versions (what
compile_cache.platform_key() puts in every program's digest, with torch-pjrt's version and
Python's) and each file's checksum. `import_(path)` refuses the whole file, saying which
parts of the key differ, unless its key is this machine's; otherwise it checks every file
(a kind it knows, a plain relative path, the checksum the manifest gives, the entry's own
header) and writes it into this user's cache as the cache writes its own entries
(runtime/cache_files.py: atomically, 0600, in directories of this user's alone). Entries
the cache holds already are kept.

What a cache holds runs as code in every process that uses it (pickles, XLA executables):
import only files from a machine and a person you trust, as you would a wheel.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import cache_files, compile_cache, warm_start

FORMAT = "torch-pjrt compile cache 1"
MANIFEST = "manifest.json"
_MANIFEST_MAX_BYTES = 256 << 20


class Mismatch(RuntimeError):
    """A shipped cache made for other versions or another platform: not used."""


@dataclass(frozen=True)
class _Kind:
    folder: str  # under the cache root: "xla", "aot"
    suffix: str
    magic: bytes  # the header cache_files.write() gave the entries
    pattern: re.Pattern  # the entry's path under its folder


_kinds: dict[str, _Kind] = {}
_notes: dict[str, Callable[[bytes], int]] = {}  # path under the root -> merge(data) -> lines


def register_kind(folder: str, suffix: str, magic: bytes, pattern: str) -> None:
    """Entries of `folder` (files named by `pattern`, relative to it, written by
    cache_files.write() with `magic`) travel in shipped caches."""
    _kinds[folder] = _Kind(folder, suffix, magic, re.compile(pattern))


def register_note(path: str, merge: Callable[[bytes], int]) -> None:
    """The plain file at `path` (relative to the root) travels too; an import hands its
    content to merge(), which adds what this cache lacks (and returns how many lines)."""
    _notes[path] = merge


register_kind("xla", compile_cache.SUFFIX, compile_cache.MAGIC, r"[0-9a-f]{2}/[0-9a-f]{64}\.xc")
register_note(warm_start.NOTE, warm_start.merge)
register_note(warm_start.LAYOUTS.path, warm_start.LAYOUTS.merge)
register_note(warm_start.HOST.path, warm_start.HOST.merge)


def key(device_index: int = 0) -> dict[str, str]:
    """What a shipped cache must share with the machine that uses it."""
    from importlib import metadata

    from . import ensure_initialized

    ensure_initialized()  # (the layers above register their kinds of entries as they start)

    try:
        version = metadata.version("torch-pjrt")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {**compile_cache.platform_key(device_index), "torch_pjrt": version,
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


def differences(theirs: dict, ours: dict) -> list[str]:
    """'name: the cache's value, here this one' for each part of the key that differs."""
    return [f"{name}: the cache has {theirs.get(name, '(none)')!r}, this machine "
            f"{ours.get(name, '(none)')!r}" for name in sorted(set(theirs) | set(ours))
            if theirs.get(name) != ours.get(name)]


def _files() -> list[tuple[str, str, bytes | None]]:
    """(path under the root, absolute path, magic or None) of every file to ship."""
    root = compile_cache.root()
    out = []
    for kind in _kinds.values():
        folder = os.path.join(root, kind.folder)
        for _, _, path in sorted(cache_files.entries(folder, kind.suffix)):
            rel = os.path.relpath(path, root)
            if kind.pattern.fullmatch(os.path.relpath(path, folder)):
                out.append((rel, path, kind.magic))
    for rel in _notes:
        path = os.path.join(root, rel)
        if os.path.isfile(path):
            out.append((rel, path, None))
    return out


def export(path: str, device_index: int = 0) -> dict:
    """Pack the cache into `path` (a tar file; gzip-compressed where the name ends in .gz
    or .tgz). Returns {"files", "bytes", "skipped", "key"}; files that are damaged or not
    this user's are left out (and warned about, as when the cache reads them)."""
    here = key(device_index)
    root = compile_cache.root()
    if not compile_cache.enabled():
        raise RuntimeError(f"pjrt: the compile cache at {root} is off or refused: nothing to "
                           "export (TORCH_PJRT_COMPILE_CACHE, TORCH_PJRT_CACHE_DIR)")
    members, sums, skipped = [], {}, 0
    for rel, full, magic in _files():
        blob = cache_files.read(full, root, "entry", "disk_cache", None)
        if blob is None or (magic is not None and cache_files.unpack(blob, magic)[1]):
            skipped += 1
            continue
        members.append((rel, blob))
        sums[rel] = hashlib.sha256(blob).hexdigest()
    manifest = {"format": FORMAT, "key": here, "files": sums,
                "created": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    mode = "w:gz" if path.endswith((".gz", ".tgz")) else "w"
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with tarfile.open(tmp, mode) as tar:
            _add(tar, MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
            for rel, blob in members:
                _add(tar, rel, blob)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return {"files": len(members), "bytes": sum(len(b) for _, b in members),
            "skipped": skipped, "key": manifest["key"]}


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def read_manifest(path: str) -> dict:
    """The manifest of a shipped cache (ValueError where the file is not one)."""
    with tarfile.open(path, "r:*") as tar:
        return _manifest(tar, path)


def _manifest(tar: tarfile.TarFile, path: str) -> dict:
    try:
        member = tar.getmember(MANIFEST)
    except KeyError:
        raise ValueError(f"pjrt: {path} is not a torch-pjrt compile cache (no {MANIFEST}; "
                         "`python -m torch_pjrt cache export FILE` makes one)") from None
    if not member.isreg() or member.size > _MANIFEST_MAX_BYTES:
        raise ValueError(f"pjrt: {path}: its {MANIFEST} is not a plain file of at most "
                         f"{_MANIFEST_MAX_BYTES} bytes")
    try:
        manifest = json.loads(tar.extractfile(member).read())
    except ValueError as e:
        raise ValueError(f"pjrt: {path}: its {MANIFEST} does not parse ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("key"), dict) \
            or not isinstance(manifest.get("files"), dict):
        raise ValueError(f"pjrt: {path}: its {MANIFEST} is not of the format {FORMAT!r} "
                         f"(format {manifest.get('format')!r})" if isinstance(manifest, dict)
                         else f"pjrt: {path}: its {MANIFEST} is not an object")
    return manifest


def check(path: str, device_index: int = 0) -> dict:
    """The manifest of `path`, where it was made for this machine and versions; Mismatch
    (saying which parts of the key differ) otherwise."""
    manifest = read_manifest(path)
    diff = differences(manifest["key"], key(device_index))
    if diff:
        raise Mismatch(f"pjrt: the compile cache {path} was made for other versions or "
                       "another machine, and is not used: " + "; ".join(diff)
                       + ". Precompile on a machine like this one (docs/compile-cache.md).")
    return manifest


def _kind_of(rel: str) -> _Kind | None:
    folder, _, rest = rel.partition("/")
    kind = _kinds.get(folder)
    return kind if kind is not None and kind.pattern.fullmatch(rest) else None


def import_(path: str, device_index: int = 0) -> dict:
    """Unpack `path` into this user's cache. Returns counts: "added" (new entries),
    "present" (entries the cache had), "notes" (lines added to notes), "rejected" (files
    left out, with "reasons"). Mismatch, untouched cache, where the key differs."""
    manifest = check(path, device_index)
    root = compile_cache.root()
    if not compile_cache.enabled():
        raise RuntimeError(f"pjrt: the compile cache at {root} is off or refused: nothing "
                           "imported (TORCH_PJRT_COMPILE_CACHE, TORCH_PJRT_CACHE_DIR)")
    sums = manifest["files"]
    counts = {"added": 0, "present": 0, "notes": 0, "rejected": 0, "reasons": []}
    seen = set()

    def reject(name: str, why: str) -> None:
        counts["rejected"] += 1
        counts["reasons"].append(f"{name}: {why}")

    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            name = member.name
            if name == MANIFEST:
                continue
            kind = _kind_of(name)
            if kind is None and name not in _notes:
                reject(name, "not a file of the compile cache")
                continue
            if not member.isreg():
                reject(name, "not a plain file")
                continue
            if name not in sums or name in seen:
                reject(name, "not in the manifest" if name not in sums else "twice in the file")
                continue
            seen.add(name)
            blob = tar.extractfile(member).read()
            if hashlib.sha256(blob).hexdigest() != sums[name]:
                reject(name, "its checksum is not the manifest's")
                continue
            if kind is None:
                counts["notes"] += _notes[name](blob)
                continue
            if cache_files.unpack(blob, kind.magic)[1] is not None:
                reject(name, f"damaged ({cache_files.unpack(blob, kind.magic)[1]})")
                continue
            dest = os.path.join(root, name)
            if os.path.exists(dest):
                counts["present"] += 1
            elif cache_files.replace(dest, root, blob):
                counts["added"] += 1
            else:
                reject(name, "could not be written")
    for name in sums.keys() - seen:
        reject(name, "listed in the manifest, missing from the file")
    compile_cache.forget_size()
    return counts

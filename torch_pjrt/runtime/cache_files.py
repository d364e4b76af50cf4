"""The disk cache's files: the user's alone, checked when read, written whole or not at all.

What lies under TORCH_PJRT_CACHE_DIR is code to every process that reads it (pickles,
XLA executables), and the cache must never crash a program:

- directories are created 0700 and files 0600; a directory or file that another user
  owns or that others can write is refused (TORCH_PJRT_CACHE_SHARED=1 accepts them);
- entries carry a magic, their length and a checksum; whatever cannot be read, checked
  or loaded is a miss: it is removed, and compiled (or noted) again;
- a write goes to a temporary file renamed into place; a read-only or full file system
  stops this process's writes, and the program runs on without them.

Each kind of fault warns once per process (CacheWarning) and is counted in
torch_pjrt.metrics().
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import warnings

from .. import _env, counters


class CacheWarning(RuntimeWarning):
    """A fault of the disk cache that the program survived (shown once per kind)."""


class Refused(PermissionError):
    """A directory of the cache that is not this user's alone (already warned about)."""


_HEADER = struct.Struct("<8sQ32s")  # magic, payload length, sha256 of payload
TEMP_SUFFIX = ".tmp"
_STALE_TEMP_SECONDS = 3600  # a temporary file this old lost its writer (a killed process)
# Errors of the file system as a whole: no later write of this process would fare better.
_DISK_ERRORS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM})

_warned: set[tuple[str, str]] = set()
_roots: dict[str, str | None] = {}  # a cache root -> why it is refused (None: it is used)
_trusted_dirs: set[str] = set()  # directories found trusted in this process
_no_writes: dict[str, str] = {}  # a cache root -> why this process stopped writing there
_no_writes_lock = threading.Lock()  # (compile threads write side by side)


def shared() -> bool:
    return _env.flag("TORCH_PJRT_CACHE_SHARED")


def warn_once(kind: str, what: str, message: str) -> None:
    if (kind, what) in _warned:
        return
    _warned.add((kind, what))
    warnings.warn(message + " (shown once per process)", CacheWarning, stacklevel=3)


def untrusted(st: os.stat_result, allow_shared: bool = True) -> str | None:
    """Why a file or directory of this status must not be used (None: it may be)."""
    if allow_shared and shared():
        return None
    if st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.filemode(st.st_mode)})"
    return None


@functools.cache
def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _dir_mode() -> int:
    return 0o777 if shared() else 0o700  # os.mkdir applies the umask


def _file_mode() -> int:
    return (0o666 & ~_umask()) if shared() else 0o600


# ------------------------------------------------------------------ directories
def usable(root: str) -> bool:
    """Whether the cache under `root` may be used: created for this user alone where
    missing; refused (one warning, the process runs without the disk cache) where it
    cannot be created, is not a directory, or another user owns it or others can write it."""
    try:
        return _roots[root] is None
    except KeyError:
        pass
    try:
        _makedirs(root, _dir_mode())
        st = os.stat(root)
        reason = "is not a directory" if not stat.S_ISDIR(st.st_mode) else _refusal(root, st)
    except OSError as e:
        reason = f"cannot be created ({e.strerror})"
    _roots[root] = reason
    if reason is None:
        _trusted_dirs.add(root)
    else:
        counters.count("disk_cache_refused")
        warn_once("off", root, f"pjrt: running without the disk compile cache: {root} {reason}, "
                  "and what it holds is run as code (TORCH_PJRT_CACHE_SHARED=1 accepts a "
                  "cache shared on purpose, see docs/reliability.md)")
    return reason is None


def _refusal(path: str, st: os.stat_result, allow_shared: bool = True) -> str | None:
    """untrusted(), said of `path`, with the fix where the user owns it."""
    reason = untrusted(st, allow_shared)
    if reason is None:
        return None
    if st.st_uid == os.geteuid():  # made writable by a umask of 002, say
        return f"is {reason} (`chmod -R go-w {path}` makes it private)"
    return f"is {reason}"


def _makedirs(path: str, mode: int) -> None:
    """os.makedirs, with `mode` for every level it creates (not the leaf alone)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        _makedirs(parent, mode)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass


def private_dir(path: str, root: str) -> str | None:
    """`path` created for this user alone (each missing level from `root` down) and
    checked: why it must not be used, where a level from `root` down is another user's or
    writable by others (None: it may be used). TORCH_PJRT_CACHE_SHARED does not apply."""
    try:
        _makedirs(path, 0o700)
        while True:
            reason = _refusal(path, os.stat(path), allow_shared=False)
            if reason:
                return f"{path} {reason}"
            if len(path) <= len(root):
                return None
            path = os.path.dirname(path)
    except OSError as e:
        return f"{path} cannot be created ({e.strerror})"


def private_file(path: str) -> str | None:
    """Why the file at `path` is not this user's alone (None: it is)."""
    reason = _refusal(path, os.lstat(path), allow_shared=False)
    return reason and f"{path} {reason}"


def _check_dirs(path: str, root: str) -> str | None:
    """Why a directory from `root` down to `path` must not be used (None: none)."""
    while path not in _trusted_dirs:
        if len(path) <= len(root):
            return None if usable(root) else f"{root} is refused"
        try:
            st = os.lstat(path)
        except OSError as e:
            return f"{path}: {e.strerror}"
        reason = "not a directory" if not stat.S_ISDIR(st.st_mode) else untrusted(st)
        if reason:
            return f"{path} is {reason}"
        _trusted_dirs.add(path)
        path = os.path.dirname(path)
    return None


def make_dirs(path: str, root: str) -> None:
    """`path` and the directories above it down from `root`, created for this user alone;
    a file where a directory belongs is removed. OSError where that fails."""
    if path in _trusted_dirs:
        return
    if len(path) > len(root):
        make_dirs(os.path.dirname(path), root)
        try:
            os.mkdir(path, _dir_mode())
        except FileExistsError:
            if not os.path.isdir(path) or os.path.islink(path):
                remove(path)  # damage: a file (or a link) in a directory's place
                os.mkdir(path, _dir_mode())
    reason = _check_dirs(path, root)
    if reason:
        refused(path, "directory", "disk_cache", reason)
        raise Refused(errno.EACCES, reason, path)


# ------------------------------------------------------------------ reading
def read(path: str, root: str, what: str, counter: str, magic: bytes | None = None
         ) -> bytes | None:
    """The bytes stored at `path` (the payload, checked, where `magic` is given: then it
    was written by write() with that magic), or None where there is nothing to use:
    missing (a plain miss), refused (not this user's, or others can write it: one
    warning, left alone), or damaged (unreadable, not a file, cut short, a bad checksum:
    one warning, removed). `what` names the file in the warning; `counter` prefixes
    the counters (`<counter>_corrupt`, `<counter>_refused`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # a missing directory: made at write
        return None
    except OSError as e:
        damaged(path, what, counter, e.strerror or str(e))
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            damaged(path, what, counter, "not a regular file")
            return None
        reason = untrusted(st)
        reason = f"it is {reason}" if reason else _check_dirs(os.path.dirname(path), root)
        if reason:
            refused(path, what, counter, reason)
            return None
        blob = _read_all(fd, st.st_size)
    except OSError as e:
        damaged(path, what, counter, e.strerror or str(e))
        return None
    finally:
        os.close(fd)
    if magic is None:
        return blob
    payload, reason = unpack(blob, magic)
    if reason is not None:
        damaged(path, what, counter, reason)
    return payload


def unpack(blob: bytes, magic: bytes) -> tuple[bytes | None, str | None]:
    """(the payload of a file write() wrote with `magic`, None), or (None, what is wrong
    with it)."""
    if len(blob) < _HEADER.size:
        return None, f"cut short at {len(blob)} bytes"
    found, length, checksum = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size:]
    if found != magic:
        return None, "not an entry of this kind"
    if length != len(payload):
        return None, f"{len(payload)} bytes of {length}"
    if hashlib.sha256(payload).digest() != checksum:
        return None, "bad checksum"
    return payload, None


def _read_all(fd: int, size: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, max(size, 1 << 16))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def damaged(path: str, what: str, counter: str, reason: str, keep: bool = False) -> None:
    """A damaged file: counted, warned about once, removed unless `keep` (the caller
    rewrites it)."""
    counters.count(f"{counter}_corrupt")
    warn_once("damaged", what, f"pjrt: the disk cache's {what} {path} was damaged ({reason}); "
              f"{'' if keep else 'removed, and '}rebuilt. torch_pjrt.metrics()"
              f"['{counter}_corrupt'] counts them")
    if not keep:
        remove(path)


def refused(path: str, what: str, counter: str, reason: str) -> None:
    """A file that is not this user's alone: counted, warned about once, not used."""
    counters.count(f"{counter}_refused")
    warn_once("refused", "", f"pjrt: the disk cache's {what} {path} is not used: {reason}, "
              "and what it holds would run as code in this process "
              "(TORCH_PJRT_CACHE_SHARED=1 accepts a cache shared on purpose)")


# ------------------------------------------------------------------ writing
def write(path: str, root: str, magic: bytes, payload: bytes) -> bool:
    """`payload` stored at `path` under a header (magic, length, checksum) for read()."""
    header = _HEADER.pack(magic, len(payload), hashlib.sha256(payload).digest())
    return replace(path, root, header + payload)


def replace(path: str, root: str, data: bytes) -> bool:
    """`data` at `path`, whole or not at all (a temporary file renamed into place); False
    where it could not be written (see _write_failed)."""
    if root in _no_writes:
        return False
    tmp = None
    try:
        folder = os.path.dirname(path)
        fd, tmp = _in_dir(folder, root,
                          lambda: tempfile.mkstemp(dir=folder, suffix=TEMP_SUFFIX))
        try:
            if shared():
                os.fchmod(fd, _file_mode())
            _write_all(fd, data)
        finally:
            os.close(fd)
        if os.path.isdir(path) and not os.path.islink(path):
            remove(path)  # damage: a directory in the entry's place
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        _write_failed(path, root, e)
        return False
    finally:
        if tmp is not None:
            remove(tmp)
    return True


def _in_dir(folder: str, root: str, create):
    """create() once `folder` exists (made again if it was removed meanwhile, as by
    `rm -rf` of the cache while this process runs)."""
    try:
        make_dirs(folder, root)
        return create()
    except FileNotFoundError:
        _trusted_dirs.clear()
        _roots.pop(root, None)
        if not usable(root):
            raise
        make_dirs(folder, root)
        return create()


def append(path: str, root: str, data: bytes, max_bytes: int) -> None:
    """`data` appended to `path` in one write (atomic with O_APPEND, so several processes
    may append); the file starts over once it holds more than max_bytes."""
    if root in _no_writes:
        return
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = _in_dir(os.path.dirname(path), root, lambda: os.open(path, flags, _file_mode()))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or untrusted(st):
                return  # read() refused it already, and told
            if st.st_size > max_bytes:
                os.ftruncate(fd, 0)
            _write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as e:
        _write_failed(path, root, e)


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to `fd`: the one place the cache writes (tests make it fail)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_failed(path: str, root: str, e: OSError) -> None:
    if isinstance(e, Refused):
        return  # not an error of the disk, and warned about
    if e.errno in _DISK_ERRORS:
        # One error however many writes were in flight when the disk filled: compile
        # threads write side by side, and a second one failing at the same moment is the
        # same full (or read-only) disk, not another error.
        with _no_writes_lock:
            first = root not in _no_writes
            _no_writes.setdefault(root, e.strerror or str(e))
        if first:
            counters.count("disk_cache_write_errors")
            warn_once("write", root, f"pjrt: the disk cache at {root} cannot be written "
                      f"({e.strerror or e}); this process runs on without writing to it")
        return
    counters.count("disk_cache_write_errors")
    warn_once("write", path, f"pjrt: {path} could not be written to the disk cache ({e}); "
              "it is compiled again by the next process")


def writable(root: str) -> bool:
    """Whether this process still writes to the cache under `root`."""
    return root not in _no_writes


# ------------------------------------------------------------------ listing
def entries(directory: str, suffix: str) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of every `suffix` file under `directory`; temporary files whose
    writer died long ago (killed while writing) are removed on the way."""
    out = []
    stale = time.time() - _STALE_TEMP_SECONDS
    for dirpath, _, filenames in os.walk(directory):
        for name in filenames:
            if not name.endswith((suffix, TEMP_SUFFIX)):
                continue
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if name.endswith(suffix):
                out.append((st.st_mtime, st.st_size, path))
            elif st.st_mtime < stale:
                remove(path)
    return out


def remove(path: str) -> bool:
    """Remove a file, or a directory tree standing where a file belongs."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
        return True
    except OSError:
        return False



def forget() -> None:
    """Forget what this process learnt about cache directories (their checks, stopped
    writes, warnings given): for tests, and after the cache directory changed."""
    _roots.clear()
    _trusted_dirs.clear()
    _no_writes.clear()
    _warned.clear()

"""Faults in the disk cache's files, in this process: every kind of file the cache reads
(XLA programs, AOTAutograd entries, the note of traced ops) cut short, bit-flipped,
emptied, replaced by a directory or made unreadable is a miss that is rebuilt, with at
most one warning, never an error; a full or read-only file system stops the writes."""

import errno
import hashlib
import os
import pickle
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_pjrt import counters
from torch_pjrt.compile import warm
from torch_pjrt.runtime import cache_files, compile_cache, warm_start
from torch_pjrt.runtime.cache_files import CacheWarning

FAULTS = ["truncated", "bit_flipped", "emptied", "directory", "unreadable"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory for this process, and a clean slate of what the cache
    learnt about directories and warnings (before and after)."""
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(warm_start, "_traced", None)
    cache_files.forget()
    yield tmp_path
    cache_files.forget()


def damage(path, fault, monkeypatch):
    """Apply `fault` to the file at `path`; returns what makes files readable again."""
    if fault == "truncated":
        os.truncate(path, os.path.getsize(path) // 2)
    elif fault == "bit_flipped":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0x80]))
    elif fault == "emptied":
        os.truncate(path, 0)
    elif fault == "directory":
        os.remove(path)
        os.makedirs(os.path.join(path, "inside"))
    elif fault == "unreadable":
        os.chmod(path, 0)
        if os.geteuid() == 0:  # root reads a file of mode 0 all the same: refuse it here
            real_open = os.open

            def refusing(p, flags, *args, **kwargs):
                if os.fspath(p) == path and not flags & (os.O_WRONLY | os.O_RDWR):
                    raise PermissionError(errno.EACCES, "Permission denied", p)
                return real_open(p, flags, *args, **kwargs)

            monkeypatch.setattr(os, "open", refusing)
            return lambda: monkeypatch.setattr(os, "open", real_open)
    else:
        raise ValueError(fault)
    return lambda: None


def _name(text):
    return hashlib.sha256(text.encode()).hexdigest()


def _program(name, k):
    """A program compiled through the cache under `name`, run: x * k + 1."""
    x = jnp.arange(4.0)
    run = compile_cache.compile(jax.jit(lambda a: a * k + 1), (x,), name, 0)
    return np.asarray(run(x))


def _cache_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


@pytest.mark.parametrize("fault", FAULTS)
def test_damaged_program_is_compiled_again(cache, monkeypatch, fault):
    name = _name(f"program {fault}")
    np.testing.assert_array_equal(_program(name, 3), [1, 4, 7, 10])
    (path,) = [e[2] for e in compile_cache._entries()]
    readable = damage(path, fault, monkeypatch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(_program(name, 3), [1, 4, 7, 10])
    assert len(_cache_warnings(record)) == 1, _cache_warnings(record)
    assert "damaged" in _cache_warnings(record)[0] and path in _cache_warnings(record)[0]
    assert counters.value("disk_cache_corrupt") == 1
    assert counters.value("disk_cache_writes") == 2  # rewritten
    readable()
    hits = counters.value("disk_cache_hits")
    np.testing.assert_array_equal(_program(name, 3), [1, 4, 7, 10])
    assert counters.value("disk_cache_hits") == hits + 1  # the rebuilt entry is good


def _aot_lookup(key):
    return [entry for entry, _, _ in warm._candidates(None, True, None, key)]


@pytest.mark.parametrize("fault", FAULTS)
def test_damaged_aot_entry_is_compiled_again(cache, monkeypatch, fault):
    key = "pjrt" + _name(f"aot {fault}")
    entry = {"graph": list(range(100))}
    warm._write(key, pickle.dumps(entry))
    assert _aot_lookup(key) == [entry]
    (path,) = [e[2] for e in warm._entries()]
    readable = damage(path, fault, monkeypatch)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _aot_lookup(key) == []  # a miss: AOTAutograd compiles and stores it again
    assert len(_cache_warnings(record)) == 1, _cache_warnings(record)
    assert counters.value("aot_cache_corrupt") == 1
    readable()
    warm._write(key, pickle.dumps(entry))
    assert _aot_lookup(key) == [entry]


@pytest.mark.parametrize("fault", FAULTS)
def test_damaged_note_of_traced_ops_is_rebuilt(cache, monkeypatch, fault):
    """The note that crashed every later op with UnicodeDecodeError when it held bytes
    that are not UTF-8."""
    names = [_name(f"op {i}") for i in range(20)]
    for name in names:
        warm_start.note_traced(name, False)
    path = warm_start._file(warm_start._TRACED_FILE)
    readable = damage(path, fault, monkeypatch)
    warm_start._traced = None  # as a new process
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        known = [warm_start.traced_before(name) for name in names]
    # lines lost are traced again; an empty or cut note is a shorter note (nothing to say)
    assert len(_cache_warnings(record)) == (fault in ("bit_flipped", "directory",
                                                      "unreadable")), _cache_warnings(record)
    assert all(known[:5]) == (fault in ("truncated", "bit_flipped"))
    assert not all(known)
    readable()
    for name in names:
        warm_start.note_traced(name, False)  # the ones this process traced again
    warm_start._traced = None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert all(warm_start.traced_before(name) for name in names)
    assert _cache_warnings(record) == []


def test_note_of_traced_ops_with_bytes_that_are_not_utf8(cache):
    """The reported crash: a torn write left bytes that are not UTF-8 in the note."""
    name = _name("op")
    warm_start.note_traced(name, False)
    path = warm_start._file(warm_start._TRACED_FILE)
    with open(path, "ab") as f:
        f.write(b"\xff\xfe\x00\x80garbage\n")
    warm_start._traced = None
    with pytest.warns(CacheWarning, match="not digests"):
        assert warm_start.traced_before(name)
    with open(path, "rb") as f:
        assert f.read() == name.encode() + b"\n"  # rewritten with its good lines


def test_a_directory_where_a_directory_of_entries_belongs_is_a_file(cache):
    name = _name("program in a blocked directory")
    folder = os.path.join(compile_cache.directory(), name[:2])
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(folder, "w") as f:
        f.write("not a directory")
    np.testing.assert_array_equal(_program(name, 2), [1, 3, 5, 7])
    assert os.path.isdir(folder) and counters.value("disk_cache_writes") == 1


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_full_or_read_only_file_system_stops_the_writes(cache, monkeypatch, error):
    """A full disk (or a read-only one) fails the cache's one write function: the program
    runs on, compiled in memory, with one warning; nothing half-written is left."""

    def failing(fd, data):
        os.write(fd, data[: len(data) // 3])  # a part fits, then the disk is full
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(cache_files, "_write_all", failing)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for k in range(4):
            np.testing.assert_array_equal(_program(_name(f"full {error} {k}"), k),
                                          np.arange(4.0) * k + 1)
            warm_start.note_traced(_name(f"traced {error} {k}"), False)
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "cannot be written" in messages[0], messages
    assert counters.value("disk_cache_write_errors") == 1  # then no more tries
    assert [f for _, _, fs in os.walk(cache) for f in fs] == []  # no partial file


def test_writes_failing_side_by_side_on_a_full_disk_are_one_error(cache, monkeypatch):
    """Compile threads write side by side: two writes in flight when the disk fills fail
    together, and that is one error, one warning (a CI run saw two counted)."""
    both_writing = threading.Barrier(2, timeout=30)

    def failing(fd, data):
        both_writing.wait()  # (both writes have started before either fails)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache_files, "_write_all", failing)
    root = compile_cache.root()
    paths = [os.path.join(cache, "xla", "ab", f"entry{k}.xc") for k in range(2)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=cache_files.write,
                                    args=(p, root, compile_cache.MAGIC, b"x"))
                   for p in paths]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert counters.value("disk_cache_write_errors") == 1
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "cannot be written" in messages[0], messages
    assert not cache_files.writable(root)


def test_stale_temporary_files_of_killed_writers_are_removed(cache):
    _program(_name("kept"), 1)
    folder = os.path.dirname(compile_cache._entries()[0][2])
    fresh, stale = os.path.join(folder, "a.tmp"), os.path.join(folder, "b.tmp")
    for path in (fresh, stale):
        with open(path, "wb") as f:
            f.write(b"half an entry")
    os.utime(stale, (1, 1))
    assert len(compile_cache._entries()) == 1
    assert os.path.exists(fresh) and not os.path.exists(stale)  # fresh: a writer may be at it

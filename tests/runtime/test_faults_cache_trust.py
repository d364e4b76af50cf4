"""The cache holds code: its directories are the user's alone (0700, files 0600), and a
directory or entry that another user owns or others can write is refused (one warning,
a run without it) unless TORCH_PJRT_CACHE_SHARED=1. (The native extension is built at
install time into the package: no run-time build directory is left to check,
tests/runtime/test_native.py.)"""

import hashlib
import os
import pickle
import stat
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_pjrt import counters
from torch_pjrt.compile import warm
from torch_pjrt.runtime import cache_files, compile_cache, warm_start
from torch_pjrt.runtime.cache_files import CacheWarning

OTHER_UID = 4242  # a user that is not this one


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCH_PJRT_CACHE_SHARED", raising=False)
    monkeypatch.setattr(warm_start, "_traced", None)
    cache_files.forget()
    yield tmp_path / "cache"
    cache_files.forget()


def _chown_other(path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(path, OTHER_UID, -1)


def _program(tag, k=3):
    name = hashlib.sha256(tag.encode()).hexdigest()
    x = jnp.arange(4.0)
    run = compile_cache.compile(jax.jit(lambda a: a * k + 1), (x,), name, 0)
    np.testing.assert_array_equal(np.asarray(run(x)), np.arange(4.0) * k + 1)
    return compile_cache._path(name)


def _caught(fn):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


class Marker:
    """An entry that runs code when unpickled, as a crafted one would."""

    path = None

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_directories_are_created_0700_and_files_0600(cache, tmp_path):
    old = os.umask(0)  # the most permissive umask: the modes must not depend on it
    try:
        _program("modes")
        warm_start.note_traced("a" * 64, False)
        warm._write("pjrtkey", pickle.dumps([1, 2]))
    finally:
        os.umask(old)
    for dirpath, _, filenames in os.walk(cache):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o700, dirpath
        for name in filenames:
            path = os.path.join(dirpath, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert sum(len(f) for _, _, f in os.walk(cache)) == 3


@pytest.mark.parametrize("how", ["other_owner", "group_writable", "world_writable"])
def test_a_cache_directory_not_the_users_alone_is_not_used(cache, how):
    cache.mkdir(mode=0o700)
    if how == "other_owner":
        _chown_other(cache)
    else:
        os.chmod(cache, 0o770 if how == "group_writable" else 0o777)
    warned = _caught(lambda: [_program("refused dir"), _program("refused dir", 5)])
    assert len(warned) == 1 and "running without the disk compile cache" in warned[0], warned
    assert ("chmod -R go-w" in warned[0]) == (how != "other_owner")  # the fix, if the user's
    assert not compile_cache.enabled() and not warm.enabled()
    assert os.listdir(cache) == []  # nothing read or written there
    assert counters.value("disk_cache_writes") == 0


def test_shared_cache_is_used_when_named_shared(cache, monkeypatch):
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    monkeypatch.setenv("TORCH_PJRT_CACHE_SHARED", "1")
    path = _program("shared")
    if os.geteuid() == 0:
        os.chown(path, OTHER_UID, -1)  # an entry a teammate wrote
    warned = _caught(lambda: _program("shared"))
    assert warned == [] and counters.value("disk_cache_hits") == 1


@pytest.mark.parametrize("how", ["other_owner", "group_writable"])
def test_an_entry_not_the_users_alone_is_not_loaded(cache, how):
    path = _program("entry")
    if how == "other_owner":
        _chown_other(path)
    else:
        os.chmod(path, 0o620)
    warned = _caught(lambda: _program("entry"))
    assert len(warned) == 1 and "is not used" in warned[0], warned
    assert counters.value("disk_cache_refused") == 1 and counters.value("disk_cache_hits") == 0
    st = os.stat(path)  # compiled again, and replaced by the user's own
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert _caught(lambda: _program("entry")) == [] and counters.value("disk_cache_hits") == 1


def test_an_aot_entry_of_another_user_is_never_unpickled(cache, tmp_path):
    marker = tmp_path / "ran"
    Marker.path = str(marker)
    warm._write("pjrtkey", pickle.dumps(Marker()))
    list(warm._candidates(None, True, None, "pjrtkey"))
    assert marker.exists()  # an entry runs code when it is unpickled
    marker.unlink()
    (path,) = [e[2] for e in warm._entries()]
    _chown_other(path)
    warned = _caught(lambda: list(warm._candidates(None, True, None, "pjrtkey")))
    assert len(warned) == 1 and "is not used" in warned[0], warned
    assert not marker.exists()


def test_a_directory_of_entries_others_can_write_is_not_used(cache):
    path = _program("subdirectory")
    os.chmod(os.path.dirname(path), 0o777)
    cache_files.forget()  # as a new process
    warned = _caught(lambda: _program("subdirectory"))
    assert len(warned) == 1 and "writable by others" in warned[0], warned
    assert counters.value("disk_cache_hits") == 0

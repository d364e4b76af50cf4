"""PyTorch's own device-generic tests on `pjrt` (and the same tests on the CPU), one process a file.

    python tools/pytorch_tests.py --pytorch-test-dir DIR [FILES] [--report docs/pytorch-tests.md]

DIR holds PyTorch's `test/` files of the installed torch (they are not in the wheel and are
never copied into this repository: docs/pytorch-tests.md says which files, at which commit,
and how to assemble them). Each file runs in a worker process (this script with --worker)
that instantiates the file's device-generic classes for one device
(PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1, or cpu) and writes a line per test. This
process watches it: a test past --timeout or a worker past --max-rss is killed, a worker that
dies (segfault, abort) marks its test crashed, and a new worker goes on after that test.
Known failures (tools/pytorch_tests_known.py) are run and reported apart, or not run where
their entry says so (a crash, a hang).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import unittest
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

# Per file: which tests count (a regular expression on the test's id, None: all) and how many
# to run at most, picked by a stable hash of the id (None: all). The big files are sampled so
# that a full run stays within a few hours on a 2-core machine.
FILES: dict[str, dict] = {
    "test_view_ops.py": {},
    "test_shape_ops.py": {},
    "test_indexing.py": {},
    "test_tensor_creation_ops.py": {},
    "test_unary_ufuncs.py": {"sample": 600},
    "test_binary_ufuncs.py": {"sample": 600},
    "test_reductions.py": {"sample": 600},
    "test_sort_and_select.py": {},
    "test_type_promotion.py": {},
    "test_nn.py": {"match": r"^TestNNDeviceType\.", "sample": 400},
    # the whole of TestTorchDeviceType (its device-only skips take no time)
    "test_torch.py": {"match": r"^TestTorchDeviceType\."},
    "test_autograd.py": {"match": r"^TestAutogradDeviceType\.", "sample": 300},
    # test_ops: float32 and int64 (15,621 of its 35,348 tests); 251 of the 800 sampled are
    # PyTorch's device-only skips (onlyCPU, onlyCUDA, onlyOn...), which take no time; the
    # rest took about 2,400 s on pjrt on the loaded 2-core machine (two budgets' worth)
    "test_ops.py": {"match": r"_(float32|int64)$", "sample": 800},
}
# Where each file of the runs came from: (pytorch/pytorch commit, characters, where it was
# read). torch 2.13.0's own commit (torch.version.git_version cf30153c4c13...) is not among
# the stored versions; these are the versions stored, each read whole and its length checked.
_INDEX = "the search tool's index of pytorch/pytorch (read_file, 16,000 characters a page)"
_FORK = ("the search tool's index of the fork maggiemoss/pytorch (read_file, 16,000 characters "
         "a page)")
SOURCES: dict[str, tuple[str, int, str]] = {
    "test_shape_ops.py": ("00972c015f0846e856f3fb8d46de73804a55a4de", 35524, _INDEX),
    "test_indexing.py": ("017943b70f6920c395e3b6dac100e2cd7ecfa92a", 98599, _INDEX),
    "test_view_ops.py": ("9c491bc34c6ab131b18cf51db02636d65ffd3472", 80417, _INDEX),
    "test_sort_and_select.py": ("6f3cff94d27f4f2e6ea43523525c8353730e1414", 53360, _INDEX),
    # the index's only stored version is from 2020 (it imports onlyOnCPUAndCUDA, which torch
    # 2.13 no longer has); this one is upstream's of March 2023, as the fork
    # yakov-helm/pytorch_exp carries it (`fetch`, then `git show COMMIT:test/FILE`)
    "test_type_promotion.py": ("47dca20d800310b03c24c1ccd5fa6b9c7cae034c", 56098,
                               "the upstream history in the fork yakov-helm/pytorch_exp"),
    # the index's pytorch/pytorch copy of test_unary_ufuncs.py is from 2020 (torch._six,
    # onlyOnCPUAndCUDA: it does not import on torch 2.13) and its test_reductions.py predates
    # upstream's 2024-25 reformatting; these are upstream's as the fork maggiemoss/pytorch
    # carries them, one commit for all, from September 2025 or later (they cite PyTorch issue
    # 162473), the closest to 2.13 stored whole (a newer copy, in laurentdupin/pytorch, holds
    # merge-conflict markers)
    "test_unary_ufuncs.py": ("4b78f85938a63c12719f266324b57ffe9f3b7581", 78304, _FORK),
    "test_reductions.py": ("4b78f85938a63c12719f266324b57ffe9f3b7581", 194481, _FORK),
    "test_tensor_creation_ops.py": ("4b78f85938a63c12719f266324b57ffe9f3b7581", 215487, _FORK),
    # not stored for maggiemoss/pytorch; ROCm/pytorch's newer copy holds merge-conflict
    # markers and the index's pytorch/pytorch one is older (139,786 characters): the fork
    # cekkr/pytorch's (upstream of 2024-25, torch.TensorBase)
    "test_binary_ufuncs.py": ("accb4cefae16adabe776855c71867fdc8c1de85d", 180212,
                              "the search tool's index of the fork cekkr/pytorch (read_file, "
                              "16,000 characters a page)"),
    # the index's pytorch/pytorch copy is older (79,557 characters), cekkr/pytorch's is garbled
    # (stray `Tensor` words: it does not parse) and Ultron09/pytorch's newer one imports
    # common_utils.HardwareClassification, which torch 2.13 lacks: upstream's as
    # the fork Lord-Melflam/pytorch carries it (its skip/xfail/skipOps imports: RENAMED)
    # an excerpt (the file is 565,198 characters, 36 pages, and imports test-directory helpers,
    # autograd/test_complex.py... which the wheel lacks): its characters [0, 2650) (imports,
    # graph_desc), [423070, 464096) (the class TestAutogradDeviceType, whole, from its
    # "# Generic device type autograd tests." line) and its instantiate_device_type_tests line
    # for that class (with the comment above it) and the __main__ block, from the fork
    # maggiemoss/pytorch (pytorch/pytorch's stored copy is from 2020, 274,013 characters:
    # it imports torch._six, which torch 2.13 lacks)
    "test_autograd.py": ("eb4247c60570b3bd9f6404efae673f748ea0a5ea", 43869,
                         "an excerpt of the fork maggiemoss/pytorch's copy (read_file, 16,000 "
                         "characters a page): see the comment in SOURCES"),
    # excerpts too (test_nn.py is 718,971 characters, test_torch.py 496,100): test_nn.py's
    # characters [0, 3556) (imports) and [408803, 714871) (the test_affine helpers and the whole
    # class TestNNDeviceType, up to the class TestFunctionalPickle), then its
    # instantiate_device_type_tests line and its __main__ block (without the
    # instantiate_parametrized_tests(TestNN) line between them, TestNN being left out: 170
    # characters); test_torch.py's [0, 295249) (imports, the two vital-sign classes and the
    # whole of TestTorchDeviceType, 289,936 characters from 5313; its
    # check_nondeterministic_alert is common_utils.TestCase's), then its file's
    # instantiate_device_type_tests(TestTorchDeviceType, ...) line and __main__ block
    "test_nn.py": ("4b78f85938a63c12719f266324b57ffe9f3b7581", 309794,
                   "an excerpt of the fork maggiemoss/pytorch's copy (read_file, 16,000 "
                   "characters a page): see the comment in SOURCES"),
    "test_torch.py": ("4b78f85938a63c12719f266324b57ffe9f3b7581", 295406,
                      "an excerpt of the fork maggiemoss/pytorch's copy (read_file, 16,000 "
                      "characters a page): see the comment in SOURCES"),
    "test_ops.py": ("26f0db325cdb64dc0972ee2aa167df8fac18ffc7", 129253,
                    "the search tool's index of the fork Lord-Melflam/pytorch (read_file, "
                    "16,000 characters a page)"),
}
# Each run's counts per file (--history), oldest first: the report's before/after table.
HISTORY = ROOT / "docs" / "pytorch-tests-history.json"
# CI's slice (tests/test_pytorch_suites.py): the smaller files, and a sample of test_ops.
CI_SLICE = {"test_shape_ops.py": 60, "test_view_ops.py": 60, "test_ops.py": 40}

# The skips PyTorch's device-type decorators raise because of the device alone (onlyCPU,
# onlyCUDA, onlyOn, onlyNativeDeviceTypes, onlyAccelerator, deviceCountAtLeast,
# skipPRIVATEUSE1...: common_device_type's own messages). A test skipped on pjrt with one of
# them is not a pjrt result: it leaves the rate's denominator and is counted in its own column
# (unless the known list names it: those count as they are).
DEVICE_ONLY_SKIPS = re.compile(
    r"^(Only runs on |onlyNativeDeviceTypes(And)?\b|onlyAccelerator: |onlyCUDAAndPRIVATEUSE1: "
    r"|fewer than \d+ devices detected|Skip as torch has no module of "
    r"|test doesn't work on privateuse1 backend)")

DEVICE_SUFFIX = re.compile(r"_(privateuse1|pjrt|cpu)(?=(_|$))")
CLASS_SUFFIX = re.compile(r"(PRIVATEUSE1|PJRT|CPU)$")


def normalize(test_id: str) -> str:
    """`TestFooPRIVATEUSE1.test_bar_privateuse1_float32` -> `TestFoo.test_bar_float32`."""
    cls, _, name = test_id.rpartition(".")
    cls = CLASS_SUFFIX.sub("", cls.rpartition(".")[2] if "." in cls else cls)
    return f"{cls}.{DEVICE_SUFFIX.sub('', name, count=1)}"


# ---------------------------------------------------------------- worker (one file, one device)

class _LineResult(unittest.TestResult):
    """Writes a JSON line as each test starts and ends, flushed, for the watching process."""

    def __init__(self, out):
        super().__init__()
        self.out = out
        self.t0 = 0.0

    def _write(self, **record) -> None:
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def startTest(self, test):
        super().startTest(test)
        self.t0 = time.perf_counter()
        self._write(start=test.id())

    def _end(self, test, outcome, err=None, reason=""):
        message = reason
        pending = _pending_device_error()
        if pending and outcome in ("passed", "skipped"):
            # a device-side error the test's calls left for the next synchronization (as a
            # CUDA device assert): the test's own, not the next test's
            outcome, err = "failed", None
            message = f"a device-side error pending after the test: {pending}"[:300]
        if err is not None:
            etype, value, _ = err
            text = str(value).strip().splitlines()
            message = f"{etype.__name__}: {text[0] if text else ''}"[:300]
        self._write(id=test.id(), outcome=outcome, message=message,
                    secs=round(time.perf_counter() - self.t0, 3))

    def addSuccess(self, test):
        self._end(test, "passed")

    def addFailure(self, test, err):
        self._end(test, "failed", err)

    def addError(self, test, err):
        # errors in setUpClass arrive with an _ErrorHolder, which has no start line
        self._end(test, "failed", err)

    def addSkip(self, test, reason):
        # the reason is the record's message: the report tells PyTorch's device-only skips
        # (DEVICE_ONLY_SKIPS) from the others by it
        self._end(test, "skipped", reason=str(reason)[:300])

    def addExpectedFailure(self, test, err):
        self._end(test, "skipped", reason="expected failure")

    def addUnexpectedSuccess(self, test):
        self._end(test, "failed", reason="unexpected success")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            etype, value, _ = err
            text = str(value).strip().splitlines()
            raise etype(text[0] if text else "") from None


def _pending_device_error() -> str:
    """The error a pjrt synchronization raises now ('' if none, or not on pjrt)."""
    if os.environ.get("PYTORCH_TESTING_DEVICE_ONLY_FOR") != "privateuse1":
        return ""
    import torch

    try:
        torch.pjrt.synchronize()
    except Exception as e:  # noqa: BLE001 (whatever the device reports)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"
    return ""


# Names that an older test file imports and torch 2.13's testing internals renamed or moved,
# given to it where it looks: (module, old name, module now, name now).
# common_methods_invocations' binary_ufuncs took in the refs, which binary_ufuncs_and_refs was
# (test_binary_ufuncs.py); the OpInfo decorators skip, xfail and skipOps moved from
# common_methods_invocations to common_device_type (test_ops.py), and skipOps lost its first
# two arguments (the class and test names, which it now reads from the decorated test): an
# optional fifth element adapts the name now to the old call.
_CMI = "torch.testing._internal.common_methods_invocations"
_CDT = "torch.testing._internal.common_device_type"


def _skip_ops_old_call(skip_ops):
    """skipOps(cls_name, test_name, to_skip), the older call, over skipOps(to_skip)."""
    return lambda *args: skip_ops(args[-1])


RENAMED = [(_CMI, "binary_ufuncs_and_refs", _CMI, "binary_ufuncs", None),
           (_CMI, "skip", _CDT, "skip", None), (_CMI, "xfail", _CDT, "xfail", None),
           (_CMI, "skipOps", _CDT, "skipOps", _skip_ops_old_call)]


def _alias_renamed(source: str) -> None:
    for module, old, module_now, new, adapt in RENAMED:
        if old in source:
            m, now = importlib.import_module(module), importlib.import_module(module_now)
            if not hasattr(m, old) and hasattr(now, new):
                value = getattr(now, new)
                setattr(m, old, adapt(value) if adapt else value)


def _load_tests(path: Path) -> list[unittest.TestCase]:
    sys.path.insert(0, str(path.parent))
    _alias_renamed(path.read_text())
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    flat: list[unittest.TestCase] = []

    def walk(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                walk(t)
            else:
                flat.append(t)

    walk(suite)
    return flat


def worker(args) -> int:
    """Runs (or lists) the tests of one file on one device; writes JSON lines to --out."""
    tests = _load_tests(Path(args.file))
    with open(args.out, "a") as out:
        if args.list:
            for t in tests:
                out.write(json.dumps({"test": t.id()}) + "\n")
            return 0
        wanted = [line.strip() for line in open(args.tests) if line.strip()]
        by_id = {t.id(): t for t in tests}
        suite = unittest.TestSuite([by_id[i] for i in wanted if i in by_id])
        suite.run(_LineResult(out))
    return 0


# ---------------------------------------------------------------- watcher

@dataclasses.dataclass
class Outcome:
    test: str  # normalized id
    outcome: str  # passed failed skipped timeout crashed memory known-skip budget
    message: str = ""
    secs: float = 0.0
    rss_mb: int = 0
    warm_secs: float | None = None  # the same test again, its programs in the compile cache


def _rss_mb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _worker_env(device: str) -> dict:
    env = dict(os.environ)
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = "privateuse1" if device == "pjrt" else "cpu"
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the CPU reference runs without pjrt
    env.setdefault("PYTORCH_TEST_WITH_SLOW", "0")
    # files that export common_utils' load_tests (test_type_promotion.py) check that their
    # classes come from the script being run, which is this one, not the file
    env["PYTORCH_DISABLE_RUNNING_SCRIPT_CHK"] = "1"
    return env


def _spawn(file: Path, device: str, out: str, tests: str | None, listing: bool):
    """The worker, its stderr going to a file (`_stderr_tail` reads it): a pipe read only
    at the end filled up with the warnings of a few tests (64 KB), and the worker blocked
    on its next write until the per-test timeout killed it: a hang the runner made."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--file", str(file),
           "--device", device, "--out", out]
    cmd += ["--list"] if listing else ["--tests", tests]
    with open(out + ".stderr", "wb") as err:
        return subprocess.Popen(cmd, env=_worker_env(device), stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True, cwd=str(file.parent))


def _stderr_tail(out: str) -> str:
    """The last 64 KB of the worker's stderr (the file _spawn gave it), the file removed."""
    path = out + ".stderr"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def list_tests(file: Path, device: str, timeout: float) -> tuple[list[str], str]:
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as f:
        proc = _spawn(file, device, f.name, None, listing=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            _stderr_tail(f.name)
            return [], "collection timed out"
        err = _stderr_tail(f.name)
        tests = [json.loads(line)["test"] for line in open(f.name) if line.strip()]
        if proc.returncode != 0:
            return tests, err.strip().splitlines()[-1:][0] if err.strip() else ""
        return tests, ""


def run_tests(file: Path, device: str, tests: list[str], timeout: float, max_rss_mb: int,
              budget: float) -> dict[str, Outcome]:
    """Runs `tests` (ids of `device`'s classes) in workers, restarting after a crash."""
    results: dict[str, Outcome] = {}
    remaining = list(tests)
    deadline = time.monotonic() + budget
    # a worker's RSS grows with every program it compiles: the test that crosses the cap
    # runs once more at the head of a fresh worker, and is marked `memory` only if it
    # crosses it there too (its own memory, not the earlier tests')
    retried: set[str] = set()
    while remaining:
        if time.monotonic() > deadline:
            for t in remaining:
                results[t] = Outcome(normalize(t), "budget", "file's time budget spent")
            break
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as lst:
            lst.write("\n".join(remaining))
        out = lst.name + ".jsonl"
        open(out, "w").close()
        proc = _spawn(file, device, out, lst.name, listing=False)
        current, started, peak = None, time.monotonic(), 0
        ended_by = None
        with open(out) as reader:
            while True:
                line = reader.readline()
                if line.endswith("\n"):
                    record = json.loads(line)
                    rss = _rss_mb(proc.pid)
                    if "start" in record:
                        current, started, peak = record["start"], time.monotonic(), rss
                    else:
                        tid = record["id"]
                        results[tid] = Outcome(normalize(tid), record["outcome"],
                                               record["message"], record["secs"],
                                               max(peak, rss))
                        current = None
                    continue
                if proc.poll() is not None:
                    rest = reader.read()
                    if rest:
                        reader.seek(reader.tell() - len(rest))
                        continue
                    break
                rss = _rss_mb(proc.pid)
                peak = max(peak, rss)
                now = time.monotonic()
                if current is not None and now - started > timeout:
                    ended_by = ("timeout", f"past {timeout:.0f} s")
                elif rss > max_rss_mb:
                    ended_by = ("memory", f"worker RSS {rss} MB > {max_rss_mb} MB")
                elif now > deadline + timeout:
                    ended_by = ("budget", "file's time budget spent")
                if ended_by:
                    _kill(proc)
                    break
                time.sleep(0.1)
        err = _stderr_tail(out)
        os.unlink(lst.name)
        os.unlink(out)
        if ended_by is None and current is not None:
            code = proc.returncode
            name = signal.Signals(-code).name if code < 0 else f"exit {code}"
            tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:]
            ended_by = ("crashed", f"worker died ({name}) {tail[0][:200] if tail else ''}")
        if current is not None and ended_by[0] == "memory" and current not in retried:
            retried.add(current)  # the next worker starts with it
        elif current is not None:
            message = ended_by[1] + (" (in a fresh worker too)" if current in retried else "")
            results[current] = Outcome(normalize(current), ended_by[0], message,
                                       time.monotonic() - started, peak)
        elif proc.returncode not in (0, None) and not results:
            tail = [ln for ln in err.strip().splitlines() if ln.strip()][-1:]
            for t in remaining:
                results[t] = Outcome(normalize(t), "crashed", f"worker failed: {tail}")
        remaining = [t for t in remaining if t not in results]
        if ended_by is None and remaining:
            # the worker ended without running them (a class fixture failed without a record)
            for t in remaining:
                results[t] = Outcome(normalize(t), "failed", "not run by the worker")
            remaining = []
    return results


def _sample(ids: list[str], n: int | None) -> list[str]:
    if n is None or len(ids) <= n:
        return ids
    key = lambda t: hashlib.sha1(normalize(t).encode()).hexdigest()  # noqa: E731
    chosen = set(sorted(ids, key=key)[:n])
    return [t for t in ids if t in chosen]


def run_file(path: Path, spec: dict, args, known) -> dict:
    """Both devices' outcomes of one file, keyed by normalized id."""
    pjrt_ids, pjrt_err = list_tests(path, "pjrt", args.collect_timeout)
    if spec.get("match"):
        pjrt_ids = [t for t in pjrt_ids if re.search(spec["match"], normalize(t))]
    pjrt_ids = _sample(pjrt_ids, spec.get("sample"))
    skip = {t for t in pjrt_ids if known.skip_reason(path.name, normalize(t))}
    run_ids = [t for t in pjrt_ids if t not in skip]
    t0 = time.monotonic()
    pjrt = run_tests(path, "pjrt", run_ids, args.timeout, args.max_rss, args.budget)
    pjrt_secs = time.monotonic() - t0
    warm_secs = None
    if args.warm:  # again, the compile cache holding what the first pass compiled
        t0 = time.monotonic()
        again = run_tests(path, "pjrt", [t for t in run_ids if pjrt[t].outcome == "passed"],
                          args.timeout, args.max_rss, args.budget)
        warm_secs = time.monotonic() - t0
        for t, o in again.items():
            pjrt[t].warm_secs = o.secs
    for t in skip:
        pjrt[t] = Outcome(normalize(t), "known-skip", known.skip_reason(path.name, normalize(t)))
    wanted = {normalize(t) for t in pjrt_ids}
    cpu: dict[str, Outcome] = {}
    cpu_secs = 0.0
    if not args.no_cpu and pjrt_ids:
        cpu_ids, _ = list_tests(path, "cpu", args.collect_timeout)
        cpu_ids = [t for t in cpu_ids if normalize(t) in wanted]
        t0 = time.monotonic()
        cpu = run_tests(path, "cpu", cpu_ids, args.timeout, args.max_rss, args.budget)
        cpu_secs = time.monotonic() - t0
    return {
        "file": path.name,
        "chars": len(path.read_text()),
        "collect_error": pjrt_err,
        "pjrt": {o.test: dataclasses.asdict(o) for o in pjrt.values()},
        "cpu": {o.test: dataclasses.asdict(o) for o in cpu.values()},
        "pjrt_secs": round(pjrt_secs, 1),
        "cpu_secs": round(cpu_secs, 1),
        "warm_secs": None if warm_secs is None else round(warm_secs, 1),
    }


# ---------------------------------------------------------------- report

KINDS = ("passed", "failed", "skipped", "device-skip", "timeout", "crashed", "memory",
         "known-skip", "budget")


def failure_kind(message: str) -> str:
    """A failure's group: its exception and message with numbers, names of tensors cut."""
    text = re.sub(r"\d+(\.\d+)?", "N", message)
    text = re.sub(r"'[^']*'", "'…'", text)
    return text[:110]


def device_only_skip(outcome: dict) -> bool:
    """A skip PyTorch's decorators raise because the device is not the CPU or CUDA."""
    return outcome["outcome"] == "skipped" and bool(DEVICE_ONLY_SKIPS.match(outcome["message"]))


def summarize(result: dict, known) -> dict:
    """Counts and rate of one file's run. The rate is over the tests that pass on the CPU,
    less those PyTorch skips on pjrt for the device alone (device_only_skip), unless the known
    list names them."""
    pjrt, cpu = result["pjrt"], result["cpu"]
    device_skips = {t for t, o in pjrt.items()
                    if device_only_skip(o) and not known.reason(result["file"], t)}
    counts = Counter("device-skip" if t in device_skips else o["outcome"]
                     for t, o in pjrt.items())
    cpu_pass = {t for t, o in cpu.items() if o["outcome"] == "passed"}
    both = [t for t in cpu_pass if t in pjrt and t not in device_skips]
    passing = [t for t in both if pjrt[t]["outcome"] == "passed"]
    # a test's time: its warm rerun's where there was one (a cold cache compiles every new
    # program: that cost is the compile cache's, measured apart)
    secs = {t: o["secs"] if o.get("warm_secs") is None else o["warm_secs"]
            for t, o in pjrt.items()}
    slow = [t for t in both if secs[t] > max(10 * cpu[t]["secs"], 5.0)]
    heavy = [t for t in pjrt if t in cpu and pjrt[t]["rss_mb"] - cpu[t]["rss_mb"] > 2048]
    bad = [t for t in both if pjrt[t]["outcome"] != "passed"]
    unknown = [t for t in bad if not known.reason(result["file"], t)]
    return {"counts": counts, "cpu_pass": len(both), "passing": len(passing),
            "rate": (100.0 * len(passing) / len(both)) if both else None,
            "slow": slow, "heavy": heavy, "bad": bad, "unknown": unknown}


def write_report(results: list[dict], known, path: Path, command: str) -> None:
    lines = [
        "# PyTorch's own tests on pjrt",
        "",
        "Generated by `" + command + "` (tools/pytorch_tests.py); do not edit by hand.",
        "",
        "Each file of PyTorch's `test/` ran in its own worker processes on `pjrt` "
        "(`PYTORCH_TESTING_DEVICE_ONLY_FOR=privateuse1`) and then on the CPU, a test at a time, "
        "with a per-test time limit and a memory cap. *rate* is the share of the tests that "
        "pass on the CPU in the same run that pass on pjrt, leaving out those PyTorch skips on "
        "pjrt for the device alone: *not for this device* counts them (skipped with one of "
        "common_device_type's device messages: `Only runs on cpu` from onlyCPU/onlyOn, "
        "onlyCUDA's `Only runs on cuda`, onlyNativeDeviceTypes, onlyAccelerator, "
        "deviceCountAtLeast's `fewer than N devices detected`, skipPRIVATEUSE1; the pattern is "
        "DEVICE_ONLY_SKIPS in tools/pytorch_tests.py). Every other skip on pjrt of a test that "
        "passes on the CPU stays in the denominator, as a test that did not pass, and so do the "
        "known failures. *known* are failures listed with their reason in "
        "tools/pytorch_tests_known.py (run, or not run where they crash or hang).",
        "",
        "| file | collected | passed | failed | skipped | not for this device | timed out "
        "| crashed | memory | known, not run | over budget | pass on CPU, run here | rate "
        "| pjrt s | pjrt s warm | CPU s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- | --- |",
    ]
    summaries = {}
    for r in results:
        s = summaries[r["file"]] = summarize(r, known)
        c = s["counts"]
        rate = f"{s['rate']:.1f}%" if s["rate"] is not None else "-"
        lines.append(
            f"| {r['file']} | {len(r['pjrt'])} | {c['passed']} | {c['failed']} | "
            f"{c['skipped']} | {c['device-skip']} | {c['timeout']} | {c['crashed']} | "
            f"{c['memory']} | "
            f"{c['known-skip']} | {c['budget']} | {s['cpu_pass']} | {rate} | "
            f"{r['pjrt_secs']:.0f} | "
            f"{'-' if r.get('warm_secs') is None else round(r['warm_secs'])} | "
            f"{r['cpu_secs']:.0f} |")
    lines += [""] + _history_lines([r["file"] for r in results])
    lines += ["## The test files", "",
              "PyTorch's test files are not in the wheel, and not in this repository. This run "
              "used these, from pytorch/pytorch at the commits named (the lengths were checked "
              "against the files the run read):", "",
              "| file | pytorch/pytorch commit | characters | as read | read from |",
              "| --- | --- | --- | --- | --- |"]
    for r in results:
        commit, chars, where = SOURCES.get(r["file"], ("?", 0, "?"))
        lines.append(f"| {r['file']} | {commit} | {chars} | {r.get('chars', '?')} | "
                     f"{where} |")
    lines += ["", "To assemble the directory again: for each file above, read it at that "
              "commit from where the table says (the search tool's `read_file` with repo "
              "pytorch/pytorch and path test/FILE, 16,000 characters a page, `offset` for the "
              "next; or `git show COMMIT:test/FILE` in any clone that has the commit), write "
              "the pages end to end into DIR/FILE, and check its length against the table (the "
              "runner prints both). Helpers the files import that the wheel lacks go beside "
              "them (none of the files above needs one: test_autograd.py's excerpt leaves out "
              "the lines that import autograd/ helpers). The excerpts (test_autograd.py, "
              "test_nn.py, test_torch.py) are the character ranges the comment on SOURCES in "
              "tools/pytorch_tests.py names, joined in order. Then `TORCH_PJRT_PYTORCH_TESTS=DIR "
              "python -m pytest tests/test_pytorch_suites.py` runs CI's slice, and the command "
              "at the top the full run.", ""]
    lines += ["", "## Failures not in the known list, grouped by kind", ""]
    any_unknown = False
    for r in results:
        s = summaries[r["file"]]
        groups = defaultdict(list)
        for t, o in r["pjrt"].items():
            if o["outcome"] in ("failed", "timeout", "crashed", "memory") and \
                    not known.reason(r["file"], t):
                label = o["outcome"] if o["outcome"] != "failed" else failure_kind(o["message"])
                cpu_o = r["cpu"].get(t, {}).get("outcome", "absent")
                groups[(label, cpu_o == "passed")].append(t)
        if not groups:
            continue
        any_unknown = True
        lines += [f"### {r['file']}", ""]
        for (label, cpu_ok), tests in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            where = "" if cpu_ok else " (fail on the CPU too)"
            shown = ", ".join(f"`{t}`" for t in sorted(tests)[:6])
            more = f" and {len(tests) - 6} more" if len(tests) > 6 else ""
            lines.append(f"- {len(tests)} × `{label}`{where}: {shown}{more}")
        lines.append("")
    if not any_unknown:
        lines += ["None.", ""]
    lines += ["## Slower than 10× the CPU (and 5 s), or 2 GB of RSS over the CPU's run", "",
              "Per file: how many, and the five worst by time. A test's time on pjrt is the "
              "warm rerun's where the run had one (`--warm`: its programs in the compile "
              "cache), shown after the first, cold, time; a cold cache compiles every new "
              "program (an op and its shapes, or a fused graph), which most of these tests "
              "spend their cold time on.", ""]
    for r in results:
        s = summaries[r["file"]]
        if not s["slow"] and not s["heavy"]:
            continue

        def when(o):
            return o["secs"] if o.get("warm_secs") is None else o["warm_secs"]

        worst = sorted(set(s["slow"]) | set(s["heavy"]), key=lambda t: -when(r["pjrt"][t]))
        lines.append(f"- {r['file']}: {len(s['slow'])} slower, {len(s['heavy'])} heavier; "
                     + "; ".join(f"`{t}` " + (
                         f"{r['pjrt'][t]['secs']:.1f} s cold, " if r['pjrt'][t].get(
                             "warm_secs") is not None else "")
                         + f"{when(r['pjrt'][t]):.1f} s / {r['pjrt'][t]['rss_mb']} MB (CPU "
                         f"{r['cpu'][t]['secs']:.1f} s / {r['cpu'][t]['rss_mb']} MB)"
                         for t in worst[:5]))
    if not any(summaries[r["file"]]["slow"] or summaries[r["file"]]["heavy"] for r in results):
        lines.append("None.")
    lines += ["", "## Known failures met in this run", ""]
    met = [(r["file"], t, known.reason(r["file"], t)) for r in results for t, o in
           r["pjrt"].items() if o["outcome"] != "passed" and known.reason(r["file"], t)]
    for file, t, reason in sorted(met):
        lines.append(f"- {file} `{t}`: {reason}")
    if not met:
        lines.append("None.")
    lines.append("")
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------- history

def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def record_history(results: list[dict], known, note: str) -> None:
    """Adds one row per file of this run to HISTORY."""
    rows = json.loads(HISTORY.read_text()) if HISTORY.exists() else []
    for r in results:
        s = summarize(r, known)
        c = s["counts"]
        rows.append({"file": r["file"], "run": f"{time.strftime('%Y-%m-%d')} {_git_head()}: "
                     f"{note}", "collected": len(r["pjrt"]),
                     **{k: c[k] for k in KINDS}, "cpu_pass": s["cpu_pass"],
                     "rate": None if s["rate"] is None else round(s["rate"], 1),
                     "pjrt_s": round(r["pjrt_secs"]), "cpu_s": round(r["cpu_secs"])})
    HISTORY.write_text("[\n" + ",\n".join(json.dumps(row) for row in rows) + "\n]\n")


def _history_lines(files: list[str]) -> list[str]:
    rows = json.loads(HISTORY.read_text()) if HISTORY.exists() else []
    if not rows:
        return []
    lines = ["## Before and after", "",
             f"Every recorded run of each file, oldest first ({HISTORY.relative_to(ROOT)}; "
             "`--history NOTE` adds a run). A blank is a count that run did not give.", "",
             "*not for this device* is blank in the runs before the rate left PyTorch's "
             "device-only skips out (their rate counts them as not passed).", "",
             "| file | run | collected | passed | failed | timed out | crashed or memory "
             "| not for this device | pass on CPU | rate | pjrt s | CPU s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = files + sorted({row["file"] for row in rows} - set(files))

    def cell(row, *keys):
        values = [row.get(k) for k in keys]
        return "" if all(v is None for v in values) else str(sum(v or 0 for v in values))

    for file in order:
        for row in (r for r in rows if r["file"] == file):
            rate = "" if row.get("rate") is None else f"{row['rate']:.1f}%"
            lines.append(f"| {file} | {row['run']} | {cell(row, 'collected')} | "
                         f"{cell(row, 'passed')} | {cell(row, 'failed')} | "
                         f"{cell(row, 'timeout')} | {cell(row, 'crashed', 'memory')} | "
                         f"{cell(row, 'device-skip')} | "
                         f"{cell(row, 'cpu_pass')} | {rate} | {cell(row, 'pjrt_s')} | "
                         f"{cell(row, 'cpu_s')} |")
    return lines + [""]


# ---------------------------------------------------------------- main

def run_files(args, known) -> list[dict]:
    """Runs each named file (default: every file of FILES) on pjrt and on the CPU."""
    test_dir = Path(args.pytorch_test_dir)
    results = []
    for name in args.files or list(FILES):
        path = test_dir / Path(name).name
        if not path.exists():
            print(f"{name}: not in {test_dir}, left out", flush=True)
            continue
        spec = dict(FILES.get(path.name, {}))
        if args.sample is not None:
            spec["sample"] = min(args.sample, spec.get("sample") or args.sample)
        if args.match:
            # both must match somewhere in the id (the file's own pattern may be a suffix)
            spec["match"] = f"^(?=.*(?:{spec['match']}))(?=.*(?:{args.match}))" \
                if spec.get("match") else args.match
        try:
            r = run_file(path, spec, args, known)
        except Exception:  # a broken file must not end the run
            traceback.print_exc()
            continue
        results.append(r)
        s = summarize(r, known)
        rate = f"{s['rate']:.1f}%" if s["rate"] is not None else "-"
        print(f"{path.name}: {dict(s['counts'])} rate {rate} "
              f"({r['pjrt_secs']:.0f} s pjrt, {r['cpu_secs']:.0f} s CPU)", flush=True)
    return results



def overlay(results: list[dict]) -> list[dict]:
    """One outcome list per file: where several runs name the same file (a whole run, then
    --match reruns of some of its tests), a later run's outcome of a test replaces the
    earlier one's; the file's times stay the first run's (the whole run)."""
    merged: dict[str, dict] = {}
    for r in results:
        first = merged.get(r["file"])
        if first is None:
            merged[r["file"]] = {**r, "pjrt": dict(r["pjrt"]), "cpu": dict(r["cpu"])}
            continue
        first["pjrt"].update(r["pjrt"])
        first["cpu"].update(r["cpu"])
    return list(merged.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", help="test files (default: every file of FILES)")
    p.add_argument("--pytorch-test-dir", default=os.environ.get("TORCH_PJRT_PYTORCH_TESTS"),
                   help="PyTorch's test/ directory (default: $TORCH_PJRT_PYTORCH_TESTS)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test")
    p.add_argument("--max-rss", type=int, default=4096, help="MB of RSS per worker")
    p.add_argument("--budget", type=float, default=1800.0, help="seconds per file and device")
    p.add_argument("--collect-timeout", type=float, default=300.0)
    p.add_argument("--sample", type=int, default=None, help="at most N tests per file")
    p.add_argument("--match", default=None,
                   help="only the tests whose device-free id matches this regular expression")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU reference run")
    p.add_argument("--warm", action="store_true",
                   help="run the tests that passed on pjrt again, their programs compiled: "
                   "the slowness check takes those times")
    p.add_argument("--report", default=None, help="write this markdown report")
    p.add_argument("--json", default=None, help="write the raw outcomes here")
    p.add_argument("--from-json", nargs="+", default=None, metavar="JSON",
                   help="run nothing: report the outcomes of earlier runs' --json files (a "
                   "later file's outcome of a test replaces an earlier one's: --match reruns "
                   "overlaid on a whole run)")
    p.add_argument("--history", default=None, metavar="NOTE",
                   help=f"add this run's counts per file to {HISTORY.name} (the report's "
                   "before/after table), with NOTE saying what ran")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--device", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--tests", help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if not args.from_json and (not args.pytorch_test_dir or
                               not Path(args.pytorch_test_dir).is_dir()):
        p.error("--pytorch-test-dir (or TORCH_PJRT_PYTORCH_TESTS) must name PyTorch's test/ "
                "directory; docs/pytorch-tests.md says how to assemble it")
    import pytorch_tests_known as known

    if args.from_json:  # the report of earlier runs' outcomes, nothing run
        results = overlay([r for f in args.from_json for r in json.loads(Path(f).read_text())])
    else:
        results = run_files(args, known)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.history:
        record_history(results, known, args.history)
    if args.report:
        command = "python tools/pytorch_tests.py --pytorch-test-dir DIR " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:])
            if not a.startswith("--pytorch-test-dir") and a != args.pytorch_test_dir)
        write_report(results, known, Path(args.report), command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the first minute cost: metrics() and the report say how long compiling took, how
much of it ran in the background, and which program was slowest and why; the compile
logs carry the running totals."""

import inspect
import logging
import os
import sys

import pytest
import torch

import torch_pjrt
from torch_pjrt import report
from torch_pjrt.runtime import watch

HERE = os.path.basename(__file__)


def _line_of(marker: str) -> int:
    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_line_of" not in line)


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    """An empty disk cache: the programs below compile with XLA (not loaded from disk)."""
    monkeypatch.setenv("TORCH_PJRT_CACHE_DIR", str(tmp_path))


def test_report_says_what_compiling_cost_and_the_slowest_program():
    x = torch.randn(13, 7).to("pjrt")  # sizes no other test uses: nothing in memory
    y = (x.sin() * 3 + x.cos()).sum(0)
    y.cpu()  # SYNC-HERE
    m = torch_pjrt.metrics()
    assert m["xla_compiles"] >= 1 and m["xla_compile_seconds"] > 0, m
    assert m.get("background_compile_seconds", 0) == 0 and m.get("disk_loads", 0) == 0
    progs = watch.programs()
    assert m["xla_compile_seconds"] == pytest.approx(sum(p.seconds for p in progs), abs=1e-5)
    text = torch_pjrt.metrics.report()
    assert (f"compile time: {m['xla_compile_seconds']:.2f} s compiling {m['xla_compiles']} "
            f"program") in text
    assert f"0.00 s of it in the background, {m['xla_compile_seconds']:.2f} s waited for" in text
    slowest = max(progs, key=lambda p: p.seconds)
    line = next(x for x in text.splitlines() if "slowest:" in x)
    assert f"slowest: {slowest.name}, {slowest.seconds:.2f} s: {slowest.title}" in line
    at = line.split("; compiled at ")[1]  # the line of user code that made it run
    assert f"{HERE}:{_line_of('SYNC-HERE')} " in at
    assert slowest.nbytes and slowest.nbytes > 0  # its size, as the disk cache holds it
    assert report._bytes(slowest.nbytes) + " compiled" in line


def test_background_compiles_are_counted_apart():
    """The engine's background compiles (runtime.watch.background) count in
    background_compile_seconds, and show the user's line given to them."""
    x = torch.randn(11, 5).to("pjrt")
    where = ("user_script.py", 7, "step")
    with watch.background(where):
        (x.exp() + 1).cpu()
    assert not watch.in_background()
    (x.log1p() * 2).cpu()  # in the foreground
    m = torch_pjrt.metrics()
    progs = watch.programs()
    behind = [p for p in progs if p.background]
    assert behind and all(p.site == where for p in behind)
    assert any(not p.background for p in progs)
    assert m["background_compile_seconds"] == pytest.approx(
        sum(p.background for p in progs), abs=1e-5)
    assert 0 < m["background_compile_seconds"] < m["xla_compile_seconds"]
    assert m["background_compiles"] == sum(p.compiles for p in behind)
    waited = m["xla_compile_seconds"] - m["background_compile_seconds"]
    assert (f"{m['background_compile_seconds']:.2f} s of it in the background, "
            f"{waited:.2f} s waited for") in torch_pjrt.metrics.report()


def test_a_big_graph_is_named_as_the_reason(monkeypatch):
    monkeypatch.setattr(report, "_BIG_GRAPH", 6)
    x = torch.randn(9, 3).to("pjrt")
    for _ in range(4):
        x = x.tanh() * 2  # 8 ops, nothing read in between
    x.cpu()
    graph = max(watch.programs(), key=lambda p: p.seconds)
    assert graph.kind == "graph" and len(graph.ops) >= 8
    assert f"Its {len(graph.ops)} ops ran as one program" in torch_pjrt.metrics.report()


def test_compile_logs_carry_the_totals(caplog):
    caplog.set_level(logging.INFO, logger="torch_pjrt.compile")
    x = torch.randn(7, 13).to("pjrt")
    (x.cosh() - 1).cpu()
    records = [r.getMessage() for r in caplog.records if r.name == "torch_pjrt.compile"]
    m = torch_pjrt.metrics()
    assert records and records[-1].startswith("compiled ")
    assert (f"so far {m['xla_compile_seconds']:.1f} s compiling {m['xla_compiles']} programs "
            "(0.0 s of it in the background)") in records[-1]
    assert " KB)" in records[-1] or " MB)" in records[-1]

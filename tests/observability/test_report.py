"""torch_pjrt.metrics.report(): recompiles with their reasons, sync points and fallbacks
with the user's line, graph breaks, a steady-state verdict; numbers as metrics() says."""

import inspect
import os
import subprocess
import sys
import warnings

import torch

import torch_pjrt
from torch_pjrt.eager import fallback
from torch_pjrt.runtime import watch

HERE = os.path.basename(__file__)


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).to("pjrt")
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _line_of(marker: str) -> int:
    """The line of this file holding `marker` (a comment on the line a test is about)."""
    lines = inspect.getsource(sys.modules[__name__]).splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_line_of" not in line)


def test_item_in_a_loop_reports_its_line():
    model, opt = _model()
    x = torch.randn(4, 8).to("pjrt")
    for _ in range(4):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # the sync
    text = torch_pjrt.metrics.report()
    line = _line_of("# the sync")
    (row,) = [r for r in text.splitlines() if f"{HERE}:{line}" in r and "copy to host" in r
              and not r.startswith("steady state")]
    assert row.split()[0] == "4"  # four times, once per step
    verdict = next(r for r in text.splitlines() if r.startswith("steady state:"))
    assert verdict.startswith("steady state: no compiles after step 1 (of 4)")
    assert "waits for the device once per step at" in verdict and f"{HERE}:{line}" in verdict


def test_shape_change_each_step_reports_the_recompile_reason():
    model, opt = _model()
    for step in range(5):
        x = torch.randn(3 + step, 8).to("pjrt")  # a new batch size each step
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.pjrt.synchronize()
    text = torch_pjrt.metrics.report()
    verdict = next(r for r in text.splitlines() if r.startswith("steady state:"))
    assert verdict.startswith("steady state: recompiling every step: a fused graph of")
    assert "float32[6, " in verdict and "-> " in verdict and "float32[7, " in verdict
    noted = [r for r in watch.recompiles()[0] if r.kind != "op"]
    assert len(noted) == torch_pjrt.metrics()["recompiles"] == 8  # forward and backward, 4x
    assert any(r.site is not None and r.site[0].endswith(HERE) for r in noted)


def test_strict_mode_notes_ops_compiled_for_new_shapes():
    with torch_pjrt.set_eager_mode("strict"):
        for n in (3, 4, 5):
            torch.randn(n, 19).to("pjrt").cos()  # an op with new shapes
    noted = [r for r in watch.recompiles()[0] if r.kind == "op"]
    (cos,) = [r for r in noted if r.what == "aten.cos.default"][-1:]
    assert cos.reason == "input 0: float32[4, 19] -> float32[5, 19]"
    assert "of single ops (strict mode" in torch_pjrt.metrics.report()
    assert torch_pjrt.metrics().get("recompiles", 0) == 0  # counted: graphs only


def test_metrics_1_warns_once_about_a_loop_recompiling_every_step(monkeypatch):
    monkeypatch.setattr(watch, "loud", True)
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2).to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(7):
            loss = model(torch.randn(20 + step, 5).to("pjrt")).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    said = [w for w in caught if "recompiles in every step" in str(w.message)]
    assert len(said) == 1 and "float32[" in str(said[0].message)


def test_report_numbers_agree_with_metrics():
    model, opt = _model()
    x = torch.randn(11, 8).to("pjrt")  # shapes no other test compiles
    for _ in range(2):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss.cpu()
    m = torch_pjrt.metrics()
    text = torch_pjrt.metrics.report()
    programs = watch.programs()
    assert sum(p.compiles + p.loads for p in programs) == m["compiles"]
    assert f"programs: {m['compiles']} compiles" in text
    assert f"fused graphs run: {m['flushes']} " in text
    syncs = sum(watch.syncs().values())
    assert f"synchronizations (the host waited for the device): {syncs}" in text
    assert f"device to host {m['device_to_host_bytes']} B" in text
    for p in programs:
        assert p.name in text and p.name.startswith("graph-")


def test_fallbacks_by_op_with_their_line():
    d = torch.randn(4, 4).to("pjrt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            fallback.cpu_fallback(torch.ops.aten.mul.Tensor, (d, 2), {})  # the fallback
    text = torch_pjrt.metrics.report()
    line = _line_of("# the fallback")
    (row,) = [r for r in text.splitlines() if "aten.mul.Tensor" in r]
    assert row.split()[0] == "3" and f"{HERE}:{line}" in row
    assert torch_pjrt.metrics()["cpu_fallbacks"] == {"aten.mul.Tensor": 3}


def test_graph_breaks_with_dynamos_reasons():
    def f(x):
        y = x.sin()
        print("a graph break")
        return y.cos()

    torch._dynamo.reset()
    torch.compile(f, backend="pjrt")(torch.randn(4).to("pjrt"))
    text = torch_pjrt.metrics.report()
    assert "torch.compile graph breaks: 1" in text
    assert "Failed to trace builtin operator" in text and "print" in text
    assert "resumed after breaks in: f at line" in text


def test_without_notes_no_lines_are_taken(monkeypatch):
    monkeypatch.setattr(watch, "notes", False)
    t = torch.randn(3).to("pjrt")
    t.sum().item()
    assert list(watch.syncs()) == [("copy to host", None)]
    assert "no lines of user code noted" in torch_pjrt.metrics.report()


def test_report_command_runs_a_script(tmp_path, capsys):
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch\n"
        "x = torch.ones(3, device='pjrt')\n"
        "for i in range(3):\n"
        "    x = x * 2\n"
        "    print(x.sum().item())\n")
    from torch_pjrt.__main__ import main

    out = tmp_path / "report.txt"
    assert main(["report", "--out", str(out), str(script)]) == 0
    assert capsys.readouterr().out.split() == ["6.0", "12.0", "24.0"]
    text = out.read_text()
    assert "loop.py:5" in text and "copy to host" in text


def test_metrics_1_reports_at_exit_and_warns_per_step_syncs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "w = torch.zeros(3, device='pjrt', requires_grad=True)\n"
        "opt = torch.optim.SGD([w], lr=0.1)\n"
        "for i in range(6):\n"
        "    loss = (w - 1).square().sum()\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"
        "    loss.item()\n")
    env = {**os.environ, "TORCH_PJRT_METRICS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "torch-pjrt metrics report" in out.stderr
    assert "steady state: no compiles after step" in out.stderr
    warned = [line for line in out.stderr.splitlines() if "in every training step" in line]
    assert len(warned) == 1 and "train.py:7" in warned[0]

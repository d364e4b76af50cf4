"""torch.profiler sees the pjrt device: program runs, compiles, transfers, flushes and
syncs as events, device time in key_averages, a device track in the chrome trace."""

import json
import os
import time

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import torch_pjrt
from torch_pjrt.runtime import watch

DEVICE_ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _model_and_data(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3)).to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, generator=gen).to(device)
    y = torch.randint(0, 3, (6,), generator=gen).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), x, y


def _step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _programs(prof):
    names = {p.label for p in watch.programs()} | {p.label for p in watch._programs.values()}
    return [e for e in _device_events(prof) if e.name in names]


def _trace(prof, tmp_path):
    path = os.path.join(tmp_path, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        return json.load(f)["traceEvents"]


def test_training_loop_has_a_device_event_per_program_run(tmp_path):
    model, opt, x, y = _model_and_data("pjrt")
    for _ in range(2):
        _step(model, opt, x, y)
    flushes = torch_pjrt.metrics().get("flushes", 0)
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        for _ in range(3):
            loss = _step(model, opt, x, y)
        value = loss.item()
    runs = torch_pjrt.metrics()["flushes"] - flushes
    programs = _programs(prof)
    assert runs == 6  # a forward and a backward program per step
    assert len(programs) == runs
    assert all(e.device_time_total > 0 for e in programs)
    # a step's backward program is launched by its optimizer step: its device time is there
    steps = [e for e in prof.events() if e.name.startswith("Optimizer.step")]
    assert len(steps) == 3 and all(e.device_time_total > 0 for e in steps)
    assert not watch.profiling and not watch.op_sites

    # the profile changed nothing: the same loss as on the CPU
    cpu_model, cpu_opt, cx, cy = _model_and_data("cpu")
    for _ in range(5):
        cpu_loss = _step(cpu_model, cpu_opt, cx, cy)
    assert value == pytest.approx(cpu_loss.item(), rel=1e-5)


def test_key_averages_show_device_time_per_program():
    model, opt, x, y = _model_and_data("pjrt")
    _step(model, opt, x, y)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PJRT]) as prof:
        for _ in range(2):
            _step(model, opt, x, y)
        torch.pjrt.synchronize()
    rows = {r.key: r for r in prof.key_averages()}
    program_rows = [r for k, r in rows.items() if k.startswith("graph-")]
    assert len(program_rows) == 2 and all(r.count == 2 for r in program_rows)
    assert all(r.self_device_time_total > 0 for r in program_rows)
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self PJRT" in table and "graph-" in table
    assert any(k.startswith("pjrt flush: backward") for k in rows)
    assert any(k.startswith("pjrt sync") for k in rows)  # synchronize() waited


def test_chrome_trace_has_a_device_track(tmp_path):
    x = torch.randn(4, 4).to("pjrt")
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        y = (x @ x).relu().sum()
        y.item()
        z = torch.ones(3).to("pjrt")
        z.cpu()
    events = _trace(prof, tmp_path)
    names = {(e.get("pid"), e["args"].get("name")) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert (0, "pjrt:0") in names
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and all(e["pid"] == 0 and e["dur"] > 0 for e in kernels)
    ops = kernels[0]["args"]["ops"]
    assert "aten.mm" in ops and "aten.relu" in ops and "aten.sum" in ops
    assert "test_profiler.py" in kernels[0]["args"]["sites"]  # the lines the ops came from
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert {e["name"] for e in copies} >= {"pjrt host to device", "pjrt device to host"}
    assert any(e["args"].get("bytes") == 12 for e in copies)
    host = {e["name"] for e in events if e.get("cat") == "privateuse1_runtime"}
    assert "pjrt flush: data read" in host and "pjrt sync: copy to host" in host


def test_strict_mode_ops_are_programs_with_their_line(tmp_path):
    x = torch.randn(4, 6).to("pjrt")
    with torch_pjrt.set_eager_mode("strict"):
        with profile(activities=DEVICE_ACTIVITIES) as prof:
            y = torch.sin(x)  # a strict op
            y.add_(1).sum().item()
    kernels = [e for e in _trace(prof, tmp_path) if e.get("cat") == "kernel"]
    assert len(kernels) == 3 and all(e["dur"] > 0 for e in kernels)  # sin, add_, sum
    (sin,) = [e for e in kernels if e["args"]["ops"] == "aten.sin.default"]
    assert sin["name"].startswith("op-") and sin["name"].endswith(" aten.sin.default")
    line = next(i for i, text in enumerate(open(__file__), 1) if "# a strict op" in text)
    assert f"test_profiler.py:{line}" in sin["args"]["sites"]


def test_compiled_graphs_are_programs():
    def f(x):
        return (x.sin() * 2).sum()

    compiled = torch.compile(f, backend="pjrt")
    x = torch.randn(5, 3).to("pjrt")
    compiled(x)
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        compiled(x).item()
    (program,) = [e for e in _device_events(prof) if e.name.startswith("compiled-")]
    assert program.device_time_total > 0


def test_record_function_ranges_get_the_device_time_of_their_programs():
    x = torch.randn(5, 5).to("pjrt")
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        with record_function("my_region"):
            (x * 3).exp().sum().item()
    (region,) = [e for e in prof.events() if e.name == "my_region"]
    assert region.device_time_total > 0


def test_compiles_say_where_the_program_came_from(tmp_path, monkeypatch):
    from torch_pjrt.eager import graph, tiers

    monkeypatch.setattr(tiers, "enabled", False)  # the graph's own program, not its ops'
    x = torch.randn(7, 3).to("pjrt")
    with profile(activities=DEVICE_ACTIVITIES) as prof:
        (x.sin() * 2 + 1).sum().item()
    graph.forget()  # the same graph again: from the disk cache
    with profile(activities=DEVICE_ACTIVITIES) as prof2:
        (x.sin() * 2 + 1).sum().item()
    first = [e for e in _trace(prof, tmp_path) if e["name"].startswith("pjrt compile")]
    events = _trace(prof2, tmp_path)
    again = [e for e in events if e["name"].startswith("pjrt compile")]
    assert first and again
    assert {e["args"]["cache"] for e in again} == {"disk"}
    runs = [e for e in events if e.get("cat") == "kernel"]
    assert {e["args"]["cache"] for e in runs} == {"disk"}


def test_schedule_and_tensorboard_handler(tmp_path):
    model, opt, x, y = _model_and_data("pjrt")
    handler = torch.profiler.tensorboard_trace_handler(str(tmp_path))
    with profile(activities=DEVICE_ACTIVITIES, on_trace_ready=handler,
                 schedule=schedule(wait=1, warmup=1, active=2, repeat=1)) as prof:
        for _ in range(5):
            _step(model, opt, x, y)
            prof.step()
    (written,) = [f for f in os.listdir(tmp_path) if f.endswith(".json")]
    with open(os.path.join(tmp_path, written)) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert len(kernels) == 4  # two active steps, two programs each
    assert not watch.profiling


def test_default_activities_include_the_device():
    x = torch.randn(3).to("pjrt")
    with profile() as prof:
        (x + 1).sum().item()
    assert _programs(prof)


def test_event_elapsed_time():
    x = torch.randn(64, 64).to("pjrt")
    start = torch.pjrt.Event(enable_timing=True)
    end = torch.pjrt.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        x = x @ x
    time.sleep(0.02)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert 20 <= elapsed < 10_000
    assert isinstance(start, torch.pjrt.Event)
    assert not isinstance(torch.Event(device="cpu"), torch.pjrt.Event)
    untimed = torch.pjrt.Event()
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        untimed.elapsed_time(end)


def test_ends_seen_late_are_bounded_by_what_read_them():
    """A waiter that takes a program's end late (it waits for the GIL) must not put the end
    after a collective that read the program's output, nor after the next program's end."""
    from torch_pjrt.runtime import device_trace as dt

    def run(kind, launched, end, after=()):
        r = dt._Run(kind, "r", 0, launched, [], 0, {})
        r.end, r.after = end, list(after)
        return r

    first = run(dt.PROGRAM, 0, 90)  # seen late: the producer ends before 50
    producer = run(dt.PROGRAM, 10, 80)
    collective = run(dt.COLLECTIVE, 20, 50, [producer])
    later = run(dt.PROGRAM, 30, 100)
    dt._bound_ends([first, producer, collective, later])
    assert (first.end, producer.end, collective.end, later.end) == (50, 50, 50, 100)

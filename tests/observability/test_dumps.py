"""TORCH_PJRT_DUMP_DIR: every compiled program's StableHLO, optimized HLO and its map back
to ATen ops and source lines, named as profiles name the program."""

import json
import os

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from torch_pjrt.runtime import dumps, watch

HERE = os.path.basename(__file__)


@pytest.fixture
def dump_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_PJRT_DUMP_DIR", str(tmp_path))
    dumps.configure()
    yield tmp_path
    monkeypatch.delenv("TORCH_PJRT_DUMP_DIR")
    dumps.configure()
    assert not watch.op_sites


def _parse_stablehlo(text: str):
    from jax._src.interpreters import mlir
    from jaxlib.mlir import ir

    with mlir.make_ir_context():
        return ir.Module.parse(text)


def test_fused_graph_dump_parses_and_maps_to_ops_and_lines(dump_dir):
    x = torch.randn(9, 5).to("pjrt")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        y = torch.mm(x, x.t()).softmax(-1)  # the ops
        y.sum().item()
    (kernel,) = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1
                 and e.name.startswith("graph-")]
    name = kernel.name.split()[0]  # the profile names the files
    files = sorted(os.listdir(dump_dir))
    assert files == [f"{name}.hlo.txt", f"{name}.map.json", f"{name}.stablehlo.mlir"]
    _parse_stablehlo((dump_dir / f"{name}.stablehlo.mlir").read_text())
    hlo = (dump_dir / f"{name}.hlo.txt").read_text()
    assert hlo.startswith("HloModule") and 'op_name="' in hlo and ":aten.mm.default" in hlo
    mapping = json.loads((dump_dir / f"{name}.map.json").read_text())
    assert mapping["name"] == name and mapping["kind"] == "graph"
    ops = [o["op"] for o in mapping["ops"]]
    assert ops[0] == "aten.t.default" or "aten.mm.default" in ops
    assert "aten._softmax.default" in ops and "aten.sum.default" in ops
    line = next(i for i, text in enumerate(open(__file__), 1) if "# the ops" in text)
    mm = next(o for o in mapping["ops"] if o["op"] == "aten.mm.default")
    assert mm["site"].split(" ")[0].endswith(f"{HERE}:{line}")
    assert mm["detail"].startswith("aten.mm.default(float32[9, 5], float32[5, 9])")


def test_programs_from_the_disk_cache_are_dumped_too(dump_dir, monkeypatch):
    from torch_pjrt.eager import graph, tiers

    monkeypatch.setattr(tiers, "enabled", False)  # the graph's own program, not its ops'
    x = torch.randn(4, 13).to("pjrt")
    (x.cos() * 3).sum().item()
    graph.forget()
    for f in os.listdir(dump_dir):
        os.remove(dump_dir / f)
    (x.cos() * 3).sum().item()
    (program,) = [p for p in watch.programs() if p.loads]
    stem = dump_dir / program.name
    _parse_stablehlo((stem.parent / f"{program.name}.stablehlo.mlir").read_text())
    assert (stem.parent / f"{program.name}.hlo.txt").read_text().startswith("HloModule")



def test_compiled_graph_map_names_fx_nodes_and_their_lines(dump_dir):
    def f(x):
        y = x.sin() * 2  # the traced line
        return y.sum()

    torch._dynamo.reset()
    with torch._functorch.config.patch(enable_autograd_cache=False):
        torch.compile(f, backend="pjrt")(torch.randn(6, 4).to("pjrt")).item()
    maps = [json.loads(p.read_text()) for p in dump_dir.glob("*.map.json")]
    (mapping,) = [m for m in maps if m["kind"] == "compiled"]
    assert mapping["name"].startswith("compiled-")
    nodes = {o["op"]: o for o in mapping["ops"]}
    assert nodes["sin"]["detail"] == "aten.sin.default"
    line = next(i for i, text in enumerate(open(__file__), 1) if "# the traced line" in text)
    assert nodes["sin"]["site"].split(" ")[0].endswith(f"{HERE}:{line}")

"""The pjrt device: registration, device module, indices, async execution, synchronize."""

import subprocess
import sys

import pytest
import torch

import torch_pjrt


def test_import_torch_alone_registers_pjrt():
    """...and starts nothing: PJRT starts at the first op (runtime.ensure_initialized)."""
    code = ("import torch; from jax._src import xla_bridge; import torch_pjrt.runtime as r; "
            "print(r._initialized, bool(xla_bridge._backends)); "
            "t = torch.ones(2, device='pjrt'); print(t.device, torch.pjrt.device_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "pjrt:0", "2"]


@pytest.mark.parametrize("collecting", [True, False])
def test_starting_leaves_garbage_collection_as_it_was(collecting):
    """PJRT's start pauses Python's cyclic collection (runtime._collections_paused) and
    gives back the state it found, on or off; a cycle made after it is collected."""
    code = ("import gc, weakref, torch\n"
            f"gc.enable() if {collecting} else gc.disable()\n"
            "torch.ones(2, device='pjrt').cpu()\n"
            "print(gc.isenabled())\n"
            "class C: pass\n"
            "c = C(); c.self = c; r = weakref.ref(c); del c\n"
            "gc.collect(); print(r() is None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(collecting), "True"]


def test_autoload_can_be_disabled():
    code = "import torch; print(hasattr(torch, 'pjrt'))"
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.stdout.strip() == "False", out.stderr


def test_device_module_and_accelerator():
    assert torch.pjrt.is_available()
    assert torch.pjrt.device_count() == 2
    assert torch.accelerator.current_accelerator().type == "pjrt"
    assert torch.accelerator.device_count() == 2
    t = torch.ones(2, device="pjrt")
    assert t.is_pjrt and t.device == torch.device("pjrt:0")
    assert torch.pjrt.get_device_name().startswith("cpu")


def test_host_allocator_pins_and_empties():
    # vLLM calls torch.accelerator.empty_host_cache() at shutdown: it segfaulted without a
    # host allocator registered for the device
    pinned = torch.ones(4).pin_memory()
    assert pinned.is_pinned()
    torch.accelerator.empty_host_cache()
    assert torch.ones(2, device="pjrt").sum().item() == 2.0


def test_second_device_and_copies_between_devices():
    a = torch.arange(6.0).reshape(2, 3)
    d0 = a.to("pjrt:0")
    d1 = a.to("pjrt:1")
    assert d1.device == torch.device("pjrt:1")
    assert (d1 * 2).device == torch.device("pjrt:1")
    moved = d0.to("pjrt:1")
    assert moved.device.index == 1
    torch.testing.assert_close(moved.cpu(), a)
    back = (d1 + 1).t().to("pjrt:0")
    torch.testing.assert_close(back.cpu(), (a + 1).t())
    with pytest.raises(RuntimeError, match="same device"):
        d0 + d1


def test_set_device_and_device_context():
    assert torch.pjrt.current_device() == 0
    with torch.pjrt.device(1):
        assert torch.pjrt.current_device() == 1
        assert torch.zeros(1, device="pjrt").device.index == 1
    assert torch.pjrt.current_device() == 0
    with pytest.raises(RuntimeError, match="invalid device index"):
        torch.zeros(1, device="pjrt:5")


def test_execution_is_asynchronous_and_synchronize_waits():
    import time

    with torch_pjrt.set_eager_mode("strict"):
        x = torch.randn(1024, 1024, device="pjrt")
        torch.pjrt.synchronize()
        x @ x  # warm the executable cache
        torch.pjrt.synchronize()
        start = time.perf_counter()
        ys = [x @ x for _ in range(8)]
        launched = time.perf_counter() - start
        torch.accelerator.synchronize()
        finished = time.perf_counter() - start
    assert launched < finished / 2, (launched, finished)
    assert all(y.device.type == "pjrt" for y in ys)


@pytest.mark.parametrize("sync", ["pjrt", "accelerator"])
def test_synchronize_runs_the_pending_graph_and_raises_device_errors(sync):
    """Both synchronize() entry points (torch.pjrt's and torch.accelerator's, through the
    native hook) run the fused graph, wait for it and raise its device-side check errors."""
    from torch_pjrt.eager import graph
    from torch_pjrt.storage import table

    synchronize = torch.pjrt.synchronize if sync == "pjrt" else torch.accelerator.synchronize
    with torch_pjrt.set_eager_mode("fused"):
        x = torch.arange(4.0, device="pjrt")
        y = x * 2 + 1
        assert graph.pending_ops() > 0
        synchronize()
        assert graph.pending_ops() == 0
        assert not getattr(table.record_of(y).value, "pending", False)
        x[torch.tensor([7], device="pjrt")]
        with pytest.raises(IndexError, match="is out of bounds for dimension 0 with size 4"):
            synchronize()
        synchronize()  # reported once


def test_streams_and_events_wait_for_the_device():
    s = torch.pjrt.current_stream()
    x = torch.randn(256, 256, device="pjrt")
    y = x @ x
    e = torch.Event(device="pjrt")
    e.record()
    e.synchronize()
    s.synchronize()
    assert torch.isfinite(y).all().item()


EXIT_WITH_WORK_IN_FLIGHT = """
import gc, torch, torch_pjrt
torch_pjrt.set_eager_mode("strict")
x = torch.randn(2048, 2048, device="pjrt")
g = torch.ones_like(x)
keep = [torch.ops.aten.gelu_backward(g, x) for _ in range(40)]  # ATen's kernel in XLA
gc.freeze()  # nothing is freed at exit, so no buffer's deletion waits for its program
"""


def test_exit_waits_for_programs_still_running():
    """A process that exits while its programs run (here, libtorch's GELU backward inside
    XLA programs on the cpu platform) must not crash as libtorch's static objects go: it
    segfaulted every time before the exit hook waited for them."""
    out = subprocess.run([sys.executable, "-c", EXIT_WITH_WORK_IN_FLIGHT], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])

"""PyTorch's accelerator contract, as a library reaches it: torch.accelerator's device,
stream, event, memory and capability calls, the device-generic generator, guard, AMP,
compiler, profiler and distributed entry points, each on pjrt (docs/accelerator.md lists
the items of PyTorch's integration guide and where each is tested or why it does not
apply)."""

import gc
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

A = torch.accelerator


def _fresh(code: str, **env) -> dict:
    """Run `code` in a new process (autoload on) and return the JSON it prints last."""
    e = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"rc {out.returncode}\n{out.stdout}\n{out.stderr[-3000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------- a new process
FRESH = """
import json, sys, torch
a = torch.accelerator
# before the device starts: nothing to read, and nothing starts PJRT (as torch.cuda's)
r = [a.memory_stats(), a.memory_allocated(), torch.pjrt.memory_stats(),
     torch.pjrt.memory_allocated(), torch.pjrt.max_memory_allocated()]
a.empty_cache(); a.reset_peak_memory_stats(); torch.pjrt.reset_peak_memory_stats()
# Dynamo's interface, registered when Dynamo's registry is first imported
r.append('torch._dynamo' in sys.modules)
from torch._dynamo.device_interface import get_interface_for_device
di = get_interface_for_device('pjrt')
r += [di.__name__, di.is_available(), torch.pjrt.is_initialized()]
# empty_host_cache dereferenced a missing host allocator (a segfault) after a pjrt tensor
x = torch.ones(3, device='pjrt'); p = torch.ones(3).pin_memory()
a.empty_host_cache(); a.empty_cache()
r += [p.is_pinned(), x.sum().item(), di.is_available()]
print(json.dumps(r))
"""


def test_a_new_process_before_and_after_the_device_starts():
    assert _fresh(FRESH) == [{}, 0, {}, 0, 0, False, "PjrtInterface", False, False,
                             True, 3.0, True]


# ------------------------------------------------------------------------ device, hooks
def test_torch_accelerator_is_pjrt_with_its_devices():
    assert A.current_accelerator() == torch.device("pjrt")
    assert A.is_available() and A.device_count() == torch.pjrt.device_count() == 2
    assert torch.get_device_module("pjrt") is torch.pjrt


def test_device_index_switches_the_current_device_and_restores_it():
    assert A.current_device_index() == 0
    with A.device_index(1):
        assert A.current_device_index() == torch.pjrt.current_device() == 1
        assert torch.empty(2, device="pjrt").device == torch.device("pjrt:1")
    assert A.current_device_index() == 0
    with pytest.raises(RuntimeError, match="invalid device index"):
        A.set_device_index(5)


def test_device_guard_of_a_tensor_on_the_other_device():
    x = torch.ones(3, device="pjrt:1")
    with torch.device("pjrt:1"):
        y = torch.zeros(3)
    assert y.device == x.device == torch.device("pjrt:1")
    assert ((x + y).cpu() == 1).all()
    assert A.current_device_index() == 0


def test_pinned_host_memory():
    x = torch.arange(8.0).pin_memory()
    assert x.is_pinned() and not torch.arange(8.0).is_pinned()
    assert torch.equal(x.to("pjrt", non_blocking=True).cpu(), torch.arange(8.0))


# ----------------------------------------------------------------------- generator
def test_device_generators_through_torch_entry_points():
    torch.manual_seed(7)  # seeds every device's default generator, pjrt's too
    assert torch.pjrt.initial_seed() == 7
    a = torch.randn(4, device="pjrt")
    state = torch.pjrt.get_rng_state()
    b = torch.randn(4, device="pjrt")
    torch.pjrt.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="pjrt").cpu(), b.cpu())
    assert not torch.equal(a.cpu(), b.cpu())
    g = torch.Generator("pjrt").manual_seed(3)
    first = torch.rand(4, device="pjrt", generator=g).cpu()
    g.manual_seed(3)
    assert torch.equal(torch.rand(4, device="pjrt", generator=g).cpu(), first)
    assert g.device == torch.device("pjrt:0")


# ---------------------------------------------------------------- streams and events
def test_streams_through_torch_accelerator():
    s = A.current_stream()
    assert s.device == torch.device("pjrt:0") and s == torch.pjrt.current_stream()
    A.set_stream(torch.Stream(device="pjrt"))
    x = torch.ones(1000, device="pjrt") * 2
    s.synchronize()
    assert s.query()
    with torch.pjrt.stream(s):
        assert (x.cpu() == 2).all()
    A.synchronize()


def test_events_record_wait_and_time():
    start = torch.Event(device="pjrt", enable_timing=True)
    end = torch.Event(device="pjrt", enable_timing=True)
    start.record()
    y = torch.ones(256, 256, device="pjrt") @ torch.ones(256, 256, device="pjrt")
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    end.wait(A.current_stream())
    assert y[0, 0].item() == 256
    assert isinstance(start, torch.pjrt.Event)


# ---------------------------------------------------------------------- memory
def test_torch_accelerator_memory_calls_agree_with_torch_pjrt():
    gc.collect()
    A.reset_peak_memory_stats()
    base = A.memory_allocated()
    assert base == torch.pjrt.memory_allocated()
    x = torch.empty(1000, 1000, device="pjrt")
    assert A.memory_allocated() == torch.pjrt.memory_allocated() == base + 4_000_000
    assert A.memory_reserved() == torch.pjrt.memory_reserved() == base + 4_000_000
    del x
    gc.collect()
    assert A.memory_allocated() == base
    assert A.max_memory_allocated() == torch.pjrt.max_memory_allocated() >= base + 4_000_000
    assert A.max_memory_reserved() == torch.pjrt.max_memory_reserved() >= base + 4_000_000
    assert A.memory_stats() == torch.pjrt.memory_stats()
    assert A.memory_stats(1) == torch.pjrt.memory_stats("pjrt:1")
    A.reset_peak_memory_stats()
    assert A.max_memory_allocated() == A.memory_allocated() == base


def test_memory_stats_have_cuda_keys_and_count_allocations():
    gc.collect()
    A.reset_accumulated_memory_stats()
    A.reset_peak_memory_stats()
    live = A.memory_stats()["allocation.all.current"]
    xs = [torch.empty(256, device="pjrt") for _ in range(3)]
    s = A.memory_stats()
    # what TorchTitan's memory monitor and accelerate read
    for key in ("allocated_bytes.all.peak", "active_bytes.all.peak", "reserved_bytes.all.peak",
                "num_alloc_retries", "num_ooms", "allocation.all.current",
                "requested_bytes.all.current", "segment.all.current", "inactive_split.all.current"):
        assert key in s, key
    assert s["allocation.all.allocated"] == 3 and s["allocation.all.freed"] == 0
    assert s["allocation.all.current"] == s["allocation.all.peak"] == live + 3
    assert s["allocated_bytes.all.allocated"] == 3 * 1024 and s["num_device_alloc"] == 3
    assert s["num_alloc_retries"] == 0 and s["allocated_bytes.small_pool.current"] == 0
    del xs
    gc.collect()
    s = A.memory_stats()
    assert s["allocation.all.freed"] == 3 and s["allocated_bytes.all.freed"] == 3 * 1024
    assert s["allocation.all.current"] == live and s["allocation.all.peak"] == live + 3
    A.reset_accumulated_memory_stats()
    s = A.memory_stats()
    assert s["allocation.all.allocated"] == s["allocation.all.freed"] == 0
    assert s["allocated_bytes.all.allocated"] == s["allocated_bytes.all.freed"] == 0


def test_out_of_memory_is_counted_in_both():
    from torch_pjrt.runtime import memory

    m = memory.device(0)
    old = m.limit
    ooms = A.memory_stats()["num_ooms"]
    try:
        m.set_limit(m.allocated + (1 << 20))
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1 << 22, device="pjrt")
    finally:
        m.set_limit(old)
    assert A.memory_stats()["num_ooms"] == torch.pjrt.memory_stats()["num_ooms"] == ooms + 1


def test_memory_info_empty_cache_and_empty_host_cache():
    free, total = A.get_memory_info()
    assert (free, total) == torch.pjrt.mem_get_info()
    assert total == torch.pjrt.get_device_properties(0).total_memory
    assert free == total - A.memory_allocated()
    A.empty_cache()
    A.empty_host_cache()


def test_device_capability():
    cap = torch.pjrt.get_device_capability()
    assert cap == A.get_device_capability() == torch.pjrt.get_device_capability("pjrt:1")
    dtypes = cap["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool} <= dtypes
    for dtype in dtypes:
        assert torch.zeros(2, dtype=dtype, device="pjrt").dtype == dtype
    assert torch.complex32 in dtypes  # stored as its float16 parts (storage/dtypes.py)
    assert torch.float8_e8m0fnu not in dtypes


# ------------------------------------------------------------------------ compiler
def test_dynamo_device_interface():
    from torch._dynamo.device_interface import get_interface_for_device

    di = get_interface_for_device("pjrt")
    assert get_interface_for_device(torch.device("pjrt:1")) is di
    torch.ones(1, device="pjrt")
    assert di.is_available() and di.device_count() == 2 and di.current_device() == 0
    assert di.exchange_device(1) == 0 and di.current_device() == 1
    assert di.maybe_exchange_device(0) == 1 and di.current_device() == 0
    assert di.get_raw_stream(0) == 0 and di.current_stream() == A.current_stream()
    assert di.is_bf16_supported() and di.is_dtype_supported(torch.float64)
    assert di.memory_allocated() == A.memory_allocated()
    assert di.Worker.get_device_properties(0).total_memory > 0
    with di.device(1):
        assert di.current_device() == 1
    di.synchronize()
    e = di.Event(enable_timing=True)
    assert isinstance(e, torch.Event) and e.device.type == "pjrt"


def test_compile_backend_is_listed_and_runs():
    import torch._dynamo

    assert "pjrt" in torch._dynamo.list_backends()
    f = torch.compile(lambda x: torch.relu(x * 2 - 1), backend="pjrt")
    x = torch.randn(8)
    torch.testing.assert_close(f(x.to("pjrt")).cpu(), torch.relu(x * 2 - 1))


# --------------------------------------------------------------------- AMP, profiler
def test_autocast_entry_points():
    assert torch.amp.is_autocast_available("pjrt")
    assert torch.pjrt.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        y = torch.ones(4, 4, device="pjrt") @ torch.ones(4, 4, device="pjrt")
    assert y.dtype == torch.bfloat16
    assert torch.amp.GradScaler("pjrt").is_enabled()


def test_profiler_activity():
    assert torch.profiler.ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


# --------------------------------------------------------------------- distributed
def test_distributed_backend_registered_for_the_device():
    assert "pjrt" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["pjrt"] == "pjrt"

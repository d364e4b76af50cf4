"""Device memory accounting: real buffer bytes, back to baseline after tensors die."""

import gc

import pytest
import torch


def test_allocation_is_counted_and_released():
    gc.collect()
    base = torch.pjrt.memory_allocated()
    x = torch.empty(1000, 1000, device="pjrt")
    assert torch.pjrt.memory_allocated() == base + 4_000_000
    assert torch.pjrt.max_memory_allocated() >= base + 4_000_000
    y = x[::2]  # a view holds the same storage
    del x
    assert torch.pjrt.memory_allocated() == base + 4_000_000
    del y
    assert torch.pjrt.memory_allocated() == base
    stats = torch.pjrt.memory_stats()
    assert stats["allocated_bytes.all.current"] == base


def test_ten_thousand_iterations_do_not_grow():
    w = torch.randn(64, 64, device="pjrt")
    for _ in range(100):
        (w @ w).relu_().sum()
    gc.collect()
    base = torch.pjrt.memory_allocated()
    for _ in range(10_000):
        y = (w * 2 + 1).sum()
    del y
    gc.collect()
    assert torch.pjrt.memory_allocated() == base


def test_out_of_memory_is_torch_out_of_memory_error():
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.empty(1 << 50, device="pjrt")
    # the failed allocation left nothing behind
    x = torch.ones(4, device="pjrt")
    assert x.sum().item() == 4


def test_cuda_allocator_keys_that_training_loops_read():
    """TorchTitan's memory monitor reads these keys of torch.cuda.memory_stats() and
    get_device_properties(d).total_memory."""
    gc.collect()
    torch.pjrt.reset_peak_memory_stats()
    base = torch.pjrt.memory_allocated()
    x = torch.empty(1000, 1000, device="pjrt")
    del x
    gc.collect()
    stats = torch.pjrt.memory_stats(0)
    assert stats["active_bytes.all.current"] == stats["reserved_bytes.all.current"] == base
    assert stats["active_bytes.all.peak"] == stats["reserved_bytes.all.peak"] >= base + 4_000_000
    assert stats["num_alloc_retries"] == 0 and stats["num_ooms"] >= 0
    props = torch.pjrt.get_device_properties(torch.device("pjrt", 0))
    assert props.total_memory == torch.pjrt.mem_get_info(0)[1] > 0
    assert props.name == torch.pjrt.get_device_name(0)

"""Scalar reads of single elements (item(), bool(), iterating a tensor): a small storage
comes to the host once and its elements are read from that copy, with CPU PyTorch's values,
and a write to the storage is seen by the next read."""

import pytest
import torch

from torch_pjrt import counters

pytestmark = pytest.mark.usefixtures("eager_mode")


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int64, torch.float16,
                                   torch.bfloat16, torch.float64, torch.complex64])
def test_elements_of_views_read_as_on_cpu(dtype):
    cpu = (torch.arange(24) - 7).reshape(4, 6).to(dtype)
    if dtype.is_complex:
        cpu = cpu + 1j * cpu.flip(0)
    dev = cpu.to("pjrt")
    for c, d in ((cpu, dev), (cpu.t(), dev.t()), (cpu[1:, 2::3], dev[1:, 2::3])):
        assert [x.item() for x in d.flatten()] == [x.item() for x in c.flatten()]
        assert list(map(bool, d.flatten())) == list(map(bool, c.flatten()))


def test_a_write_after_a_read_is_seen():
    dev = torch.zeros(10, device="pjrt")
    assert dev[3].item() == 0.0
    dev[3] = 5.0
    assert dev[3].item() == 5.0
    dev.view(2, 5)[0].add_(1)
    assert [x.item() for x in dev] == [1.0, 1.0, 1.0, 6.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_iterating_a_tensor_copies_its_storage_once():
    cond = torch.arange(100_000, device="pjrt") >= 0
    cond[:1].item()  # computed and read: the reads below reuse the host copy
    before = counters.value("device_to_host_bytes")
    assert all(cond)
    assert counters.value("device_to_host_bytes") == before


def test_a_large_storage_reads_its_element_alone():
    big = torch.arange(2_000_000, dtype=torch.float32, device="pjrt")  # 8 MB: past the limit
    before = counters.value("device_to_host_bytes")
    assert big[1_234_567].item() == 1_234_567.0
    assert counters.value("device_to_host_bytes") - before == 4

"""Byte slices of a storage (UntypedStorage[start:stop]: PyTorch makes a storage whose data
pointer is the old one plus `start`). pjrt's buffers belong to whole storages: a slice at
the storage's start is the storage's own buffer, as on the CPU; a slice starting inside it
reads the bytes of the storage's buffer, and writing through it raises rather than drop
the write."""

import pytest
import torch
from helpers import assert_same

pytestmark = pytest.mark.usefixtures("eager_mode")


def _bytes(storage):
    return torch.tensor([], dtype=torch.uint8, device=storage.device).set_(storage)


def test_slice_at_the_start_reads_the_storage():
    cpu = torch.arange(-7, 8, dtype=torch.int32)
    dev = cpu.to("pjrt")
    assert_same(_bytes(dev.untyped_storage()[0:8]), _bytes(cpu.untyped_storage()[0:8]))


@pytest.mark.parametrize("start", [4, 256, 3])
def test_slice_inside_a_storage_reads_its_bytes(start):
    dev = torch.arange(1.0, 1001.0, device="pjrt")
    cpu_value = _bytes(dev.cpu().untyped_storage()[start:start + 4])
    assert cpu_value.any()  # the CPU reads real bytes there: zeros would be wrong
    assert_same(_bytes(dev.untyped_storage()[start:start + 4]), cpu_value)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.float16, torch.int64])
def test_elements_through_byte_slices_like_pytorchs_test_storage(dtype):
    """PyTorch's test_storage reads each element through UntypedStorage[start:end]."""
    cpu = torch.arange(15).reshape(3, 5).to(dtype)
    dev = cpu.to("pjrt")
    size = cpu.element_size()
    for i in (0, 7, 14):
        got = list(dev.untyped_storage()[i * size:(i + 1) * size])
        assert got == list(cpu.untyped_storage()[i * size:(i + 1) * size])


def test_a_slice_sees_later_writes_to_its_storage():
    dev = torch.zeros(8, device="pjrt")
    piece = dev.untyped_storage()[4:8]
    dev[1] = 2.5
    assert_same(_bytes(piece), _bytes(torch.tensor([0.0, 2.5]).untyped_storage()[4:8]))


def test_write_through_a_slice_inside_raises():
    dev = torch.zeros(8, device="pjrt")
    with pytest.raises(RuntimeError, match="storage slice"):
        _bytes(dev.untyped_storage()[4:8]).fill_(1)
        torch.pjrt.synchronize()
    assert not dev.cpu().any()  # and the storage is untouched

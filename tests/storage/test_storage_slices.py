"""Byte slices of a storage (UntypedStorage[start:stop]: PyTorch makes a storage whose data
pointer is the old one plus `start`). pjrt's buffers belong to whole storages: a slice at
the storage's start is the storage's own buffer, as on the CPU; a slice starting inside it
has no buffer, and pjrt raises rather than read zeros or drop writes."""

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


@pytest.mark.parametrize("start", [4, 256])
def test_slice_inside_a_storage_raises(start):
    dev = torch.arange(1.0, 1001.0, device="pjrt")
    cpu_value = _bytes(dev.cpu().untyped_storage()[start:start + 4])
    assert cpu_value.any()  # the CPU reads real bytes there: zeros would be wrong
    with pytest.raises(RuntimeError, match="storage slice"):
        _bytes(dev.untyped_storage()[start:start + 4]).cpu()


def test_write_through_a_slice_inside_raises():
    dev = torch.zeros(8, device="pjrt")
    with pytest.raises(RuntimeError, match="storage slice"):
        _bytes(dev.untyped_storage()[4:8]).fill_(1)
        torch.pjrt.synchronize()

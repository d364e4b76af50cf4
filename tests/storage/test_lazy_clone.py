"""torch._lazy_clone (copy-on-write storages, which PyTorch's own COW tests and some
decompositions use) on pjrt: each side sees its own values after either side writes, as on
the CPU. pjrt copies the shared buffer at the first access through the storage's data
pointer (PyTorch's data_ptr() is a mutable access), not at the first write."""

import pytest
import torch
from helpers import assert_same

pytestmark = pytest.mark.usefixtures("eager_mode")

WRITES = {
    "add_": lambda t: t.add_(1),
    "mul_": lambda t: t.mul_(3),
    "fill_": lambda t: t.fill_(2),
    "view_zero_": lambda t: t.view(2, 3)[0].zero_(),
    "index_put_": lambda t: t.index_put_((torch.tensor([0, 4], device=t.device),),
                                         torch.tensor(7.0, device=t.device)),
}


def _lazy_pair(device):
    a = torch.arange(6.0, device=device)
    return a, torch._lazy_clone(a)


@pytest.mark.parametrize("name", list(WRITES))
@pytest.mark.parametrize("writer", ["clone", "source"])
def test_write_reaches_only_the_side_written(name, writer):
    results = {}
    for device in ("cpu", "pjrt"):
        a, b = _lazy_pair(device)
        WRITES[name](b if writer == "clone" else a)
        results[device] = (a, b)
    for cpu, dev in zip(results["cpu"], results["pjrt"]):
        assert_same(dev, cpu)


def test_write_after_the_other_side_died():
    a, b = _lazy_pair("pjrt")
    del a
    b.add_(1)
    assert_same(b, torch.arange(6.0) + 1)


def test_read_then_write_keeps_the_source():
    a, b = _lazy_pair("pjrt")
    c = b * 2  # a read: pjrt copies the shared buffer here
    b.sub_(10)
    a.add_(100)
    assert_same(c, torch.arange(6.0) * 2)
    assert_same(b, torch.arange(6.0) - 10)
    assert_same(a, torch.arange(6.0) + 100)

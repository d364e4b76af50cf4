"""torch._lazy_clone (copy-on-write storages, which PyTorch's own COW tests and some
decompositions use) on pjrt: each side sees its own values after either side writes, as on
the CPU. As on the CPU, reads go through the shared buffer and only the first write copies
it (PyTorch's test_cow_input checks that an op reading a lazy clone leaves it unmaterialized)."""

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


READS = {
    "mul": lambda t: t * 2,
    "sum": lambda t: t.sum(),
    "index_select": lambda t: t.index_select(0, torch.tensor([1, 3], device=t.device)),
    "view_neg": lambda t: t.view(2, 3).neg(),
    "add_into_other": lambda t: torch.zeros(6, device=t.device).add_(t),
    "cpu": lambda t: t.cpu(),
}


@pytest.mark.parametrize("name", list(READS))
def test_a_read_leaves_both_sides_lazy(name):
    outs = {}
    for device in ("cpu", "pjrt"):
        a, b = _lazy_pair(device)
        outs[device] = READS[name](b)
        assert torch._C._is_cow_tensor(b), (device, name)
        assert torch._C._is_cow_tensor(a), (device, name)
    if name == "cpu":
        assert torch.equal(outs["pjrt"], outs["cpu"])
    else:
        assert_same(outs["pjrt"], outs["cpu"])


def test_read_then_write_keeps_the_source():
    a, b = _lazy_pair("pjrt")
    c = b * 2  # a read: the buffer stays shared
    b.sub_(10)
    a.add_(100)
    assert_same(c, torch.arange(6.0) * 2)
    assert_same(b, torch.arange(6.0) - 10)
    assert_same(a, torch.arange(6.0) + 100)

"""Reading one tensor while later work runs (dispatch.to_cpu_own: a serving loop reads a
step's tokens as the next step runs): the CPU's values, and device-side checks raised
once computed, at that read or a later synchronization, never dropped."""

import numpy as np
import pytest
import torch

from torch_pjrt.eager.dispatch import to_cpu_own
from torch_pjrt.lowering import checks
from torch_pjrt.storage import table

pytestmark = pytest.mark.usefixtures("eager_mode")


def test_values_of_a_pending_view_equal_the_cpu():
    x = torch.arange(12.0).reshape(3, 4)
    out = to_cpu_own((x.to("pjrt") * 2 + 1)[1:, ::2])
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, (x * 2 + 1)[1:, ::2])


def test_a_computed_check_is_raised(eager_mode):
    d = torch.arange(4.0, device="pjrt")
    ok = d + 1
    with pytest.raises(IndexError, match="index 4 is out of bounds"):
        bad = d[torch.tensor([4], device="pjrt")]  # debug mode raises here
        table.read_record(bad).get().block_until_ready()  # computed, not read
        to_cpu_own(ok)


class _Running:
    """Check flags of a program still running: not ready until told."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows, self.ready = rows, False

    def is_ready(self) -> bool:
        return self.ready

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.rows


def test_a_check_still_running_is_raised_at_a_later_synchronization(eager_mode):
    flags = _Running(np.array([[1, 7]], dtype=np.int32))
    checks.defer(flags, [(IndexError, "index {0} is out of bounds", None, "i")], "an op")
    if eager_mode == "debug":  # every op waits for the checks before it
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            torch.arange(3.0, device="pjrt") + 1
        return
    assert to_cpu_own(torch.arange(3.0, device="pjrt") + 1).tolist() == [1.0, 2.0, 3.0]
    flags.ready = True
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        torch.pjrt.synchronize()

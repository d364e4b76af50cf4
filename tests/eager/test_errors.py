"""Bad input raises PyTorch's own errors, before any device work."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("eager_mode")


def test_shape_mismatch():
    a, b = torch.ones(2, 3, device="pjrt"), torch.ones(4, device="pjrt")
    with pytest.raises(RuntimeError, match="must match the size|broadcast a dimension of length 4"):
        a + b
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim|size mismatch"):
        a @ a


def test_bad_dim():
    with pytest.raises(IndexError, match="Dimension out of range"):
        torch.ones(2, 3, device="pjrt").sum(5)


def test_dtype_error():
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(2, dtype=torch.long, device="pjrt").add_(torch.ones(2, device="pjrt") * 0.5)


def test_device_mismatch_and_cpu_scalars():
    d = torch.ones(3, device="pjrt")
    with pytest.raises(RuntimeError, match="same device"):
        d + torch.ones(3)
    # 0-dim CPU tensors are allowed, as on CUDA
    assert torch.equal((d * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


def test_index_out_of_range_is_an_error_not_a_clamp():
    d = torch.arange(4.0, device="pjrt")
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size 4"):
        d[torch.tensor([4], device="pjrt")].cpu()
    with pytest.raises(IndexError, match="index -5 is out of bounds"):
        d[torch.tensor([-5], device="pjrt")].tolist()
    assert d[torch.tensor([-1], device="pjrt")].item() == 3.0

"""torch.pjrt's legacy typed-storage classes answer as the CPU's do for CPU tensors."""

import warnings

import pytest
import torch

from torch_pjrt.runtime import legacy_storage as legacy

pytestmark = [pytest.mark.usefixtures("eager_mode"),
              pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")]

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128]


@pytest.mark.parametrize("dtype", DTYPES)
def test_storage_type_is_the_device_twin_of_the_cpu_class(dtype):
    x = torch.ones(4, dtype=dtype)
    cpu_class = x.storage_type()
    pjrt_class = x.to("pjrt").storage_type()
    assert pjrt_class is getattr(torch.pjrt, cpu_class.__name__)
    assert pjrt_class is not cpu_class
    assert pjrt_class.dtype == cpu_class.dtype == dtype
    assert f"{pjrt_class.__module__}.{pjrt_class.__name__}" == f"torch.pjrt.{cpu_class.__name__}"


def test_isinstance_checks_device_and_dtype():
    d = torch.arange(3.0, device="pjrt")
    assert isinstance(d.storage(), torch.pjrt.FloatStorage)
    assert not isinstance(d.storage(), torch.FloatStorage)
    assert not isinstance(d.storage(), torch.pjrt.DoubleStorage)
    assert not isinstance(d.cpu().storage(), torch.pjrt.FloatStorage)
    assert d.storage().type() == "torch.pjrt.FloatStorage"


def test_constructing_one_makes_a_pjrt_storage_with_the_cpu_values():
    cpu = torch.LongStorage([1, -2, 2**40])
    dev = torch.pjrt.LongStorage([1, -2, 2**40])
    assert dev.device.type == "pjrt"
    assert dev.dtype == cpu.dtype
    assert dev.tolist() == cpu.tolist()
    empty = torch.pjrt.HalfStorage(5)
    assert (empty.device.type, empty.dtype, len(empty)) == ("pjrt", torch.float16, 5)


def test_saved_tensor_round_trips(tmp_path):
    d = torch.arange(6.0, device="pjrt").view(2, 3)
    torch.save(d, tmp_path / "t.pt")
    back = torch.load(tmp_path / "t.pt")
    assert back.device.type == "pjrt"
    assert torch.equal(back.cpu(), d.cpu())


def test_host_memory_constructors_refused():
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="from_buffer.*pjrt"):
        warnings.simplefilter("ignore")
        torch.pjrt.FloatStorage.from_buffer(b"\0" * 8)


def test_no_quantized_classes():
    assert "QInt8Storage" not in legacy.CLASSES
    assert set(legacy.CLASSES) <= set(torch.pjrt.__all__)

"""print, item, tolist, numpy, save/load, state_dict and module.to with pjrt tensors."""

import io

import pytest
import torch

pytestmark = pytest.mark.usefixtures("eager_mode")


def test_print_item_tolist():
    x = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    d = x.to("pjrt")
    assert "device='pjrt:0'" in repr(d)
    assert str(x).split("]]")[0] == str(d).split("]]")[0]
    assert d[1, 1].item() == 4.25
    assert d.tolist() == x.tolist()
    assert bool(d[0, 0] > 1)
    assert int(d.sum()) == int(x.sum())
    assert d.cpu().numpy().tolist() == x.numpy().tolist()


def test_numpy_raises_like_cuda():
    with pytest.raises(TypeError, match="can't convert pjrt:0 device type tensor to numpy"):
        torch.ones(2, device="pjrt").numpy()


def test_save_and_load_tensors_and_models():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("pjrt")
    assert all(p.device.type == "pjrt" for p in model.parameters())
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "t": torch.arange(4, device="pjrt")}, buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    for k, v in ref.items():
        assert torch.equal(on_cpu["model"][k], v)
    buf.seek(0)
    loaded = torch.load(buf, map_location="pjrt")
    assert loaded["t"].device.type == "pjrt"
    assert torch.equal(loaded["t"].cpu(), torch.arange(4))
    buf.seek(0)
    native = torch.load(buf)  # saved from pjrt, loads back onto pjrt
    assert native["t"].device.type == "pjrt"
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    fresh.to("pjrt").load_state_dict(loaded["model"])
    x = torch.randn(5, 3)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    cpu_model.load_state_dict(ref)
    torch.testing.assert_close(fresh(x.to("pjrt")).cpu(), cpu_model(x))


def test_save_whole_module_and_views():
    base = torch.arange(10.0, device="pjrt")
    view = base[2:5]
    buf = io.BytesIO()
    torch.save([base, view], buf)
    buf.seek(0)
    b, v = torch.load(buf, map_location="pjrt")
    v.fill_(-1)  # the saved view still aliases its base after loading
    assert b.cpu()[2:5].tolist() == [-1, -1, -1]


def test_moving_a_cpu_tensor_leaves_it_resizable():
    """x.to("pjrt") copies x and leaves x as it was: its storage stays resizable, so an
    out= or resize_ on it works afterwards (a transfer through x.numpy() had tied it to
    numpy: 'Trying to resize storage that is not resizable'; found by the fuzzer)."""
    for dtype in (torch.float32, torch.bfloat16, torch.bool, torch.complex64):
        x = torch.ones(2, 3, dtype=dtype)
        assert torch.equal(x.t().to("pjrt").cpu(), x.t())
        assert torch.equal(x.to("pjrt").cpu(), x)
        x.resize_(10)
        out = torch.empty(0, dtype=dtype)
        out.to("pjrt")
        torch.add(x, x, out=out)

"""Moving a module to and from pjrt keeps PyTorch's identities: a Parameter stays the same
object (so tied weights stay tied and an optimizer built before the move still holds the
model's parameters), as it does for CUDA; parameters and buffers share what they shared."""

import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize


class Tied(nn.Module):
    """A tiny language model whose output head is its input embedding (as GPT-2's, BERT's
    and T5's are), with a buffer registered in two modules."""

    def __init__(self, vocab=11, d=6, tied=True):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        scale = torch.linspace(0.5, 1.5, d)
        self.mid.register_buffer("scale", scale)
        self.head.register_buffer("scale", scale if tied else scale.clone())
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, idx):
        h = torch.tanh(self.mid(self.emb(idx)) * self.mid.scale)
        return self.head(h * self.head.scale)


def _sharing(module: nn.Module, buffers: bool = True) -> list:
    """Every parameter (and buffer) name with the first name of the same object and of the
    same storage: what `is` and storage sharing look like, comparable across devices."""
    entries = [*module.named_parameters(remove_duplicate=False),
               *(module.named_buffers(remove_duplicate=False) if buffers else ())]
    first_obj, first_storage, out = {}, {}, []
    for name, t in entries:
        obj = first_obj.setdefault(id(t), name)
        storage = first_storage.setdefault(
            (t.device, t.untyped_storage().data_ptr()), name)
        out.append((name, obj, storage, type(t).__name__, t.requires_grad))
    return out


def _objects(module: nn.Module) -> dict:
    return {name: p for name, p in module.named_parameters(remove_duplicate=False)}


# name: (move(module, device, other device), where the tensors end); the CPU reference runs
# the same move with "cpu" for both devices.
MOVES = {
    "to": (lambda m, d, _: m.to(d), "pjrt:0"),
    "to_device_obj": (lambda m, d, _: m.to(torch.device(d)), "pjrt:0"),
    "to_device_dtype": (lambda m, d, _: m.to(d, torch.float64), "pjrt:0"),
    "to_kwargs": (lambda m, d, _: m.to(device=d, dtype=torch.bfloat16), "pjrt:0"),
    "to_empty": (lambda m, d, _: m.to_empty(device=d), "pjrt:0"),
    "then_half": (lambda m, d, _: m.to(d).half(), "pjrt:0"),
    "then_bfloat16_float": (lambda m, d, _: m.to(d).bfloat16().float(), "pjrt:0"),
    "then_double": (lambda m, d, _: m.to(d).double(), "pjrt:0"),
    "then_cpu": (lambda m, d, _: m.to(d).cpu(), "cpu"),
    "then_to_cpu_dtype": (lambda m, d, _: m.to(d).to("cpu", torch.float64), "cpu"),
    "second_device": (lambda m, _, d1: m.to(d1), "pjrt:1"),
    "first_then_second": (lambda m, d, d1: m.to(d).to(d1), "pjrt:1"),
}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("move", list(MOVES))
def test_move_keeps_parameter_objects(move, tied):
    """Each way of moving keeps every Parameter object (as CUDA does) and gives what the
    same conversions on the CPU give: sharing of parameters, values, dtypes."""
    fn, device = MOVES[move]
    model = Tied(tied=tied)
    model(torch.tensor([[1, 2, 3]])).sum().backward()  # gradients move with their parameters
    before = _objects(model)
    grads = {n: p.grad for n, p in before.items()}
    expected = fn(copy.deepcopy(model), "cpu", "cpu")
    assert fn(model, "pjrt:0", "pjrt:1") is model
    for name, p in _objects(model).items():
        assert p is before[name], f"{move}: {name} is a new Parameter"
        assert p.grad is grads[name], f"{move}: {name}.grad is a new tensor"
        assert p.grad.device == p.device and p.grad.dtype == p.dtype
    assert (model.head.weight is model.emb.weight) == tied
    # Buffers are not kept: Module._apply stores a new tensor per module, so a buffer
    # registered in two modules is two tensors after a move, on CUDA as here.
    assert _sharing(model, buffers=False) == _sharing(expected, buffers=False)
    state, ref = model.state_dict(keep_vars=True), expected.state_dict(keep_vars=True)
    assert list(state) == list(ref)
    for name, t in state.items():
        assert str(t.device) == device and t.dtype == ref[name].dtype, name
        if move != "to_empty":
            torch.testing.assert_close(t.detach().cpu(), ref[name].detach(), msg=name)


@pytest.mark.parametrize("opt", ["SGD", "AdamW"])
def test_tied_model_trains_as_on_cpu(eager_mode, opt):
    """A tied weight is one autograd leaf on pjrt: its gradient sums both uses, and a few
    optimizer steps give the CPU's losses and parameters, in every eager mode."""
    torch.manual_seed(0)
    cpu = Tied()
    dev = copy.deepcopy(cpu).to("pjrt")
    opts = [getattr(torch.optim, opt)(m.parameters(), lr=0.1) for m in (cpu, dev)]
    idx = torch.tensor([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]])
    for step in range(3):
        losses = []
        for model, o, x in ((cpu, opts[0], idx), (dev, opts[1], idx.to("pjrt"))):
            o.zero_grad()
            loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            losses.append(loss)
            if step == 0:
                assert model.emb.weight.grad is model.head.weight.grad
                grads = [p.grad for p in model.parameters()]
            o.step()
            if step == 0 and model is dev:
                for g, p in zip(grads, cpu.parameters()):
                    torch.testing.assert_close(g.cpu(), p.grad)
        torch.testing.assert_close(losses[1].cpu(), losses[0])
    for (name, p), e in zip(dev.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), e.detach(), msg=name)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_load_state_dict_assign(tied):
    """load_state_dict(assign=True) of pjrt tensors into a meta model shares what it shares
    when the tensors are CPU tensors; a copying load keeps the pjrt model's objects."""
    source = Tied(tied=tied)
    results = {}
    for device in ("cpu", "pjrt"):
        with torch.device("meta"):
            model = Tied(tied=tied)
        buf = io.BytesIO()
        torch.save(source.state_dict(), buf)
        buf.seek(0)  # what loading a checkpoint gives: tensors that share storage
        state = torch.load(buf, map_location=device)
        model.load_state_dict(state, assign=True)
        results[device] = _sharing(model)
        assert all(t.device.type == device for t in model.state_dict().values())
    assert results["pjrt"] == results["cpu"]

    model = Tied(tied=tied).to("pjrt")
    before = _objects(model)
    model.load_state_dict(source.state_dict())
    assert _objects(model) == before
    assert (model.head.weight is model.emb.weight) == tied
    torch.testing.assert_close(model.emb.weight.cpu(), source.emb.weight)


class Symmetric(nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).transpose(0, 1)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_parametrized_module_moves(tied):
    """A parametrized module (torch.nn.utils.parametrize) moves like its CPU conversion: the
    original stays one Parameter, shared where it was, and the parametrization still runs."""
    def build():
        torch.manual_seed(0)
        m = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 4)})
        if tied:
            m["b"].weight = m["a"].weight
        parametrize.register_parametrization(m["a"], "weight", Symmetric())
        return m

    ref = build().double()
    model = build()
    original = model["a"].parametrizations.weight.original
    model.to("pjrt").double()
    assert model["a"].parametrizations.weight.original is original
    assert _sharing(model) == _sharing(ref)
    w = model["a"].weight
    assert w.device.type == "pjrt"
    torch.testing.assert_close(w.cpu(), ref["a"].weight)
    torch.testing.assert_close(w.cpu(), w.cpu().T)


def test_set_data_across_devices():
    """`param.data = t` moves a Parameter between devices in place, as with CUDA, and
    refuses a tensor of an incompatible layout with PyTorch's error."""
    p = nn.Parameter(torch.arange(4.0))
    p.data = torch.ones(4, device="pjrt")
    assert isinstance(p, nn.Parameter) and p.requires_grad and p.device.type == "pjrt"
    (p * 2).sum().backward()
    assert p.grad.device.type == "pjrt"
    torch.testing.assert_close(p.grad.cpu(), torch.full((4,), 2.0))
    p.data = torch.zeros(4)
    assert p.device.type == "cpu" and p.grad.device.type == "pjrt"
    p.grad = None
    (p * 3).sum().backward()
    torch.testing.assert_close(p.grad, torch.full((4,), 3.0))
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        p.data = torch.zeros(4).to_sparse()
    q = torch.zeros(2, device="pjrt")
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        q.data = torch.zeros(2).to_sparse()
    assert torch._has_compatible_shallow_copy_type(torch.zeros(1), q)
    assert torch._has_compatible_shallow_copy_type(q, torch.zeros(1, dtype=torch.int8))
    assert not torch._has_compatible_shallow_copy_type(q, torch.zeros(1).to_sparse())


def test_optimizer_built_before_move():
    """An optimizer built before `.to("pjrt")` holds the model's parameters: its steps
    update the model, and its state dict loads back onto the moved parameters."""
    torch.manual_seed(0)
    cpu = Tied()
    dev = copy.deepcopy(cpu)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=0.1)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=0.1)
    dev.to("pjrt")
    idx = torch.tensor([[2, 7, 1, 8, 2, 8]])
    for _ in range(3):
        for model, opt, x in ((cpu, opt_cpu, idx), (dev, opt_dev, idx.to("pjrt"))):
            opt.zero_grad()
            F.cross_entropy(model(x)[0], x[0]).backward()
            opt.step()
    for (name, p), e in zip(dev.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), e.detach(), msg=name)
    state = opt_dev.state[dev.emb.weight]
    assert state["exp_avg"].device.type == "pjrt"
    opt_dev.load_state_dict(opt_cpu.state_dict())  # CPU state is cast to the param's device
    assert opt_dev.state[dev.emb.weight]["exp_avg"].device.type == "pjrt"

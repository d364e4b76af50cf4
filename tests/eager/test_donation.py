"""In-place updates donate their buffers, and XLA updates them in place: no copies."""

import re

import torch
import torch.nn as nn

import torch_pjrt
from torch_pjrt.eager import tiers
from torch_pjrt.runtime import compile_cache


def _programs(monkeypatch) -> list:
    """The (jitted, args) of every fused graph compiled from now on (each graph compiled
    at its flush: no op-by-op runs before it, eager/tiers.py)."""
    seen = []
    real = compile_cache.compile

    def compile(jitted, args, *rest, **kw):
        seen.append((jitted, args))
        return real(jitted, args, *rest, **kw)

    monkeypatch.setattr(compile_cache, "compile", compile)
    monkeypatch.setattr(tiers, "enabled", False)
    return seen


def _copies(jitted, args) -> list[str]:
    """The array copies XLA put in the program (in its entry computation)."""
    text = jitted.lower(*args).compile().as_text()
    entry = text[text.index("\nENTRY"):]
    return re.findall(r"= (f32\[\d+\]\S*) copy\(", entry)


def test_fused_adamw_step_updates_parameters_and_state_in_place(monkeypatch):
    # AdamW's foreach ops update 2-D parameters, their gradients' moments and 1-D biases.
    # Read as [out, in] and written back flat, every one of them was copied by XLA.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 32)).to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    with torch_pjrt.set_eager_mode("fused"):
        opt.step()  # creates the state
        torch.pjrt.synchronize()
        seen = _programs(monkeypatch)
        before = [p.detach().cpu() for p in model.parameters()]
        opt.step()
        torch.pjrt.synchronize()
    assert seen, "the step compiled no fused graph (it was cached?)"
    jitted, args = seen[-1]
    assert _copies(jitted, args) == []
    # and the step did update every parameter
    for b, p in zip(before, model.parameters()):
        assert not torch.equal(b, p.detach().cpu())


def test_debug_mode_check_failure_leaves_the_written_tensor_usable():
    # An in-place op donates its tensor's buffer; in debug mode its failed device check
    # raised before the tensor got the new one, and every later synchronization failed
    # ("called on deleted or donated buffer").
    x = torch.zeros(6, dtype=torch.int64, device="pjrt")
    x.scatter_(0, torch.tensor([2], dtype=torch.int32, device="pjrt"), 1)  # compiled once
    with torch_pjrt.set_eager_mode("debug"):
        y = torch.zeros(6, dtype=torch.int64, device="pjrt")
        try:
            y.scatter_(0, torch.tensor([-1], device="pjrt"), 1)
        except RuntimeError as e:
            assert "out of bounds" in str(e)
        else:
            raise AssertionError("a negative scatter index did not raise")
        torch.pjrt.synchronize()
        y.cpu()
        z = torch.zeros(6, dtype=torch.int64, device="pjrt")
        z.scatter_(0, torch.tensor([2], dtype=torch.int32, device="pjrt"), 1)
        assert z.cpu().tolist() == [0, 0, 1, 0, 0, 0]

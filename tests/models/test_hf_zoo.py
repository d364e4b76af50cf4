"""Hugging Face `transformers` models, unmodified, on pjrt give the CPU's numbers: logits,
loss and every parameter's gradient, AdamW steps, and greedy generation with the dynamic and
the static KV cache, eager and compiled. Tiny configs (tests/models/zoo.py), no downloads.

CI runs every architecture in fused eager (forward, backward, AdamW) and a few in the other
modes; TORCH_PJRT_SLOW_TESTS=1 runs every architecture in every mode and generation case."""

import pytest
import torch
import zoo
from tolerance import assert_as_accurate

import torch_pjrt

# What CI runs beyond the fused sweep (cold compiles make each case cost seconds): a decoder
# with tied weights, one without, the encoder-decoder (generation) and the ConvNet.
CI_MODES = {"strict": ("gpt2", "llama"), "compile": ("gpt2", "llama", "resnet")}
CI_GENERATE = {("llama", "dynamic", "eager"), ("llama", "static", "eager"),
               ("llama", "static", "compiled"), ("llama", "dynamic", "compiled"),
               ("gpt2", "static", "compiled"), ("t5", "dynamic", "eager"),
               ("t5", "static", "eager")}
NEW_TOKENS = 4
ADAMW_STEPS = 3


# Known failures, one reason each (bugs of ours, noted for a fix).
XFAIL: dict[tuple, str] = {}


def _case(values, ci: bool):
    marks = [] if ci else [pytest.mark.slow]
    if values in XFAIL:
        marks.append(pytest.mark.xfail(reason=XFAIL[values], strict=False))
    return pytest.param(*values, marks=marks)


def _check_step(expected, actual, reference):
    """One step's logits, loss and gradients on pjrt are as accurate as the CPU's, both
    against the float64 reference (tests/tolerance.py)."""
    for what, a, e, r in zip(("logits", "loss"), actual, expected, reference):
        assert_as_accurate(a, e, r, what=what)
    assert set(actual[2]) == set(expected[2]), "parameters with a gradient differ"
    for name, g in expected[2].items():
        assert_as_accurate(actual[2][name], g, reference[2][name], what=f"grad of {name}")


@pytest.mark.parametrize("name", list(zoo.ARCHS))
def test_fused_training_matches_cpu(name):
    """Fused eager (the default): the first step's logits, loss and gradients, then the
    losses of a few AdamW steps and the parameters they end at."""
    arch = zoo.ARCHS[name]
    cpu, dev = zoo.pair(arch)
    ref = zoo.reference(cpu)
    if arch.tied:
        params = dict(dev.named_parameters(remove_duplicate=False))
        assert params[arch.tied[0]] is params[arch.tied[1]], "tied weights came apart"
    kwargs = zoo.inputs(arch)
    ref_kwargs = zoo.to(kwargs, "cpu", torch.float64)
    with torch_pjrt.set_eager_mode("fused"):
        first = zoo.forward_backward(cpu, kwargs)
        _check_step(first, zoo.forward_backward(dev, zoo.to(kwargs, "pjrt")),
                    zoo.forward_backward(ref, ref_kwargs))
        expected, sensitivity = zoo.adamw_steps(cpu, kwargs, ADAMW_STEPS)
        actual, _ = zoo.adamw_steps(dev, zoo.to(kwargs, "pjrt"), ADAMW_STEPS)
    assert_as_accurate(torch.tensor(actual), torch.tensor(expected),
                       torch.tensor(zoo.adamw_steps(ref, ref_kwargs, ADAMW_STEPS)[0]),
                       what="AdamW losses")
    # A gradient that is zero but for rounding (a key projection's bias: softmax ignores a
    # shift of every score) becomes full-size AdamW steps of any sign, on any device.
    noise = {n for n, g in first[2].items() if g.abs().max() < 1e-6}
    for (n, p), q, r in zip(dev.named_parameters(), cpu.parameters(), ref.parameters()):
        if n not in noise:
            assert p.device.type == "pjrt"
            assert_as_accurate(p.detach(), q.detach(), r.detach(), what=f"{n} after AdamW",
                               sensitivity=sensitivity[q])


@pytest.mark.parametrize("name,mode", [
    _case((name, mode), name in CI_MODES[mode])
    for mode in ("strict", "compile") for name in zoo.ARCHS])
def test_training_step_matches_cpu(name, mode):
    """Strict eager and torch.compile(backend="pjrt"): logits, loss and gradients."""
    arch = zoo.ARCHS[name]
    cpu, dev = zoo.pair(arch)
    kwargs = zoo.inputs(arch)
    forward = torch.compile(dev, backend="pjrt") if mode == "compile" else None
    with torch_pjrt.set_eager_mode("strict" if mode == "strict" else "fused"):
        _check_step(zoo.forward_backward(cpu, kwargs),
                    zoo.forward_backward(dev, zoo.to(kwargs, "pjrt"), forward),
                    zoo.forward_backward(zoo.reference(cpu), zoo.to(kwargs, "cpu",
                                                                      torch.float64)))


@pytest.mark.parametrize("name,cache,how", [
    _case((name, cache, how), (name, cache, how) in CI_GENERATE)
    for name in zoo.GENERATIVE for cache in ("dynamic", "static")
    for how in ("eager", "compiled")])
def test_greedy_generation_matches_cpu(name, cache, how):
    arch = zoo.ARCHS[name]
    cpu, dev = zoo.pair(arch)
    cpu.eval()
    dev.eval()
    kwargs = zoo.inputs(arch)
    expected = zoo.generate(cpu, kwargs, NEW_TOKENS, cache)
    if how == "compiled":
        torch._dynamo.reset()
        dev.forward = torch.compile(dev.forward, backend="pjrt")
    actual = zoo.generate(dev, zoo.to(kwargs, "pjrt"), NEW_TOKENS, cache)
    assert actual.cpu().tolist() == expected.tolist()

"""What a comparison with the CPU can honestly promise, stated once for every test.

Two correct implementations of the same float math agree only up to rounding, and how
much rounding depends on the computation, not on the test or on the machine the test was
written on: the CPU's own kernels change with the processor (ATen's vectorized kernels by
`ATEN_CPU_CAPABILITY`, oneDNN and MKL by the instruction sets they find, so an AVX2 machine
takes other code paths than an AVX512 one), and XLA:CPU's with its own target. Each
function here derives a bound from what the comparison is:

- an elementwise function: a few units in the last place (ulp) of the result, the promise
  PyTorch's own tests make (`elementwise`); where the CPU's kernel itself is less
  accurate on some processors (cancellation in `1 + erf(x)`), pjrt is held to be no less
  accurate than the CPU against a float64 reference (`assert_no_less_accurate`);
- a sum of products (matrix products, convolutions, reductions): a bound proportional to
  the sum of the magnitudes of the terms, not to the result, since cancellation can leave
  a small result with the rounding of large partial sums (`sum_bound`); low-precision
  kernels may round partial sums to their dtype once per block, which the caller states;
- a whole network, a training step, a few optimizer steps: no closed form, so pjrt is held
  to be about as accurate as the CPU's own float32 run, both measured against the same
  computation in float64 (`assert_as_accurate`). AdamW divides each gradient by the root
  of its running square, so where that root is small it amplifies the gradients' rounding
  into full-size steps; the CPU's own run shows the same amplification, so the bound
  follows it, on any processor.

Every bound is elementwise, and each of the tests that use one keeps a case where a
deliberately wrong kernel fails it (tests/test_tolerance.py and the tests themselves).
"""

from __future__ import annotations

import torch

# Both sides of a comparison round: the CPU's result and pjrt's each carry their own error.
SIDES = 2


def real_dtype(dtype: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64,
            torch.complex32: torch.float16}.get(dtype, dtype)


def rounding(dtype: torch.dtype) -> float:
    """The unit roundoff of `dtype` (half its spacing at 1.0): the relative error of one
    correctly rounded operation."""
    return torch.finfo(real_dtype(dtype)).eps / 2


def elementwise(dtype: torch.dtype, scale: float = 1.0) -> dict:
    """(atol, rtol) for an elementwise computation done by two algorithms: PyTorch's own
    default for the dtype (torch.testing), a few ulps of the result (float32: rtol 1.3e-6,
    11 ulps; bfloat16: 2 ulps), with an absolute floor for results near zero. `scale`
    widens both for functions known to lose ulps near poles or for huge arguments."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return {"atol": 0.0, "rtol": 0.0}
    rtol, atol = torch.testing._comparison.default_tolerances(dtype)
    return {"atol": atol * scale, "rtol": rtol * scale}


def wide(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU in float64, where comparisons run; a complex number's real and
    imaginary parts compared each on its own (a last dimension of 2), as ulps are per part."""
    t = t.detach().cpu()
    if t.dtype.is_complex:
        return torch.view_as_real(t.to(torch.complex128))
    return t.to(torch.float64)


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype` at each of `values` (float64; at infinities, the spacing at
    the dtype's largest number, so that a finite result never passes for an infinite one):
    one unit in the last place. Below the smallest normal number it is that number: XLA,
    as GPUs by default, may flush subnormal results to zero where the CPU keeps them."""
    info = torch.finfo(real_dtype(dtype))
    mag = values.abs().to(torch.float64).nan_to_num(nan=0.0, posinf=info.max)
    mag = mag.clamp(min=info.tiny, max=info.max)
    spacing = torch.exp2(torch.floor(torch.log2(mag))) * info.eps
    return spacing.where(values.abs() >= info.tiny, torch.full((), info.tiny, dtype=torch.float64))


def sum_bound(magnitude: torch.Tensor, dtype: torch.dtype, *, roundings: int = 1,
              terms: int = 1) -> torch.Tensor:
    """How far two correct implementations of a sum of products may differ, elementwise.

    `magnitude` is the sum of |term| for each output: the same op run on the inputs'
    absolute values in float64. Each side rounds to `dtype` at most `roundings` times on the
    way (1: only the result; a kernel that adds blocks in the low-precision dtype, such as
    the CPU's bfloat16 convolution without native bfloat16 instructions, which adds one
    batch element at a time, rounds once per block), and accumulates `terms` products in
    float32 or wider (each addition one float32 rounding at most)."""
    accumulate = terms * rounding(torch.float32) if dtype != torch.float64 else \
        terms * rounding(torch.float64)
    return SIDES * (roundings * rounding(dtype) + accumulate) * magnitude.to(torch.float64)


def product_magnitudes(fn, *tensors: torch.Tensor, seed: int = 1) -> list[torch.Tensor]:
    """For `fn` linear in each input (a product, a convolution, a sum, plus a bias): the sum
    of |term| behind each of `outputs_and_grads(fn, *tensors, seed=seed)`'s results, which
    is `fn` and its backward run on the absolute values in float64 (the cotangent's too)."""
    leaves = [t.detach().abs().to(torch.float64).requires_grad_(t.is_floating_point())
              for t in tensors]
    out = fn(*leaves)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    out.backward(cot.to(tensors[0].dtype).abs().to(torch.float64))
    return [out.detach()] + [t.grad for t in leaves if t.requires_grad]


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor,
                  what: str = "result", *, also_ok: torch.Tensor | None = None) -> None:
    """|actual - expected| <= bound elementwise (equal infinities and NaN where both are NaN
    pass; so do the elements of `also_ok`), with the worst elements named."""
    a, e = wide(actual), wide(expected)
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    bound = bound.to(torch.float64).expand_as(a)
    ok = ((a - e).abs() <= bound) | (a.isnan() & e.isnan()) | ((a == e) & a.isinf())
    if also_ok is not None:
        ok |= also_ok
    if not bool(ok.all()):
        idx = (~ok).nonzero()[:3].tolist()
        rows = [f"at {tuple(i)}: {a[tuple(i)].item():.9g} vs {e[tuple(i)].item():.9g}, "
                f"bound {bound[tuple(i)].item():.3g}" for i in idx]
        raise AssertionError(f"{what}: {int((~ok).sum())} of {a.numel()} elements differ "
                             "past the bound; " + "; ".join(rows))


def assert_no_less_accurate(actual: torch.Tensor, expected: torch.Tensor,
                            reference: torch.Tensor, *, ulps: float | None = None,
                            factor: float = 2, atol: float = 0.0,
                            what: str = "result") -> None:
    """pjrt's result is about as close to the float64 `reference` (correctly rounded to the
    result's dtype) as the CPU's `expected`: within `factor` times the CPU's own error, plus
    `ulps` ulps of the result (by default as many as `elementwise` allows: 11 for float32),
    plus `atol` for functions whose zeros leave only an absolute promise.

    The promise where the CPU's own kernel is inexact in a way that depends on the
    processor, so that comparing pjrt with it alone would test the CPU: ATen's vectorized
    GELU, for one, takes whole vectors through a polynomial erf, 1e-4 off at -3 and NaN at
    +inf, and the tail through std::erf, and which elements take which path depends on the
    vector width (8 floats with AVX2, 16 with AVX512). Two implementations of a formula that
    cancels (1 + tanh(x) for x << 0) have errors of one size, hence the factor. Where the CPU
    gives NaN for a number, pjrt may too, or give the number; results that only subnormal
    intermediates make nonzero may be zero (`flushed`)."""
    if ulps is None:
        ulps = elementwise(actual.dtype)["rtol"] / torch.finfo(real_dtype(actual.dtype)).eps
    ref = wide(reference.to(actual.dtype).to(reference.dtype))
    cpu, a = wide(expected), wide(actual)
    cpu_error = (cpu - ref).abs().nan_to_num(nan=0.0, posinf=0.0)
    bound = factor * cpu_error + ulps * ulp(ref, actual.dtype) + atol + flushed(actual.dtype)
    assert_within(a, ref, bound, what, also_ok=a.isnan() & cpu.isnan())


def flushed(dtype: torch.dtype) -> float:
    """How far from zero a result may be that XLA gives as zero because an intermediate
    value fell below the smallest normal number and was flushed (as GPUs do by default):
    that number times the largest factor a float computation applies after it, 1 / eps
    (for float32 about 1e-31; mish(-88.5) is -3e-37 on the CPU, -0 on pjrt)."""
    info = torch.finfo(real_dtype(dtype))
    return info.tiny / info.eps


def _as_accurate_bound(expected: torch.Tensor, reference: torch.Tensor, factor: float,
                       ulps: float, sensitivity: torch.Tensor | None, atol: float = 0.0):
    """The value assert_as_accurate compares with (the float64 reference; the CPU's own
    result where either is not finite) and the elementwise bound around it."""
    ref, cpu = wide(reference), wide(expected)
    finite = ref.isfinite() & cpu.isfinite()
    scale = torch.ones(()) if sensitivity is None else wide(sensitivity)
    cpu_error = ((cpu - ref).abs() / scale).where(finite, torch.zeros(()))
    worst = cpu_error.max() if ref.numel() else torch.zeros(())
    bound = factor * worst * scale + ulps * ulp(ref, expected.dtype) + atol
    return ref.where(finite, cpu), bound.where(finite, torch.zeros(()))


def assert_as_accurate(actual: torch.Tensor, expected: torch.Tensor,
                       reference: torch.Tensor, *, factor: float = 8, ulps: float = 4,
                       sensitivity: torch.Tensor | None = None, atol: float = 0.0,
                       what: str = "result") -> None:
    """pjrt's error against the float64 `reference` is within `factor` times the CPU's own
    largest error in the same tensor (plus `ulps` ulps of each element): the promise for a
    whole network, a training step or a few optimizer steps, where no closed-form bound
    exists. Both devices compute in the tensor's dtype with their own summation orders, so
    their errors are of one size; a wrong kernel is off by far more than rounding.

    `sensitivity`: how much each element amplifies the errors it is computed from, where
    that differs from element to element (`adamw_step_sensitivity`); errors are compared divided
    by it, so that the CPU's error in a quiet element does not set the bound of a loud one.
    `atol`: an error pjrt's algorithm has and the CPU's does not, stated by the caller with
    its derivation (capturable optimizers' bias corrections computed in float32)."""
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        assert torch.equal(actual.cpu(), expected.cpu()), f"{what}: integers differ"
        return
    target, bound = _as_accurate_bound(expected, reference, factor, ulps, sensitivity, atol)
    assert_within(actual, target, bound, what)


def accuracy_excess(actual: torch.Tensor, expected: torch.Tensor, reference: torch.Tensor,
                    *, factor: float = 8, ulps: float = 4,
                    sensitivity: torch.Tensor | None = None, atol: float = 0.0) -> float:
    """assert_as_accurate's verdict as a number: the largest ratio, over the elements, of
    pjrt's error against the float64 `reference` to the bound; at most 1 passes (infinite
    where the bound is 0 and the error is not: an integer, infinity or NaN that differs)."""
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        return 0.0 if torch.equal(actual.cpu(), expected.cpu()) else float("inf")
    target, bound = _as_accurate_bound(expected, reference, factor, ulps, sensitivity, atol)
    a = wide(actual)
    same = (a.isnan() & target.isnan()) | ((a == target) & a.isinf())
    error = (a - target).abs().nan_to_num(nan=float("inf")).where(~same, torch.zeros(()))
    ratio = (error / bound).where(error > 0, torch.zeros(()))
    return float(ratio.max()) if ratio.numel() else 0.0


def adamw_step_sensitivity(optimizer: torch.optim.Optimizer) -> dict:
    """How much the AdamW step just taken amplified an error in each parameter's gradient,
    elementwise, read off the optimizer's state: the step moved the parameter by
    lr * m_hat / (sqrt(v_hat) + eps), whose derivative in the gradient is about
    lr / (sqrt(v_hat) + eps), so a gradient that is small (v_hat small) turns its rounding
    into a large step. Summed over the steps, it is a parameter's `sensitivity`."""
    found = {}
    for group in optimizer.param_groups:
        beta2 = group["betas"][1]
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            v_hat = state["exp_avg_sq"].detach().cpu().double() / \
                (1 - beta2 ** float(state["step"]))
            found[p] = group["lr"] / (v_hat.sqrt() + group["eps"])
    return found

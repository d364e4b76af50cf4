"""Convolutions (1d/2d/3d, strided, padded, dilated, grouped, transposed), differential vs CPU."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import assert_same, outputs_and_grads, to_device
from opinfo_diff import check_samples, fallbacks_of

import torch_pjrt

aten = torch.ops.aten
CONV_OPS = ("convolution",)


def _compare_grads(fn, *tensors, atol=1e-4, rtol=1e-4):
    expected = outputs_and_grads(fn, *tensors)
    actual = outputs_and_grads(fn, *to_device(tensors))
    assert_same(actual, expected, atol=atol, rtol=rtol)


# (spatial size, in, out, kernel, stride, padding, dilation, groups, transposed, output_padding)
CASES = {
    "1d": ((10,), 6, 3, (4,), (3,), (2,), (1,), 3, False, (0,)),
    "2d_odd": ((7, 6), 3, 4, (3, 2), (2, 1), (1, 0), (1, 2), 1, False, (0, 0)),
    "2d_groups": ((8, 9), 4, 6, (3, 3), (2, 3), (1, 1), (2, 1), 2, False, (0, 0)),
    "2d_depthwise": ((5, 5), 4, 4, (3, 3), (1, 1), (1, 1), (1, 1), 4, False, (0, 0)),
    "2d_1x1": ((5, 7), 3, 5, (1, 1), (1, 1), (0, 0), (1, 1), 1, False, (0, 0)),
    "2d_leftover": ((9, 8), 2, 3, (2, 3), (3, 2), (0, 1), (1, 1), 1, False, (0, 0)),
    "3d": ((5, 6, 4), 2, 4, (2, 3, 1), (1, 2, 1), (0, 1, 0), (2, 1, 1), 2, False, (0, 0, 0)),
    "t1d": ((6,), 3, 2, (3,), (2,), (3,), (1,), 1, True, (1,)),
    "t2d_groups": ((5, 4), 4, 6, (3, 2), (2, 3), (1, 0), (1, 2), 2, True, (1, 2)),
    "t2d_outpad_dilation": ((4, 5), 2, 3, (3, 3), (2, 1), (1, 1), (3, 3), 1, True, (2, 1)),
    "t3d": ((3, 4, 2), 2, 2, (2, 2, 3), (2, 1, 2), (0, 1, 1), (1, 2, 1), 1, True, (1, 0, 0)),
}


def _conv_args(case, batch=2, dtype=torch.float32):
    size, cin, cout, k, s, p, d, g, transposed, op = CASES[case]
    x = torch.randn(batch, cin, *size, dtype=dtype)
    shape = (cin, cout // g) if transposed else (cout, cin // g)
    w = torch.randn(*shape, *k, dtype=dtype)
    b = torch.randn(cout, dtype=dtype)

    def fn(x, w, b):
        return aten.convolution(x, w, b, list(s), list(p), list(d), transposed, list(op), g)

    return fn, x, w, b


@pytest.mark.parametrize("case", sorted(CASES))
def test_convolution_forward_and_grads(case):
    fn, x, w, b = _conv_args(case)
    _compare_grads(fn, x, w, b)
    assert not fallbacks_of(CONV_OPS)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, False),
                                  (False, False, True), (True, True, False)])
@pytest.mark.parametrize("case", ["2d_groups", "t2d_groups"])
def test_convolution_backward_output_mask(case, mask):
    size, cin, cout, k, s, p, d, g, transposed, op = CASES[case]
    fn, x, w, b = _conv_args(case)
    grad = torch.randn_like(fn(x, w, b))
    bias_sizes = [cout] if mask[2] else None
    args = (grad, x, w, bias_sizes, list(s), list(p), list(d), transposed, list(op), g,
            list(mask))
    expected = aten.convolution_backward(*args)
    actual = aten.convolution_backward(*to_device(args))
    for a, e, wanted in zip(actual, expected, mask):
        if wanted:  # (the CPU's grouped kernels sometimes return masked-out grads too)
            assert_same(a, e, atol=1e-4, rtol=1e-4)
        else:
            assert a is None


def test_transposed_padding_larger_than_kernel_reach():
    # padding > dilation * (kernel - 1): the correlation's padding is negative (a crop).
    x, w = torch.randn(1, 2, 9, 9), torch.randn(2, 3, 3, 3)
    _compare_grads(lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=3), x, w)


def test_functional_convs_without_bias_and_with_string_padding():
    x, w = torch.randn(2, 3, 8, 7), torch.randn(4, 3, 2, 3)
    _compare_grads(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), x, w)
    _compare_grads(lambda x, w: F.conv2d(x, w, padding="valid", stride=2), x, w)
    x1, w1 = torch.randn(3, 10), torch.randn(2, 3, 3)  # unbatched 1d
    _compare_grads(lambda x, w: F.conv1d(x, w, padding=1), x1, w1)


def test_private_convolution_overloads():
    fn, x, w, b = _conv_args("2d_groups")
    s, p, d, g = [2, 3], [1, 1], [2, 1], 2
    for call in (lambda x, w, b: aten._convolution(x, w, b, s, p, d, False, [0, 0], g, False,
                                                   False, True, True),
                 lambda x, w, b: aten._convolution.deprecated(x, w, b, s, p, d, False, [0, 0],
                                                              g, False, False, True)):
        assert_same(call(*to_device((x, w, b))), call(x, w, b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_convolution_dtypes(dtype):
    fn, x, w, b = _conv_args("2d_groups", dtype=dtype)
    tol = 1e-10 if dtype == torch.float64 else 2e-2
    assert_same(fn(*to_device((x, w, b))), fn(x, w, b), atol=tol, rtol=tol)


def test_empty_batch():
    x, w = torch.randn(0, 3, 5, 5), torch.randn(4, 3, 3, 3)
    assert_same(F.conv2d(*to_device((x, w))), F.conv2d(x, w))


@pytest.mark.parametrize("name", ["nn.functional.conv1d", "nn.functional.conv2d",
                                  "nn.functional.conv3d", "nn.functional.conv_transpose1d",
                                  "nn.functional.conv_transpose2d",
                                  "nn.functional.conv_transpose3d"])
def test_opinfo_samples(name):
    assert check_samples(name, atol=1e-4, rtol=1e-4) > 0
    assert not fallbacks_of(CONV_OPS)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, stride=2, groups=2), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d((2, 2)))
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


@pytest.mark.usefixtures("eager_mode")
def test_small_cnn_training_steps_match_cpu():
    torch.manual_seed(0)
    model = SmallCNN()
    data = [(torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))) for _ in range(2)]
    results = {}
    before = dict(torch_pjrt.metrics()["cpu_fallbacks"])
    for device in ("cpu", "pjrt"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = F.cross_entropy(m(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        results[device] = (losses, m.state_dict())
    assert results["pjrt"][0] == pytest.approx(results["cpu"][0], rel=1e-4, abs=1e-5)
    for name, value in results["cpu"][1].items():
        assert_same(results["pjrt"][1][name], value, atol=1e-4, rtol=1e-4)
    assert torch_pjrt.metrics()["cpu_fallbacks"] == before


# Both of the cpu platform's ways to convolve (lowering/families/conv.py): the product of
# patches (small output images, few input channels) and XLA's convolution. The device runs
# whichever its rule picks; here each lowering is called directly in JAX with the rule
# forced, so both stay tested wherever the rule would not pick them.
PATH_CASES = {  # (spatial size, in, out, kernel, stride, padding, dilation)
    "resnet 2x2, 16 channels": ((2, 2), 16, 16, (3, 3), (1, 1), (1, 1), (1, 1)),
    "resnet stride 2": ((4, 4), 8, 16, (3, 3), (2, 2), (1, 1), (1, 1)),
    "stem, 3 channels": ((12, 12), 3, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
    "1d dilated": ((11,), 3, 5, (3,), (2,), (2,), (2,)),
    "2d odd": ((7, 6), 3, 4, (3, 2), (2, 1), (1, 0), (1, 2)),
    "2d leftover": ((9, 8), 2, 3, (2, 3), (3, 2), (0, 1), (1, 1)),
    "3d": ((4, 5, 3), 2, 3, (2, 3, 1), (1, 2, 1), (0, 1, 0), (2, 1, 1)),
    "1x1 stride 2": ((6, 6), 4, 8, (1, 1), (2, 2), (0, 0), (1, 1)),
}


@pytest.mark.parametrize("patches", [True, False], ids=["patches", "xla-conv"])
@pytest.mark.parametrize("case", sorted(PATH_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patches_and_xla_convolution_match_cpu(case, patches, dtype, monkeypatch):
    import jax.numpy as jnp

    from torch_pjrt.lowering.families import conv
    from torch_pjrt.storage import dtypes

    monkeypatch.setattr(conv, "_use_patches", lambda *a, **k: patches)
    size, cin, cout, k, s, p, d = PATH_CASES[case]
    torch.manual_seed(0)
    x, w = torch.randn(3, cin, *size, dtype=dtype), torch.randn(cout, cin, *k, dtype=dtype)
    b = torch.randn(cout, dtype=dtype)
    out = aten.convolution(x, w, b, list(s), list(p), list(d), False, [0] * len(k), 1)
    grad = torch.randn_like(out)
    want = aten.convolution_backward(grad, x, w, [cout], list(s), list(p), list(d), False,
                                     [0] * len(k), 1, [True, True, True])

    def arr(t):
        return jnp.asarray(t.float().numpy()).astype(dtypes.to_jax(dtype))

    got_out = conv.convolution(arr(x), arr(w), arr(b), list(s), list(p), list(d), False,
                               [0] * len(k), 1)
    got = conv.convolution_backward(arr(grad), arr(x), arr(w), [cout], list(s), list(p),
                                    list(d), False, [0] * len(k), 1, [True, True, True])
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    for g, e in zip((got_out, *got), (out, *want)):
        assert g.dtype == dtypes.to_jax(dtype)
        torch.testing.assert_close(torch.from_numpy(jnp.asarray(g, jnp.float32).__array__()),
                                   e.float(), **tol)


def test_the_rule_picks_patches_for_small_images_on_cpu():
    import jax.numpy as jnp

    from torch_pjrt.lowering.families import conv
    from torch_pjrt.runtime import client

    on_cpu = client.platform() == "cpu"
    small = jnp.zeros((2, 64, 2, 2)), jnp.zeros((64, 64, 3, 3))
    large = jnp.zeros((2, 64, 16, 16)), jnp.zeros((64, 64, 3, 3))
    stem = jnp.zeros((2, 3, 32, 32)), jnp.zeros((16, 3, 3, 3))
    assert conv._use_patches(*small, (2, 2), 1) == on_cpu
    assert conv._use_patches(*stem, (32, 32), 1) == on_cpu
    assert not conv._use_patches(*large, (16, 16), 1)
    assert not conv._use_patches(*small, (2, 2), 2)  # grouped: XLA's convolution

"""torchvision, unmodified: classification models trained (forward, gradients, SGD steps),
`torchvision.ops` on pjrt tensors, and a detection model's eval forward, equal to the CPU.

torchvision's C++ ops (nms, roi_align, roi_pool, ps_roi_align, deform_conv2d and their
backward ops) have no pjrt lowering: they run through the CPU fallback (inputs copied to the
host, torchvision's CPU kernel, results copied back), counted in torch_pjrt.metrics() and
warned once per op; the tests check that they are counted and give the CPU's results.
torchvision's PyPI wheels need PyPI's torch build: the module skips where it cannot import
torchvision (the CPU build of torch 2.13)."""

from __future__ import annotations

import pytest
import torch

torchvision = pytest.importorskip("torchvision")

from differential import (  # noqa: E402
    MODES,
    case_params,
    compare_training,
    compared,
    eager_mode,
    to,
)

IMAGE, BATCH, CLASSES, STEPS = 64, 2, 5, 2
CLASSIFIERS = ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1",
               "regnet_y_400mf", "efficientnet_b0")
# classifiers the sweep also runs strict and compiled (each costs a cold compile)
OTHER_MODES = ("resnet18", "regnet_y_400mf", "efficientnet_b0")


def classification(name: str, mode: str):
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, num_classes=CLASSES).train()
    g = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    return compare_training(
        model, images,
        lambda logits, _: torch.nn.functional.cross_entropy(logits, labels.to(logits.device)),
        mode=mode, steps=STEPS)


def _boxes(n: int, g: torch.Generator, size: float = 48.0) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=g) * size
    return torch.cat([xy, xy + 2 + torch.rand(n, 2, generator=g) * size / 2], 1)


def _op_calls():
    """(name, fn of CPU-built tensors, the tensors, which inputs get gradients)."""
    ops = torchvision.ops
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 4, 16, 16, generator=g)
    rois = torch.cat([torch.tensor([[0.], [1.], [1.]]), _boxes(3, g, 12.0)], 1)
    boxes, scores = _boxes(30, g), torch.rand(30, generator=g)
    classes = torch.randint(0, 3, (30,), generator=g)
    offset = torch.randn(2, 2 * 9, 14, 14, generator=g)
    weight = torch.randn(5, 4, 3, 3, generator=g)
    mask = torch.rand(2, 9, 14, 14, generator=g)
    return [
        ("nms", lambda b, s: ops.nms(b, s, 0.5), (boxes, scores), ()),
        ("batched_nms", lambda b, s, c: ops.batched_nms(b, s, c, 0.5),
         (boxes, scores, classes), ()),
        ("roi_align", lambda x, r: ops.roi_align(x, r, (3, 3), 0.5, 2, aligned=True),
         (feats, rois), (0,)),
        ("roi_pool", lambda x, r: ops.roi_pool(x, r, (3, 3), 0.5), (feats, rois), (0,)),
        ("ps_roi_align", lambda x, r: ops.ps_roi_align(x, r, (2, 2), 0.5, 2),
         (feats, rois), (0,)),
        ("deform_conv2d", lambda x, o, w, m: ops.deform_conv2d(x, o, w, mask=m),
         (feats, offset, weight, mask), (0, 1, 2, 3)),
        ("box_iou", ops.box_iou, (boxes[:5], boxes[5:12]), ()),
    ]


def op(name: str, mode: str, tolerance: float = 1e-5):
    """One torchvision op on pjrt tensors: its result and its inputs' gradients (for a
    fixed random cotangent) against the CPU's."""
    _, fn, args, grads = next(c for c in _op_calls() if c[0] == name)

    def run(device):
        leaves = [a.detach().clone().to(device).requires_grad_(i in grads)
                  for i, a in enumerate(args)]
        call = torch.compile(fn, backend="pjrt") if mode == "compile" and device != "cpu" \
            else fn
        out = call(*leaves)
        if grads:
            cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            out.backward(cot.to(device))
        return out.detach(), [leaves[i].grad for i in grads]

    expected = run("cpu")
    with compared(tolerance) as result, eager_mode(mode):
        if mode == "compile":
            torch._dynamo.reset()
        out, got = run("pjrt")
        result.add("output", out, expected[0])
        result.add("grad", got, expected[1])
    return result


def detection(mode: str, tolerance: float = 1e-4):
    """fasterrcnn_mobilenet_v3_large_320_fpn (random weights) in eval mode: the boxes,
    scores and labels of two images. Its NMS and RoIAlign run through the CPU fallback."""
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3, box_score_thresh=0.0,
        box_detections_per_img=20).eval()
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 96, 128, generator=g), torch.rand(3, 112, 96, generator=g)]
    with torch.no_grad():
        expected = model(images)
    dev = model.to("pjrt") if mode != "compile" else torch.compile(model.to("pjrt"),
                                                                    backend="pjrt")
    with compared(tolerance) as result, eager_mode(mode):
        if mode == "compile":
            torch._dynamo.reset()
        with torch.no_grad():
            actual = dev(to(images, "pjrt"))
        result.add("detections", actual, expected)
    return result


TORCHVISION_OPS = {c[0] for c in _op_calls()}
CASES = {
    **{(f"{name} training", m): (lambda name=name, m=m: classification(name, m))
       for name in CLASSIFIERS for m in MODES if m == "fused" or name in OTHER_MODES},
    **{(f"ops.{name}", m): (lambda name=name, m=m: op(name, m))
       for name in sorted(TORCHVISION_OPS) for m in MODES},
    **{("fasterrcnn_mobilenet_v3_large_320_fpn eval", m): (lambda m=m: detection(m))
       for m in MODES},
}
CI = {("resnet18 training", "fused")} | {(f"ops.{n}", "fused") for n in TORCHVISION_OPS}


@pytest.mark.parametrize("case", case_params(CASES, CI), ids=" ".join)
def test_torchvision_matches_cpu(case):
    result = CASES[case]()
    result.check()
    other = [op for op in result.fallbacks if not op.startswith("torchvision.")]
    assert not other, f"aten ops ran on the CPU: {other}"
    if case[0].startswith("ops.") and case[0] != "ops.box_iou" and case[1] != "compile":
        assert result.fallbacks, "torchvision's op ran without the counted CPU fallback"

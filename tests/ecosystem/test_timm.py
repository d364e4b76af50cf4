"""timm, unmodified: architectures of its model list (convnets, ViTs, Swin, ConvNeXt,
MobileNet/EfficientNet, MLP-Mixer, LeViT, CoAtNet/MaxViT...), the smallest variants, built
with pretrained=False on 64x64 images: the forward, every gradient, the losses of SGD
steps and the weights they end at equal the CPU's.

timm needs torchvision, whose PyPI wheels need PyPI's torch build (with the CPU build of
torch 2.13, `import torchvision` fails): the module skips where it cannot import timm.
CI runs one model; tools/ecosystem_sweep.py (or TORCH_PJRT_SLOW_TESTS=1) runs them all."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm")

from differential import MODES, case_params, check_case, compare_training  # noqa: E402

IMAGE, BATCH, CLASSES, STEPS = 64, 2, 5, 2
SIZED = {"img_size": IMAGE}  # models whose positional tables follow the image size

# name: the keyword arguments it is built with beyond num_classes (in the order the sweep
# runs them: one of each family first)
ARCHS: dict[str, dict] = {
    "resnet10t": {}, "regnetx_002": {}, "mobilenetv3_small_050": {}, "efficientnet_b0": {},
    "convnext_atto": {}, "vit_tiny_patch16_224": SIZED, "swin_tiny_patch4_window7_224": SIZED,
    "mixer_s32_224": SIZED, "levit_128s": SIZED, "coatnet_nano_rw_224": SIZED,
    # ResNet family, RegNet, DenseNet, CSP, NF, VoVNet, DLA, HRNet
    "resnet18": {}, "resnet26d": {}, "seresnext26d_32x4d": {}, "skresnet18": {},
    "regnety_002": {}, "cspresnet50": {}, "nf_resnet26": {}, "ese_vovnet19b_slim": {},
    "densenet121": {}, "dla34": {}, "hrnet_w18_small": {},
    # MobileNet / EfficientNet family
    "mobilenetv2_050": {}, "mobilenetv4_conv_small": {}, "lcnet_050": {}, "mnasnet_050": {},
    "ghostnet_050": {}, "rexnet_100": {}, "mixnet_s": {}, "tinynet_e": {}, "repvit_m1": {},
    # ConvNeXt and conv/attention hybrids
    "convnextv2_atto": {}, "edgenext_xx_small": {}, "mobilevit_xxs": {}, "fastvit_t8": {},
    "efficientformerv2_s0": SIZED, "maxvit_nano_rw_256": SIZED,
    # ViTs, Swin, MLPs
    "deit_tiny_patch16_224": SIZED, "eva02_tiny_patch14_224": SIZED, "pit_ti_224": SIZED,
    "xcit_nano_12_p16_224": SIZED, "cait_xxs24_224": SIZED, "swinv2_cr_tiny_224": SIZED,
    "resmlp_12_224": SIZED, "gmlp_ti16_224": SIZED,
}
# (name, mode) CI runs; the rest: TORCH_PJRT_SLOW_TESTS=1 or the sweep
CI = {("resnet10t", "fused")}
# strict and compiled runs the sweep does beyond fused (each costs a cold compile): one
# model of each family the issue names
OTHER_MODES = ("resnet18", "convnext_atto", "vit_tiny_patch16_224", "efficientnet_b0",
               "swin_tiny_patch4_window7_224", "mobilenetv3_small_050", "mixer_s32_224",
               "levit_128s", "coatnet_nano_rw_224")


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=CLASSES, **ARCHS[name]).train()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),
            torch.randint(0, CLASSES, (BATCH,), generator=g))


def training(name: str, mode: str):
    """Cross-entropy on the logits, SGD with momentum (linear in the gradients, so the
    weights after the steps compare as tightly as the gradients)."""
    images, labels = batch()
    return compare_training(
        build(name), images,
        lambda logits, _: torch.nn.functional.cross_entropy(logits, labels.to(logits.device)),
        mode=mode, steps=STEPS)


CASES = {(name, mode): (lambda name=name, mode=mode: training(name, mode))
         for name in ARCHS for mode in MODES if mode == "fused" or name in OTHER_MODES}


@pytest.mark.parametrize("case", case_params(CASES, CI), ids=" ".join)
def test_timm_matches_cpu(case):
    check_case(CASES[case])

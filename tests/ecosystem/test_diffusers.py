"""diffusers, unmodified: a small UNet2DModel (and a text-conditioned UNet2DConditionModel)
trained on the noise-prediction loss with AdamW, and DDPM and DDIM sampling loops, on pjrt
give the CPU's losses, gradients, weights and samples."""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
diffusers = pytest.importorskip("diffusers")

from differential import (  # noqa: E402
    MODES,
    case_params,
    check_case,
    compare_training,
    compared,
    eager_mode,
)

SIZE, BATCH, TRAIN_TIMESTEPS, SAMPLING_STEPS = 16, 2, 100, 4


def _unet():
    torch.manual_seed(0)
    return diffusers.UNet2DModel(
        sample_size=SIZE, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(16, 32), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8,
        attention_head_dim=8).train()


def _conditional_unet():
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel(
        sample_size=SIZE, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), norm_num_groups=8,
        cross_attention_dim=24, attention_head_dim=4).train()


def _noisy_batch(channels: int, conditioned: bool) -> dict:
    """A training batch: clean images, their noise and timesteps, and the noisy images the
    scheduler makes of them (the scheduler's add_noise runs on the batch's device)."""
    g = torch.Generator().manual_seed(0)
    batch = {"clean": torch.randn(BATCH, channels, SIZE, SIZE, generator=g),
             "noise": torch.randn(BATCH, channels, SIZE, SIZE, generator=g),
             "timestep": torch.randint(0, TRAIN_TIMESTEPS, (BATCH,), generator=g)}
    if conditioned:
        batch["text"] = torch.randn(BATCH, 5, 24, generator=g)
    return batch


class NoiseStep(torch.nn.Module):
    """One training step's forward: the scheduler noises the clean images at the
    timesteps, the UNet predicts the noise."""

    def __init__(self, unet):
        super().__init__()
        self.unet = unet
        self.scheduler = diffusers.DDPMScheduler(num_train_timesteps=TRAIN_TIMESTEPS)

    def forward(self, clean, noise, timestep, text=None):
        noisy = self.scheduler.add_noise(clean, noise, timestep)
        return self.unet(noisy, timestep, *(() if text is None else (text,))).sample


def training(build, channels: int, conditioned: bool, mode: str):
    return compare_training(
        NoiseStep(build()), _noisy_batch(channels, conditioned),
        lambda pred, batch: torch.nn.functional.mse_loss(pred, batch["noise"]),
        mode=mode, steps=3, optimizer=_adamw)


def _adamw(params):
    # eps 1e-6, not 1e-8: an element whose gradient is rounding noise (below 1e-7 here,
    # against 0.1 at most) takes a step of up to lr of either sign with a tiny eps, on any
    # device; with 1e-6 it moves by a fraction of lr, and the weights compare to 1e-4
    return torch.optim.AdamW(params, lr=1e-3, eps=1e-6)


def sampling(scheduler_cls, mode: str, tolerance: float = 1e-4):
    """A few denoising steps from the same starting noise; DDPM's added noise comes from a
    CPU generator, so both devices add the same."""
    cpu = _unet().eval()
    dev = copy.deepcopy(cpu).to("pjrt")

    def sample(unet, device):
        scheduler = scheduler_cls(num_train_timesteps=TRAIN_TIMESTEPS)
        scheduler.set_timesteps(SAMPLING_STEPS)
        x = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
        x = x.to(device)
        generator = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for t in scheduler.timesteps:
                x = scheduler.step(unet(x, t).sample, t, x, generator=generator).prev_sample
        return x

    expected = sample(cpu, "cpu")
    with compared(tolerance) as result, eager_mode(mode):
        if mode == "compile":
            torch._dynamo.reset()
        unet = torch.compile(dev, backend="pjrt") if mode == "compile" else dev
        result.add("sample", sample(unet, "pjrt"), expected)
    return result


CASES = {
    **{("unet2d training", m): (lambda m=m: training(_unet, 3, False, m)) for m in MODES},
    **{("unet2d-condition training", m):
       (lambda m=m: training(_conditional_unet, 4, True, m)) for m in MODES},
    **{(f"{s.__name__} sampling", m): (lambda s=s, m=m: sampling(s, m))
       for s in (diffusers.DDPMScheduler, diffusers.DDIMScheduler) for m in MODES},
}
CI = {("unet2d training", "fused"), ("DDIMScheduler sampling", "fused")}


@pytest.mark.parametrize("case", case_params(CASES, CI), ids=" ".join)
def test_diffusers_matches_cpu(case):
    check_case(CASES[case])

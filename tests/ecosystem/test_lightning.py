"""PyTorch Lightning, unmodified: `Trainer(accelerator="pjrt", strategy="pjrt")` (the
accelerator and strategy of torch_pjrt.integrations.lightning) trains a LightningModule to
the losses and weights of `Trainer(accelerator="cpu")`, in float32 and in bf16-mixed."""

from __future__ import annotations

import os

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from differential import MODES, case_params, check_case, compared, eager_mode  # noqa: E402

import torch_pjrt.integrations.lightning as pjrt_lightning  # noqa: E402

STEPS, BATCH = 4, 8


class Classifier(pl.LightningModule):
    """A small MLP classifier that keeps each step's loss and its logits' dtype."""

    def __init__(self, sgd: bool = False):
        super().__init__()
        self.sgd = sgd
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(),
                                       torch.nn.LayerNorm(32), torch.nn.Linear(32, 3))
        self.losses: list[torch.Tensor] = []
        self.logit_dtypes: set[torch.dtype] = set()

    def training_step(self, batch, index):
        x, y = batch
        logits = self.net(x)
        self.logit_dtypes.add(logits.dtype)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.losses.append(loss.detach())
        return loss

    def configure_optimizers(self):
        if self.sgd:
            return torch.optim.SGD(self.parameters(), lr=0.1)
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _dataset(processes: int = 1):
    g = torch.Generator().manual_seed(0)
    n = STEPS * BATCH * processes
    return torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g),
                                          torch.randint(0, 3, (n,), generator=g))


def fit(compile_model: bool = False, sgd: bool = False, **trainer_args) -> Classifier:
    """The Classifier after STEPS steps of Trainer(**trainer_args).fit (a DDP job of N
    devices: N processes, rank r taking rows r, r + N, r + 2N... of N times the data,
    BATCH rows a step, instead of Lightning's shuffling sampler)."""
    data = _dataset()
    if "ddp" in trainer_args.get("strategy", ""):
        n, rank = trainer_args["devices"], int(os.environ["RANK"])
        data = torch.utils.data.Subset(_dataset(n), range(rank, STEPS * BATCH * n, n))
        trainer_args["use_distributed_sampler"] = False
    module = Classifier(sgd)
    trainer = pl.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         **trainer_args)
    model = torch.compile(module, backend="pjrt") if compile_model else module
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=BATCH))
    return module


def training(mode: str, precision: str = "32-true", tolerance: float = 1e-5):
    """The Lightning loop on pjrt against the same loop on the CPU."""
    expected = fit(accelerator="cpu", precision=precision)
    with compared(tolerance) as result, eager_mode(mode):
        if mode == "compile":
            torch._dynamo.reset()
        actual = fit(mode == "compile", accelerator="pjrt", strategy="pjrt", devices=1,
                     precision=precision)
        assert actual.losses[0].device.type == "pjrt", "the loop did not run on pjrt"
        assert actual.logit_dtypes == expected.logit_dtypes, \
            f"logits in {actual.logit_dtypes}, on the CPU {expected.logit_dtypes}"
        result.add("loss", actual.losses, expected.losses)
        result.add("param", dict(actual.named_parameters()), dict(expected.named_parameters()))
    return result


CASES = {
    **{("mlp 32-true", m): (lambda m=m: training(m)) for m in MODES},
    # CPU autocast keeps log_softmax in bfloat16, CUDA's policy (pjrt's) runs it in float32
    **{("mlp bf16-mixed", m): (lambda m=m: training(m, "bf16-mixed", tolerance=2e-2))
       for m in MODES},
}
def ddp_two_processes(tolerance: float = 1e-5):
    """strategy="pjrt_ddp" on two processes (torchrun's variables, one pjrt device each,
    the pjrt process group): each rank's weights equal one CPU process trained with SGD on
    both ranks' rows at once (DDP averages the two halves' gradients)."""
    launch = pytest.importorskip("distributed.launch")
    ranks = launch.run("ecosystem.lightning_ranks:ddp", nprocs=2, timeout=300)
    assert [r["backend"] for r in ranks] == ["pjrt", "pjrt"]
    # rank r reads rows r, r + 2, ...: a step of both ranks is 2 * BATCH consecutive rows
    reference = Classifier(sgd=True)
    opt = reference.configure_optimizers()
    x, y = _dataset(2).tensors
    with compared(tolerance) as result:
        for step in range(STEPS):
            rows = slice(2 * BATCH * step, 2 * BATCH * (step + 1))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(reference.net(x[rows]), y[rows]).backward()
            opt.step()
        expected = {n: p.detach() for n, p in reference.named_parameters()}
        for r in ranks:
            result.add(f"rank {r['rank']} param",
                       {n: torch.tensor(v) for n, v in r["params"].items()}, expected)
    return result


CASES[("mlp pjrt_ddp 2 processes", "fused")] = ddp_two_processes
CI = {("mlp 32-true", "fused"), ("mlp bf16-mixed", "fused")}


@pytest.mark.parametrize("case", case_params(CASES, CI), ids=" ".join)
def test_lightning_matches_cpu(case):
    check_case(CASES[case])


def test_registered_names():
    assert "pjrt" in pl.accelerators.AcceleratorRegistry
    assert "pjrt" in pl.strategies.StrategyRegistry
    trainer = pl.Trainer(accelerator="pjrt", strategy="pjrt", devices=1, logger=False)
    assert isinstance(trainer.accelerator, pjrt_lightning.PjrtAccelerator)
    assert trainer.strategy.root_device == torch.device("pjrt", 0)


def test_accelerator_alone_refuses_the_cpu():
    """accelerator="pjrt" without the strategy: Lightning hands the accelerator the CPU;
    it raises, naming the strategy, rather than train on the CPU."""
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException,
                       match="strategy='pjrt'"):
        fit(accelerator="pjrt", devices=1)


@pytest.mark.parametrize("devices, expected", [
    (1, [0]), ("1", [0]), (-1, [0, 1]), ("auto", [0, 1]), ([1], [1]), ("0,1", [0, 1])])
def test_devices(devices, expected):
    """Trainer's `devices` forms (tests run with two XLA:CPU devices)."""
    assert pjrt_lightning.parse_devices(devices) == expected


@pytest.mark.parametrize("devices", [0, 3, [2], "x", True])
def test_bad_devices(devices):
    with pytest.raises(pl.utilities.exceptions.MisconfigurationException, match="devices="):
        pjrt_lightning.parse_devices(devices)

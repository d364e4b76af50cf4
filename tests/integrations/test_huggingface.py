"""Hugging Face's Trainer and accelerate, unchanged, on pjrt by default and on the CPU when
asked: each script runs in a fresh process as a user runs it (docs/ecosystem.md, "Trainer
and accelerate", says what works, what needs a variable, and why). CI runs the 4-step
Trainer; TORCH_PJRT_SLOW_TESTS=1 adds bf16, gradient accumulation with evaluation,
checkpoint resume, accelerate scripts, `accelerate launch` and torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import SLOW_TESTS
from user_shell import user_env

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

HERE = os.path.dirname(os.path.abspath(__file__))
slow = pytest.mark.skipif(not SLOW_TESTS, reason="set TORCH_PJRT_SLOW_TESTS=1 to run it")


def run(args: list[str], timeout: float = 600, **env: str) -> dict:
    """Run a command, return the JSON of its RESULT line (every process's, if several)."""
    out = subprocess.run(args, env=user_env(**env), capture_output=True, text=True,
                         timeout=timeout, cwd=HERE)
    results = [json.loads(line.split("RESULT ", 1)[1])
               for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and results, \
        f"rc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return results[0] if len(results) == 1 else results


def trainer(tmp_path, *flags: str, **env: str) -> dict:
    return run([sys.executable, os.path.join(HERE, "hf_trainer_job.py"), str(tmp_path),
                *flags], **env)


def assert_losses_close(a: dict, b: dict, rtol: float) -> None:
    assert a.keys() == b.keys()
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=rtol), (step, a[step], b[step])


def test_trainer_trains_on_pjrt_by_default_and_on_the_cpu_when_asked(tmp_path):
    on_pjrt = trainer(tmp_path / "pjrt")
    on_cpu = trainer(tmp_path / "cpu", "--use-cpu", ACCELERATE_USE_CPU="1")
    assert on_pjrt["args_device"] == "pjrt" and on_pjrt["seen"] == [["pjrt:0", "pjrt:0"]]
    assert on_cpu["args_device"] == "cpu" and on_cpu["seen"] == [["cpu", "cpu"]]
    assert len(on_pjrt["losses"]) == 4
    assert_losses_close(on_pjrt["losses"], on_cpu["losses"], rtol=1e-5)


@slow
def test_trainer_use_cpu_alone_is_overridden_by_accelerate(tmp_path):
    """The documented exception: accelerate 1.16 applies ACCELERATE_TORCH_DEVICE (which
    torch-pjrt sets for the Trainer) even under use_cpu=True, so the model goes to pjrt and
    the batches to the CPU. If this starts to pass, update docs/ecosystem.md."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "hf_trainer_job.py"),
                          str(tmp_path), "--use-cpu"], env=user_env(), capture_output=True,
                         text=True, timeout=600, cwd=HERE)
    assert out.returncode != 0 and "pjrt:0 and cpu" in out.stderr


@slow
def test_trainer_bf16_gradient_accumulation_and_evaluation(tmp_path):
    """bf16 through accelerate's variable (TrainingArguments(bf16=True) refuses devices
    transformers does not know by name)."""
    flags = ("--grad-accum", "2", "--eval")
    on_pjrt = trainer(tmp_path / "pjrt", *flags, ACCELERATE_MIXED_PRECISION="bf16")
    on_cpu = trainer(tmp_path / "cpu", "--use-cpu", *flags, ACCELERATE_USE_CPU="1",
                     ACCELERATE_MIXED_PRECISION="bf16")
    assert on_pjrt["seen"] == [["pjrt:0", "pjrt:0"]] and on_cpu["seen"] == [["cpu", "cpu"]]
    assert list(on_pjrt["eval_losses"]) == ["2", "4"]
    assert_losses_close(on_pjrt["losses"], on_cpu["losses"], rtol=2e-3)
    assert_losses_close(on_pjrt["eval_losses"], on_cpu["eval_losses"], rtol=2e-3)
    fp32 = trainer(tmp_path / "fp32", *flags)
    assert fp32["losses"] != on_pjrt["losses"]  # autocast did run in bfloat16


@slow
def test_trainer_resumes_from_a_checkpoint_bit_for_bit(tmp_path):
    """Bit for bit under `full_determinism=True` (torch.use_deterministic_algorithms): a
    first run may run a step op by op while its fused program compiles, and round a last
    bit otherwise than the resumed run (docs/compile-cost.md, docs/reliability.md)."""
    whole = trainer(tmp_path / "whole", "--steps", "8", "--save-steps", "4",
                    "--full-determinism")
    assert (tmp_path / "whole" / "checkpoint-4" / "optimizer.pt").exists()
    resumed = trainer(tmp_path / "resumed", "--steps", "8", "--full-determinism", "--resume",
                      str(tmp_path / "whole" / "checkpoint-4"))
    assert resumed["weights"] == whole["weights"]
    assert {s: resumed["losses"][s] for s in ("5", "6", "7", "8")} == \
        {s: whole["losses"][s] for s in ("5", "6", "7", "8")}


@slow
def test_accelerate_script_on_pjrt_and_on_the_cpu():
    script = os.path.join(HERE, "accelerate_job.py")
    on_pjrt = run([sys.executable, script])
    on_cpu = run([sys.executable, script, "--cpu"])
    assert on_pjrt["device"] == "pjrt" and on_pjrt["seen"] == [["pjrt:0", "pjrt:0"]]
    assert on_cpu["device"] == "cpu" and on_cpu["seen"] == [["cpu", "cpu"]]
    assert on_pjrt["losses"] == pytest.approx(on_cpu["losses"], rel=1e-5)


@slow
def test_accelerate_launch_runs_the_trainer_on_pjrt(tmp_path):
    launcher = os.path.join(os.path.dirname(sys.executable), "accelerate")
    out = run([launcher, "launch", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no",
               os.path.join(HERE, "hf_trainer_job.py"), str(tmp_path)])
    assert out["seen"] == [["pjrt:0", "pjrt:0"]]


@slow
def test_torchrun_two_processes_train_without_ddp(tmp_path):
    """accelerate 1.16 has no distributed type for a device it does not know by name: under
    torchrun each process trains alone, on its own device, and transformers warns. If this
    starts to fail because the ranks agree on DDP, update docs/ecosystem.md."""
    from distributed.launch import free_port_pair

    results = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-port", str(free_port_pair()),
                   os.path.join(HERE, "hf_trainer_job.py"), str(tmp_path)], timeout=600)
    assert sorted(r["seen"][0][0] for r in results) == ["pjrt:0", "pjrt:1"]
    assert results[0]["losses"] == results[1]["losses"]  # no gradient was shared

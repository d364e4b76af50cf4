"""vLLM's `LLM` on pjrt against vLLM on the CPU and HF generate on the CPU, token for token.

By default (CI's smoke): the tiny Llama, four prompts alone and batched, greedy, against HF
generate. `TORCH_PJRT_VLLM_FULL=1`: Llama, Qwen2 and Mixtral, every scenario of
generate_tokens.py (continuous batching, chunked prefill, prefix caching, seeded sampling,
stop strings, max_tokens), against vLLM's CPU platform too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FULL = os.environ.get("TORCH_PJRT_VLLM_FULL") == "1"
MODELS = ["llama", "qwen2", "mixtral"] if FULL else ["llama"]
TIMEOUT = 900


@pytest.fixture(scope="session")
def model_root(tmp_path_factory) -> Path:
    root = os.environ.get("TORCH_PJRT_VLLM_MODELS")
    return Path(root) if root else tmp_path_factory.mktemp("models")


def generate(model: Path, platform: str, *flags: str, env: dict | None = None) -> dict:
    """generate_tokens.py's result in a process of its own (vLLM picks one platform a
    process): "pjrt" with the plugin, "cpu" with it switched off (VLLM_PLUGINS empty)."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", **(env or {}))
    if platform == "cpu":
        env["VLLM_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, str(HERE / "generate_tokens.py"), str(model),
                           *flags], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    if proc.returncode != 0:
        raise AssertionError(f"generate_tokens.py on {platform} failed:\n"
                             f"{proc.stderr[-4000:]}")
    sys.path.insert(0, str(HERE))
    from generate_tokens import RESULT

    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith(RESULT))
    return json.loads(line.removeprefix(RESULT))


@pytest.fixture(scope="module", params=MODELS)
def results(request, model_root) -> tuple[str, dict, dict | None]:
    sys.path.insert(0, str(HERE))
    import tiny_models

    path = tiny_models.write_model(request.param, model_root)
    flags = ("--hf",) if FULL else ("--hf", "--smoke")
    pjrt = generate(path, "pjrt", *flags)
    cpu = generate(path, "cpu", *flags[1:]) if FULL else None
    return request.param, pjrt, cpu


def test_greedy_equals_hf_single_and_batched(results):
    name, pjrt, _ = results
    assert pjrt["device"] == "pjrt"
    assert pjrt["async_scheduling"]  # on by default: greedy tokens stay on the device
    assert pjrt["single"] == pjrt["hf_single"], name
    assert pjrt["batched"] == pjrt["hf_single"], name


def test_no_compiles_after_warmup_and_replayed_steps(results):
    out = results[1]
    assert out["compiles_after_warmup"] == 0
    # a prefill step and 15 decode steps, each one program with its logits: recorded (a
    # flush) or replayed; the decode steps are replayed (the single requests before
    # recorded their shapes twice; a replayed shape records every 64th step, a recheck)
    assert out["batched_flushes"] + out["batched_replays"] == 16
    assert out["batched_replays"] >= 13
    assert results[1]["graph_loops"] == 0  # each step one program, its layers not cut apart


@pytest.mark.skipif(not FULL, reason="TORCH_PJRT_VLLM_FULL=1")
def test_scenarios_equal_hf(results):
    name, pjrt, _ = results
    assert pjrt["continuous"] == pjrt["hf_continuous"], name
    assert pjrt["chunked"] == pjrt["hf_chunked"], name
    assert pjrt["prefix"] == pjrt["hf_prefix"], name
    assert pjrt["prefix_cached_tokens"] > 0  # the second request hit the cache


@pytest.mark.skipif(not FULL, reason="TORCH_PJRT_VLLM_FULL=1")
def test_every_scenario_equals_vllm_cpu(results):
    name, pjrt, cpu = results
    for key in ("single", "batched", "continuous", "chunked", "prefix", "seeded", "stop",
                "max_tokens_3"):
        assert pjrt[key] == cpu[key], (name, key)


@pytest.mark.skipif(not FULL, reason="TORCH_PJRT_VLLM_FULL=1")
def test_seeded_sampling_reproducible_and_stops(results):
    _, pjrt, _ = results
    first, second = pjrt["seeded"]
    assert first == second
    stop = pjrt["stop"]
    assert stop["finish_reason"] == "stop"
    assert stop["full_text"].startswith(stop["text"]) and stop["stop"] not in stop["text"]
    assert len(pjrt["max_tokens_3"]) == 3


@pytest.mark.skipif(not FULL, reason="TORCH_PJRT_VLLM_FULL=1")
def test_tensor_parallel_two_processes_equal_hf(model_root):
    sys.path.insert(0, str(HERE))
    import tiny_models

    path = tiny_models.write_model("llama", model_root)
    tp = generate(path, "pjrt", "--smoke", "--tp", "2", "--hf")
    assert tp["batched"] == tp["hf_single"]


@pytest.mark.skipif(not FULL, reason="TORCH_PJRT_VLLM_FULL=1")
def test_async_scheduling_off_equals_hf(model_root):
    """TORCH_PJRT_VLLM_ASYNC=0: the logits read every step and sampled on the host."""
    sys.path.insert(0, str(HERE))
    import tiny_models

    path = tiny_models.write_model("llama", model_root)
    out = generate(path, "pjrt", "--smoke", "--hf", env={"TORCH_PJRT_VLLM_ASYNC": "0"})
    assert not out["async_scheduling"]
    assert out["single"] == out["hf_single"] and out["batched"] == out["hf_single"]
    assert out["compiles_after_warmup"] == 0

"""Runs vLLM's `LLM` on one tiny model through the scenarios the tests compare, and prints
their tokens as JSON (the line after RESULT): on pjrt where the plugin is installed, on vLLM's CPU
platform under `VLLM_PLUGINS=` (empty).

    python generate_tokens.py MODEL_DIR [--smoke] [--hf]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_models  # noqa: E402

MAX_TOKENS = 16
RESULT = "generate_tokens result: "  # the line's start (vLLM's workers print to stdout too)
BATCHED_TOKENS = 128  # the long prompt (296 tokens) is prefilled in three chunks
LONG_PROMPT = " ".join(f"item {i} is {i * 7 % 13}," for i in range(30))
SHARED_PREFIX = "In the beginning the system said: " + "all tokens are equal here; " * 6


def _tokens(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def run(model: str, smoke: bool, tp: int = 1) -> dict:
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=model, dtype="float32", max_model_len=512, max_num_seqs=16,
              max_num_batched_tokens=BATCHED_TOKENS, kv_cache_memory_bytes=32 << 20,
              enable_prefix_caching=True, seed=0, tensor_parallel_size=tp,
              distributed_executor_backend="mp" if tp > 1 else None)
    config = llm.llm_engine.vllm_config
    out: dict = {"startup_s": time.perf_counter() - start,
                 "device": str(config.device_config.device),
                 "async_scheduling": bool(config.scheduler_config.async_scheduling)}
    compiles = _compiles()
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = tiny_models.PROMPTS
    out["single"] = [_tokens(llm.generate([p], greedy, use_tqdm=False))[0] for p in prompts]
    flushes, replays = _counter("flushes"), _counter("graph_replays")
    out["batched"] = _tokens(llm.generate(prompts, greedy, use_tqdm=False))
    # programs run by the batched generate, one prefill step and MAX_TOKENS - 1 decode
    # steps: each step (its forward and logits) recorded (a flush) or replayed
    out["batched_flushes"] = (_counter("flushes") - flushes) if flushes is not None else None
    out["batched_replays"] = (_counter("graph_replays") - replays) if replays is not None \
        else None
    # steps cut into pieces at their repeating layers (a program per layer): none wanted
    out["graph_loops"] = _counter("graph_loops")
    if not smoke:
        # continuous batching: requests of other lengths finishing at other steps
        many = [prompts[i % 4] * (1 + i % 3) for i in range(12)]
        params = [SamplingParams(temperature=0.0, max_tokens=4 + 2 * i, ignore_eos=True)
                  for i in range(12)]
        out["continuous_prompts"] = many
        out["continuous_max_tokens"] = [p.max_tokens for p in params]
        out["continuous"] = _tokens(llm.generate(many, params, use_tqdm=False))
        # chunked prefill: a prompt longer than a step's token budget
        out["chunked"] = _tokens(llm.generate([LONG_PROMPT], greedy, use_tqdm=False))
        # prefix caching: the second request reuses the first one's full blocks
        first = llm.generate([SHARED_PREFIX + "first"], greedy, use_tqdm=False)
        second = llm.generate([SHARED_PREFIX + "second"], greedy, use_tqdm=False)
        out["prefix"] = _tokens(first) + _tokens(second)
        out["prefix_cached_tokens"] = second[0].num_cached_tokens
        # seeded sampling, twice
        sampled = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=1234,
                                 max_tokens=MAX_TOKENS, ignore_eos=True)
        out["seeded"] = [_tokens(llm.generate(prompts, sampled, use_tqdm=False))
                         for _ in range(2)]
        # stop strings: the greedy text of prompt 0 cut before its sixth character
        text = llm.generate([prompts[0]], greedy, use_tqdm=False)[0].outputs[0].text
        stop = text[5:8]
        stopped = llm.generate([prompts[0]], SamplingParams(
            temperature=0.0, max_tokens=MAX_TOKENS, stop=[stop]), use_tqdm=False)[0]
        out["stop"] = {"stop": stop, "text": stopped.outputs[0].text, "full_text": text,
                       "finish_reason": stopped.outputs[0].finish_reason}
        short = llm.generate([prompts[1]], SamplingParams(temperature=0.0, max_tokens=3,
                                                          ignore_eos=True), use_tqdm=False)
        out["max_tokens_3"] = _tokens(short)[0]
    out["compiles_after_warmup"] = _compiles() - compiles if compiles is not None else None
    if tp > 1:  # the model ran in the workers: this process's counters say nothing
        out["compiles_after_warmup"] = out["batched_flushes"] = out["batched_replays"] = None
    return out


def _counter(name: str) -> int | None:
    if "torch_pjrt" not in sys.modules:
        return None
    import torch_pjrt

    return torch_pjrt.metrics().get(name, 0)


def _compiles() -> int | None:
    return _counter("compiles")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--smoke", action="store_true", help="greedy single and batched only")
    parser.add_argument("--hf", action="store_true", help="also HF generate's greedy tokens")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel processes")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    result = run(args.model, args.smoke, args.tp)
    if args.hf:
        result["hf_single"] = tiny_models.hf_greedy(args.model, tiny_models.PROMPTS,
                                                    MAX_TOKENS)
        if not args.smoke:
            result["hf_chunked"] = tiny_models.hf_greedy(args.model, [LONG_PROMPT],
                                                         MAX_TOKENS)
            result["hf_prefix"] = tiny_models.hf_greedy(
                args.model, [SHARED_PREFIX + "first", SHARED_PREFIX + "second"], MAX_TOKENS)
            result["hf_continuous"] = [
                t[:n] for t, n in zip(tiny_models.hf_greedy(
                    args.model, result["continuous_prompts"], 26),
                    result["continuous_max_tokens"])]
    print(RESULT + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # vLLM's engine threads can hold the interpreter's exit for seconds


if __name__ == "__main__":
    main()

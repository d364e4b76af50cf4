"""transformers' own inference paths on pjrt, as a user runs them, each in a fresh process:
a checkpoint loaded onto the device (`from_pretrained(device_map="pjrt")`, which
transformers' hub kernels refused before torch-pjrt turned them off for pjrt), greedy
`generate()` and continuous batching (`generate_batch`), and `transformers serve
--continuous-batching --device pjrt` under the `openai` client. Greedy tokens equal the
same checkpoint's on the CPU (docs/serving.md, "transformers serve")."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from user_shell import user_env

pytest.importorskip("transformers")
# fresh processes that compile their programs on a cold cache: minutes on a loaded 2-core
# machine, under a minute on a quiet one
pytestmark = pytest.mark.timeout(1800)

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "hf_serving_job.py")


def _env(**extra: str) -> dict:
    return user_env(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", **extra)


def _job(*args: str, **env: str) -> dict:
    out = subprocess.run([sys.executable, JOB, *args], env=_env(**env), capture_output=True,
                         text=True, timeout=900, cwd=HERE)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and (lines or "--save" in args), \
        f"rc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return json.loads(lines[0].split(" ", 1)[1]) if lines else {}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-llama"))
    _job(path, "--save")
    return path


@pytest.fixture(scope="module")
def on_cpu(checkpoint) -> dict:
    return _job(checkpoint, "cpu", TORCH_DEVICE_BACKEND_AUTOLOAD="0")


def test_from_pretrained_generate_and_generate_batch_on_pjrt(checkpoint, on_cpu):
    got = _job(checkpoint, "pjrt")
    assert got["device"] == "pjrt:0" and got["hub_kernels"] == "0"
    assert on_cpu["hub_kernels"] is None  # a CPU process without torch-pjrt keeps them on
    assert got["generate"] == on_cpu["generate"]
    assert got["generate_batch"] == on_cpu["generate_batch"] == on_cpu["generate"]
    # continuous batching pads its batches on pjrt (shared programs), not on the CPU
    assert got["padded"] == [True] and on_cpu["padded"] == [False]


def test_generate_batch_unpadded_when_asked(checkpoint, on_cpu):
    got = _job(checkpoint, "pjrt", TORCH_PJRT_HF_PADDING="0")
    assert got["padded"] == [False] and got["generate_batch"] == on_cpu["generate_batch"]


def test_hub_kernels_stay_as_the_user_set_them(checkpoint):
    """USE_HUB_KERNELS in the environment wins: set to 1, transformers' kernels library
    refuses the device, as it names in its message."""
    out = subprocess.run([sys.executable, JOB, checkpoint, "pjrt"],
                         env=_env(USE_HUB_KERNELS="1"), capture_output=True, text=True,
                         timeout=900, cwd=HERE)
    assert out.returncode != 0 and "Unsupported device type 'pjrt'" in out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(checkpoint):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = _free_port()
    cli = os.path.join(os.path.dirname(sys.executable), "transformers")
    log = open(os.path.join(checkpoint, "serve.log"), "w")
    proc = subprocess.Popen(
        [cli, "serve", checkpoint, "--continuous-batching", "--device", "pjrt",
         "--host", "127.0.0.1", "--port", str(port), "--cb-num-blocks", "32",
         "--cb-block-size", "16", "--cb-max-batch-tokens", "64"],
        env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    try:
        while True:
            assert proc.poll() is None, open(log.name).read()[-5000:]
            assert time.monotonic() < deadline, "transformers serve did not start in 600 s"
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def test_transformers_serve_continuous_batching_on_pjrt(checkpoint, on_cpu, server):
    """Three concurrent greedy completions and a streamed one: the CPU's text."""
    openai = pytest.importorskip("openai")
    from hf_serving_job import NEW_TOKENS, PROMPTS

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", timeout=600)

    def complete(prompt: str) -> str:
        r = client.completions.create(model=checkpoint, prompt=prompt, max_tokens=NEW_TOKENS,
                                      temperature=0)
        return r.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(complete, PROMPTS))
    assert texts == on_cpu["texts"]
    stream = client.completions.create(model=checkpoint, prompt=PROMPTS[0],
                                       max_tokens=NEW_TOKENS, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == on_cpu["texts"][0]

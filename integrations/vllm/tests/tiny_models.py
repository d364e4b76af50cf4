"""Tiny Llama, Qwen2 and Mixtral checkpoints written from configs (no downloads), for the tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

TOKENIZER_DIR = Path(os.environ.get(
    "TORCH_PJRT_VLLM_TOKENIZER",
    Path(__file__).resolve().parents[3].parent / "shared" / "torchtitan-assets" / "tokenizer"))

# head_dim 64: vLLM's CPU attention (the reference) takes 32, 64, 80, ... only
_COMMON = dict(vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
               bos_token_id=2016, eos_token_id=2017, pad_token_id=2018,
               tie_word_embeddings=False)

CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=10000.0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=10000.0)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=128,
                     rope_theta=10000.0)),
}


def _tokenizer_ids() -> dict[str, int]:
    import json
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    ids = {v["content"]: int(k) for k, v in config["added_tokens_decoder"].items()}
    return {"bos_token_id": ids[config["bos_token"]], "eos_token_id": ids[config["eos_token"]],
            "pad_token_id": ids[config["pad_token"]]}


def write_model(kind: str, root: str | Path, seed: int = 0) -> Path:
    """Writes the tiny `kind` model (float32 safetensors, the shared tokenizer) under root;
    returns its directory. Written once: an existing directory is reused."""
    import torch
    import transformers

    path = Path(root) / f"tiny-{kind}"
    if (path / "config.json").exists():
        return path
    config_name, model_name, extra = CONFIGS[kind]
    settings = {**_COMMON, **extra, **_tokenizer_ids()}
    config = getattr(transformers, config_name)(**settings, torch_dtype="float32")
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # larger weights than the init's: greedy tokens not all alike
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, tmp / name)
    os.replace(tmp, path)
    return path


PROMPTS = [
    "Hello, my name is",
    "The capital of France is a city that",
    "def fib(n):",
    "Once upon a time in a land far, far away, there lived a little fox who",
]


def hf_greedy(path: str | Path, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """HF generate's greedy tokens for each prompt alone, on the CPU (the reference)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False,
                                 min_new_tokens=max_tokens, pad_token_id=tok.pad_token_id)
        out.append(gen[0, ids.shape[1]:].tolist())
    return out

"""PEFT, unmodified: a LoRA adapter trained on tiny Hugging Face models (from configs, no
downloads) on pjrt gives the CPU's losses, gradients and adapter weights, and
`merge_and_unload` gives the CPU's merged model and logits."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from differential import (  # noqa: E402
    MODES,
    case_params,
    check_case,
    compare_training,
    compared,
    eager_mode,
    pair,
    to,
)

VOCAB, SEQ, BATCH = 96, 8, 2
STEPS = 3


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64))


def _gpt2():  # Conv1D projections: PEFT's fan_in_fan_out path
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


# name: (base model, LoRA config)
MODELS = {
    "llama-lora": (_llama, dict(r=4, lora_alpha=8,
                                target_modules=["q_proj", "v_proj", "down_proj"])),
    "gpt2-lora": (_gpt2, dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj"],
                              fan_in_fan_out=True)),
}


def _model(name: str):
    build, lora = MODELS[name]
    torch.manual_seed(0)
    base = build().train()
    torch.manual_seed(1)
    # lora_dropout 0: dropout draws from each device's own generator
    model = peft.get_peft_model(base, peft.LoraConfig(lora_dropout=0.0, **lora))
    # B starts at zero (PEFT's default) and would keep A's first gradient at zero: a
    # random B makes every adapter weight's gradient count
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    return model


def _batch():
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def lora_training(name: str, mode: str):
    """The adapter's training: only LoRA weights have gradients and change."""
    model = _model(name)
    result = compare_training(model, _batch(), lambda out, _: out.loss, mode=mode,
                              steps=STEPS, optimizer=_adamw)
    assert all("lora_" in g.what for g in result.gaps if g.what.startswith("grad")), \
        "a frozen base weight got a gradient"
    return result


def lora_merge(name: str, mode: str, tolerance: float = 1e-4):
    """merge_and_unload after training on each device: the plain transformers model left
    has the CPU's weights and logits."""
    cpu, dev = pair(_model(name))
    batch = _batch()
    for model, device in ((cpu, "cpu"), (dev, "pjrt")):
        with eager_mode(mode):
            opt = _adamw([p for p in model.parameters() if p.requires_grad])
            for _ in range(STEPS):
                opt.zero_grad()
                model(**to(batch, device)).loss.backward()
                opt.step()
    merged_cpu = cpu.merge_and_unload().eval()
    with compared(tolerance) as result, eager_mode(mode):
        merged = dev.merge_and_unload().eval()
        assert not any("lora_" in n for n, _ in merged.named_parameters())
        forward = torch.compile(merged, backend="pjrt") if mode == "compile" else merged
        with torch.no_grad():
            expected = merged_cpu(input_ids=batch["input_ids"]).logits
            actual = forward(input_ids=batch["input_ids"].to("pjrt")).logits
        result.add("merged weight", {n: p for n, p in merged.named_parameters()},
                   {n: p for n, p in merged_cpu.named_parameters()})
        result.add("logits", actual, expected)
    return result


# (case, mode) -> a Comparison; the sweep (tools/ecosystem_sweep.py) runs every one
CASES = {(f"{name} {what.__name__.split('_')[1]}", mode):
         (lambda name=name, what=what, mode=mode: what(name, mode))
         for name in MODELS for what in (lora_training, lora_merge) for mode in MODES}
# CI: Llama's adapter trained and merged in fused eager
CI = {("llama-lora training", "fused"), ("llama-lora merge", "fused")}


@pytest.mark.parametrize("case", case_params(CASES, CI), ids=" ".join)
def test_peft_matches_cpu(case):
    check_case(CASES[case])

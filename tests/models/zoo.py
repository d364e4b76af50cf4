"""Tiny Hugging Face `transformers` models built from configs (no downloads), their inputs,
and the runs the zoo test compares between CPU and pjrt."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models come from configs
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB, HIDDEN, HEADS, LAYERS, SEQ, BATCH = 96, 32, 4, 2, 8, 2
IMAGE, LABELS = 16, 5

# Every config shares these sizes, so the programs of ops that look alike (a projection,
# a norm, an attention) are shared across architectures in the compile cache.
_TEXT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
             num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
             max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_DECODER = dict(_TEXT, num_key_value_heads=2)


@dataclass(frozen=True)
class Arch:
    """One architecture: how to build it, what it eats, what it can do."""
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[torch.Generator], dict]  # the model's keyword arguments, labels too
    generative: bool = False
    tied: tuple[str, str] | None = None  # two parameters the model ties (one object)


def _causal_lm(config_cls, model_cls, **kw):
    def build():
        return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kw))
    return build


def _tokens(gen: torch.Generator, batch=BATCH, seq=SEQ) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=gen)


def _lm_inputs(gen):
    ids = _tokens(gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _mlm_inputs(gen):
    ids = _tokens(gen)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]  # the masked-LM loss sees a third of the positions
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _seq2seq_inputs(gen):
    ids = _tokens(gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "labels": _tokens(gen, seq=SEQ - 2)}


def _image_inputs(gen):
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen),
            "labels": torch.randint(0, LABELS, (BATCH,), generator=gen)}


_NO_DROPOUT_GPT2 = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
_NO_DROPOUT_BERT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

ARCHS = {a.name: a for a in [
    Arch("gpt2", _causal_lm("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=HIDDEN,
                            n_layer=LAYERS, n_head=HEADS, n_positions=64, bos_token_id=1,
                            eos_token_id=2, pad_token_id=0, **_NO_DROPOUT_GPT2),
         _lm_inputs, generative=True, tied=("transformer.wte.weight", "lm_head.weight")),
    Arch("llama", _causal_lm("LlamaConfig", "LlamaForCausalLM", **_DECODER),
         _lm_inputs, generative=True),
    Arch("qwen2", _causal_lm("Qwen2Config", "Qwen2ForCausalLM", **_DECODER),
         _lm_inputs, generative=True),
    # a window shorter than the prompt: the sliding-window mask matters from the start
    Arch("mistral", _causal_lm("MistralConfig", "MistralForCausalLM", sliding_window=4,
                               **_DECODER),
         _lm_inputs, generative=True),
    Arch("gemma", _causal_lm("GemmaConfig", "GemmaForCausalLM", head_dim=HIDDEN // HEADS,
                             **_DECODER),
         _lm_inputs, generative=True, tied=("model.embed_tokens.weight", "lm_head.weight")),
    Arch("mixtral", _causal_lm("MixtralConfig", "MixtralForCausalLM", num_local_experts=4,
                               num_experts_per_tok=2, **_DECODER),
         _lm_inputs, generative=True),
    Arch("bert", _causal_lm("BertConfig", "BertForMaskedLM", **_TEXT, **_NO_DROPOUT_BERT),
         _mlm_inputs, tied=("bert.embeddings.word_embeddings.weight",
                            "cls.predictions.decoder.weight")),
    Arch("t5", _causal_lm("T5Config", "T5ForConditionalGeneration", vocab_size=VOCAB,
                          d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=2 * HIDDEN,
                          num_layers=LAYERS, num_heads=HEADS, dropout_rate=0.0,
                          pad_token_id=0, eos_token_id=2, decoder_start_token_id=0),
         _seq2seq_inputs, generative=True, tied=("shared.weight", "lm_head.weight")),
    Arch("vit", _causal_lm("ViTConfig", "ViTForImageClassification", image_size=IMAGE,
                           patch_size=4, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=2 * HIDDEN,
                           num_labels=LABELS, **_NO_DROPOUT_BERT),
         _image_inputs),
    Arch("resnet", _causal_lm("ResNetConfig", "ResNetForImageClassification",
                              embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                              num_labels=LABELS),
         _image_inputs),
]}
GENERATIVE = [name for name, a in ARCHS.items() if a.generative]


def build(arch: Arch, seed: int = 0) -> torch.nn.Module:
    """The model with seeded weights, in training mode."""
    torch.manual_seed(seed)
    return arch.build().train()


def inputs(arch: Arch, seed: int = 0) -> dict:
    return arch.inputs(torch.Generator().manual_seed(seed))


def to(tree, device, dtype: torch.dtype | None = None):
    """`tree`'s tensors on `device`; with `dtype`, its floating-point ones in that dtype."""
    if isinstance(tree, dict):
        return {k: to(v, device, dtype) for k, v in tree.items()}
    if not isinstance(tree, torch.Tensor):
        return tree
    return tree.to(device, dtype) if dtype is not None and tree.is_floating_point() \
        else tree.to(device)


def reference(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of the CPU model: what the float32 runs of both devices are measured
    against (tests/tolerance.py's assert_as_accurate)."""
    ref = copy.deepcopy(model).double()
    if getattr(ref.config, "_experts_implementation", None) is not None:
        # the grouped matrix product of MoE layers takes no float64: the per-expert loop
        ref.config._experts_implementation = "eager"
    return ref


def pair(arch: Arch, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model on the CPU and (a copy) moved to pjrt."""
    cpu = build(arch, seed)
    return cpu, copy.deepcopy(cpu).to("pjrt")


def logits_of(out) -> torch.Tensor:
    return out.logits


def forward_backward(model, kwargs: dict, forward: Callable | None = None):
    """(logits, loss, {parameter name: gradient}) of one training step's forward/backward."""
    model.zero_grad(set_to_none=True)
    out = (model if forward is None else forward)(**kwargs)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), out.loss.detach(), grads


def adamw_steps(model, kwargs: dict, steps: int, forward: Callable | None = None):
    """The losses of `steps` AdamW steps, and how much the steps amplified rounding in each
    parameter ({parameter: sensitivity}, tests/tolerance.py adamw_step_sensitivity)."""
    from tolerance import adamw_step_sensitivity

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, sensitivity = [], {}
    for _ in range(steps):
        opt.zero_grad()
        loss = (model if forward is None else forward)(**kwargs).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        for p, s in adamw_step_sensitivity(opt).items():
            sensitivity[p] = sensitivity[p] + s if p in sensitivity else s
    return [float(x) for x in losses], sensitivity


def generate(model, kwargs: dict, new_tokens: int, cache: str) -> torch.Tensor:
    """Greedy decoding of `new_tokens` tokens with the dynamic or the static KV cache."""
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        return model.generate(input_ids=kwargs["input_ids"],
                              attention_mask=kwargs["attention_mask"],
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, **extra)

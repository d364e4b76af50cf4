"""transformers' inference paths as a user runs them, in a fresh process, for
tests/integrations/test_transformers_serving.py: a checkpoint saved to disk, loaded onto a
device with `from_pretrained(device_map=...)`, then a greedy `generate()` and continuous
batching (`generate_batch`); prints one JSON line of the generated tokens.

    python hf_serving_job.py MODEL_DIR DEVICE          (DEVICE: pjrt or cpu)
    python hf_serving_job.py MODEL_DIR --save          (writes the tiny checkpoint)
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import transformers

TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[os.pardir] * 3,
                         "shared", "torchtitan-assets", "tokenizer")
PROMPTS = ("The quick brown fox", "A pjrt device", "Once upon a time, in a land far away")
NEW_TOKENS = 8


def save(out: str) -> None:
    """A tiny Llama from a config (no download) and the test tokenizer, saved to `out`."""
    torch.manual_seed(0)
    tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=172, max_position_embeddings=256,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id or 0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)


def run(model_dir: str, device: str) -> dict:
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, device_map=device)
    model.eval()
    model.generation_config.eos_token_id = None  # every prompt runs for all its tokens
    prompts = [tok(p).input_ids for p in PROMPTS]
    generated = []
    with torch.no_grad():
        for ids in prompts:
            ids_t = torch.tensor([ids], device=device)
            out = model.generate(ids_t, max_new_tokens=NEW_TOKENS, do_sample=False)
            generated.append(out[0, len(ids):].cpu().tolist())
    config = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False,
                                           eos_token_id=-1, pad_token_id=0)
    # a KV cache sized for this work (left to itself it sizes from the free memory it finds)
    cache = transformers.generation.ContinuousBatchingConfig(
        page_size=16, num_blocks=16, max_batch_tokens=64, max_requests_per_batch=len(prompts))
    from transformers.generation.continuous_batching import model_runner

    padded = []  # whether each continuous-batching model runner pads its batches
    init = model_runner.ModelRunner.__init__

    def noting(self, *args, **kwargs):
        init(self, *args, **kwargs)
        padded.append(self.pad_inputs)

    model_runner.ModelRunner.__init__ = noting
    batch = model.generate_batch(inputs=prompts, generation_config=config,
                                 continuous_batching_config=cache)
    return {"device": str(next(model.parameters()).device),
            "hub_kernels": os.environ.get("USE_HUB_KERNELS"),
            "generate": generated,
            "generate_batch": [batch[k].generated_tokens for k in sorted(batch)],
            "padded": padded,
            "texts": [tok.decode(g) for g in generated]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("device", nargs="?", default="pjrt")
    p.add_argument("--save", action="store_true")
    args = p.parse_args()
    if args.save:
        save(args.model_dir)
        return
    print("RESULT " + json.dumps(run(args.model_dir, args.device)), flush=True)


if __name__ == "__main__":
    main()

"""A plain Hugging Face Trainer script (no device argument anywhere), run in a fresh process
by tests/integrations/test_huggingface.py; prints one JSON line: where the model and the
batches were, the losses, and a digest of the final weights.

    python hf_trainer_job.py OUT_DIR [--use-cpu] [--bf16] [--steps N] [--grad-accum N]
                             [--eval] [--save-steps N] [--resume CHECKPOINT] [--dropout P]
                             [--ddp-backend NAME] [--full-determinism]
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

VOCAB, SEQ = 64, 16


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, the same in every process."""

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(self.offset + i)
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


class Where(Trainer):
    """Notes the device of the model and of each batch as the Trainer hands them over."""

    seen: set = set()

    def compute_loss(self, model, inputs, **kwargs):
        Where.seen.add((str(next(model.parameters()).device), str(inputs["input_ids"].device)))
        return super().compute_loss(model, inputs, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--use-cpu", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--eval", action="store_true")
    p.add_argument("--save-steps", type=int, default=0)
    p.add_argument("--resume", default=None)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--ddp-backend", default=None)
    p.add_argument("--full-determinism", action="store_true")
    a = p.parse_args()

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, attention_dropout=a.dropout)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    args = TrainingArguments(
        output_dir=a.out, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        max_steps=a.steps, gradient_accumulation_steps=a.grad_accum, learning_rate=1e-3,
        logging_steps=1, report_to=[], use_cpu=a.use_cpu, bf16=a.bf16,
        eval_strategy="steps" if a.eval else "no", eval_steps=2,
        save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
        dataloader_num_workers=0, disable_tqdm=True, ddp_backend=a.ddp_backend,
        full_determinism=a.full_determinism)
    trainer = Where(model=model, args=args, train_dataset=Tokens(64),
                    eval_dataset=Tokens(8, offset=1000) if a.eval else None)
    trainer.train(resume_from_checkpoint=a.resume)
    digest = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        digest.update(name.encode() + t.detach().cpu().contiguous().view(torch.uint8).numpy()
                      .tobytes())
    history = trainer.state.log_history
    print("RESULT " + json.dumps({
        "args_device": str(args.device),
        "seen": sorted(Where.seen),
        "losses": {h["step"]: h["loss"] for h in history if "loss" in h},
        "eval_losses": {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h},
        "weights": digest.hexdigest(),
        "param_dtype": str(next(model.parameters()).dtype),
    }))


if __name__ == "__main__":
    main()

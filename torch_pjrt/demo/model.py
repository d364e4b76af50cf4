"""A GPT-style language model in plain PyTorch (nothing backend-specific)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    seq_len: int = 64
    layers: int = 2
    d_model: int = 128
    heads: int = 4
    dropout: float = 0.0


SIZES = {
    "tiny": GPTConfig(layers=2, d_model=128, heads=4),
    "small": GPTConfig(layers=4, d_model=256, heads=4),
}


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, n: int, temperature: float = 0.8,
                 top_k: int = 20, on_token=None) -> torch.Tensor:
        """`n` more tokens after `idx`. The model always sees a [B, seq_len] window (tokens
        at the front, the next position chosen by an index tensor), so every step has the
        same shapes: a compiler or fused eager compiles the step once, not once per length.
        Causal attention makes the unused tail of the window irrelevant. `on_token(t)` sees
        each new [B, 1] token as it is drawn (e.g. to stream it)."""
        b, length = idx.shape
        size = self.cfg.seq_len
        filled = min(length, size)
        window = torch.zeros(b, size, dtype=idx.dtype, device=idx.device)
        window[:, :filled] = idx[:, -filled:]
        new = []
        for _ in range(n):
            last = torch.tensor([filled - 1], device=idx.device)
            logits = self(window).index_select(1, last)[:, 0, :] / temperature
            kth = torch.topk(logits, top_k).values[:, -1:]
            logits = logits.masked_fill(logits < kth, -math.inf)
            nxt = torch.multinomial(F.softmax(logits, dim=-1), 1)
            if filled < size:
                window = window.index_copy(1, last + 1, nxt)
                filled += 1
            else:
                window = torch.cat([window[:, 1:], nxt], dim=1)
            new.append(nxt)
            if on_token is not None:
                on_token(nxt)
        return torch.cat([idx, *new], dim=1)

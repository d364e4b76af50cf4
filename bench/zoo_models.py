"""The models of bench/models.py in plain PyTorch, each with its own input pipeline on the
device: the zoo of training steps (and one generate) that speed claims are measured on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_pjrt.demo.model import GPT, GPTConfig

POOL = 4  # batches each pipeline keeps on the device; step i reads batch i % POOL


@dataclass(frozen=True)
class Spec:
    """One zoo entry: a model, its optimizer, its device input pipeline and its loss."""
    name: str
    about: str
    build: Callable[[bool], nn.Module]  # small=True: the --smoke size
    optimizer: Callable[[list], torch.optim.Optimizer]
    data: Callable[[torch.Generator, bool], dict]  # CPU tensors, POOL batches stacked
    # one step's loss from one batch: loss(module, forward, batch), forward maybe compiled
    loss: Callable[[nn.Module, Callable, dict], torch.Tensor]
    generate: bool = False  # timed as a greedy generate (forward only), not a training step


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-4)


def _tokens(gen, vocab, batch, seq, extra=0):
    return torch.randint(0, vocab, (POOL, batch, seq + extra), generator=gen)


def _lm_loss(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# -- the GPT of bench/train.py ---------------------------------------------------------------

def _gpt_cfg(small):
    return GPTConfig(vocab=256, seq_len=32, layers=1, d_model=64, heads=4) if small else \
        GPTConfig(vocab=512, seq_len=128, layers=4, d_model=256, heads=4)


def _lm_data(seq_of, batch_of):
    def data(gen, small):
        cfg = seq_of(small)
        ids = _tokens(gen, cfg.vocab, batch_of(small), cfg.seq_len, extra=1)
        return {"ids": ids}
    return data


def _next_token_loss(module, forward, batch):
    ids = batch["ids"]
    return _lm_loss(forward(ids[:, :-1]), ids[:, 1:])


# -- a GPT as a new user writes it: nn.MultiheadAttention, a boolean triu mask, pre-norm ----

class MHABlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class MHAGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq_len, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(MHABlock(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, idx):
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), diagonal=1)
        x = self.tok(idx) + self.pos[:t]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


# -- a Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention -----

@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 512
    seq_len: int = 128
    layers: int = 4
    d_model: int = 256
    heads: int = 8
    kv_heads: int = 2
    hidden: int = 688


def _llama_cfg(small):
    return LlamaConfig(vocab=256, seq_len=32, layers=1, d_model=64, heads=4, kv_heads=2,
                       hidden=176) if small else LlamaConfig()


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.head_dim = cfg.d_model // cfg.heads
        self.norm1, self.norm2 = RMSNorm(cfg.d_model), RMSNorm(cfg.d_model)
        self.q = nn.Linear(cfg.d_model, cfg.heads * self.head_dim, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(cfg.heads * self.head_dim, cfg.d_model, bias=False)
        self.gate = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=False)

    def forward(self, x, cos, sin, cache=None, position=None, mask=None):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if cache is not None:  # a static cache: written at `position`, read whole, masked
            k_cache, v_cache = cache
            k_cache.index_copy_(2, position, k)
            v_cache.index_copy_(2, position, v)
            k, v = k_cache, v_cache
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        dim = cfg.d_model // cfg.heads
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(cfg.seq_len).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, idx, position=None, caches=None):
        """Training: idx [B, T], causal. Decoding: `position` [T] indexes the rotary tables
        and the static caches (one (k, v) per block), attention masked to the filled part."""
        t = idx.shape[1]
        x = self.embed(idx)
        if position is None:
            cos, sin, mask = self.cos[:t], self.sin[:t], None
            caches = [None] * len(self.blocks)
        else:
            cos, sin = self.cos.index_select(0, position), self.sin.index_select(0, position)
            slots = torch.arange(self.cfg.seq_len, device=idx.device)
            mask = slots[None, :] <= position[:, None]  # [T, S]: a query sees filled slots
        for block, cache in zip(self.blocks, caches):
            x = block(x, cos, sin, cache, position, mask)
        return self.head(self.norm(x))


# -- a BERT-style encoder with padding masks ---------------------------------------------------

class BertLayer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"),
                                nn.Linear(4 * d, d))

    def forward(self, x, keep):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                   for z in self.qkv(x).split(d, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        x = self.ln1(x + self.out(y.transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.ff(x))


class Bert(nn.Module):
    def __init__(self, vocab, seq, layers, d, heads):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(BertLayer(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, lengths):
        t = ids.shape[1]
        positions = torch.arange(t, device=ids.device)
        keep = positions[None, :] < lengths[:, None]  # padding mask built on the device
        x = self.ln(self.tok(ids) + self.pos(positions))
        for layer in self.layers:
            x = layer(x, keep)
        return self.head(x), keep


def _bert_sizes(small):
    return (256, 32, 1, 64, 4, 4) if small else (512, 128, 4, 256, 4, 8)


def _bert_data(gen, small):
    vocab, seq, _, _, _, batch = _bert_sizes(small)
    ids = _tokens(gen, vocab, batch, seq)
    lengths = torch.randint(seq // 4, seq + 1, (POOL, batch), generator=gen)
    return {"ids": ids, "lengths": lengths}


def _bert_loss(module, forward, batch):
    ids, lengths = batch["ids"], batch["lengths"]
    logits, keep = forward(ids, lengths)
    labels = ids.masked_fill(~keep, -100)  # padding positions do not count
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


# -- a ResNet-style CNN on 32x32 images --------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, widths, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.pool(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def _image_data(batch_of):
    def data(gen, small):
        b = batch_of(small)
        return {"images": torch.randn(POOL, b, 3, 32, 32, generator=gen),
                "labels": torch.randint(0, 10, (POOL, b), generator=gen),
                "flip": torch.rand(POOL, b, generator=gen) < 0.5}
    return data


def _image_loss(module, forward, batch):
    images = batch["images"]  # a random horizontal flip, on the device
    images = torch.where(batch["flip"][:, None, None, None], images.flip(3), images)
    return F.cross_entropy(forward(images), batch["labels"])


# -- a ViT ------------------------------------------------------------------------------------

class ViT(nn.Module):
    def __init__(self, d, layers, heads, patch=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        tokens = (32 // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, tokens, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


# -- an LSTM language model --------------------------------------------------------------------

class LSTMLM(nn.Module):
    def __init__(self, vocab, d, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, layers, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        return self.head(self.lstm(self.embed(idx))[0])


def _lstm_sizes(small):
    return (256, 8, 64, 1, 4) if small else (512, 64, 256, 2, 16)  # vocab seq d layers batch


def _lstm_data(gen, small):
    vocab, seq, _, _, batch = _lstm_sizes(small)
    return {"ids": _tokens(gen, vocab, batch, seq, extra=1)}


# -- the forward of a greedy generate with a static KV cache -----------------------------------

PROMPT, NEW_TOKENS = 16, 32


def _generate_cfg(small):
    return LlamaConfig(vocab=256, seq_len=PROMPT + 4, layers=1, d_model=64, heads=4,
                       kv_heads=2, hidden=176) if small else \
        LlamaConfig(vocab=512, seq_len=PROMPT + NEW_TOKENS, layers=4, d_model=256, heads=8,
                    kv_heads=2, hidden=688)


def generate(model: Llama, forward, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding with a static KV cache: a prefill of the prompt, then one token a
    step; every decode step has the same shapes. Returns the new tokens [B, new_tokens]."""
    cfg, (b, t) = model.cfg, prompt.shape
    dev = prompt.device
    shape = (b, cfg.kv_heads, cfg.seq_len, cfg.d_model // cfg.heads)
    caches = [(torch.zeros(shape, device=dev), torch.zeros(shape, device=dev))
              for _ in model.blocks]
    position = torch.arange(t, device=dev)
    logits = forward(prompt, position, caches)
    token = logits[:, -1:].argmax(-1)
    out = [token]
    position = position[-1:]
    for _ in range(new_tokens - 1):
        position = position + 1
        token = forward(token, position, caches)[:, -1:].argmax(-1)
        out.append(token)
    return torch.cat(out, dim=1)


def _generate_data(gen, small):
    cfg = _generate_cfg(small)
    return {"ids": _tokens(gen, cfg.vocab, 1 if small else 4, PROMPT)}


def _generate_loss(module, forward, batch):
    """The generated tokens' sum (one number to compare and to wait for)."""
    new = module.cfg.seq_len - PROMPT
    return generate(module, forward, batch["ids"], new).sum()


SPECS = [
    Spec("gpt", "the GPT of bench/train.py: 4 layers, d=256, seq 128, batch 8, vocab 512",
         lambda small: GPT(_gpt_cfg(small)), adamw,
         _lm_data(_gpt_cfg, lambda small: 2 if small else 8), _next_token_loss),
    Spec("gpt-mha", "nn.MultiheadAttention, boolean triu mask each step, nn.GELU, pre-norm; "
         "4 layers, d=256, seq 128, batch 8, vocab 512",
         lambda small: MHAGPT(_gpt_cfg(small)), adamw,
         _lm_data(_gpt_cfg, lambda small: 2 if small else 8), _next_token_loss),
    Spec("llama", "RMSNorm, rotary, SwiGLU, 8 heads / 2 kv heads; 4 layers, d=256, seq 128, "
         "batch 8, vocab 512", lambda small: Llama(_llama_cfg(small)), adamw,
         _lm_data(_llama_cfg, lambda small: 2 if small else 8), _next_token_loss),
    Spec("bert", "post-norm encoder, padding masks from per-sample lengths, masked LM loss; "
         "4 layers, d=256, seq 128, batch 8", lambda small: Bert(*_bert_sizes(small)[:5]),
         adamw, _bert_data, _bert_loss),
    Spec("resnet", "conv/batch norm/ReLU, 4 basic blocks (32-256 channels), max pool, SGD "
         "momentum; batch 32 of 3x32x32, random flips",
         lambda small: ResNet((8, 16) if small else (32, 64, 128, 256)), sgd,
         _image_data(lambda small: 2 if small else 32), _image_loss),
    Spec("vit", "nn.TransformerEncoder (norm first), 4x4 patches; 4 layers, d=192, 3 heads, "
         "batch 32 of 3x32x32", lambda small: ViT(32, 1, 2) if small else ViT(192, 4, 3), adamw,
         _image_data(lambda small: 2 if small else 32), _image_loss),
    Spec("lstm", "nn.LSTM language model: 2 layers, d=256, seq 64, batch 16, vocab 512",
         lambda small: LSTMLM(*_lstm_sizes(small)[:1], *_lstm_sizes(small)[2:4]), adamw,
         _lstm_data, _next_token_loss),
    Spec("generate", f"greedy generate, static KV cache, Llama of 4 layers d=256: a prompt of "
         f"{PROMPT}, {NEW_TOKENS} new tokens, batch 4 (forward only)",
         lambda small: Llama(_generate_cfg(small)), adamw, _generate_data, _generate_loss,
         generate=True),
]


def init_weights(model: nn.Module) -> nn.Module:
    """Small normal weights, so that the losses stay finite and comparable."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)) and not isinstance(model, GPT):
            nn.init.normal_(m.weight, std=0.02)
    return model


"""The benchmark GPT written directly in JAX, one `jax.jit` train step (forward, backward,
AdamW), started from the PyTorch model's weights: the reference that shows what going
through PyTorch costs."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)


def _params_from_torch(model) -> dict:
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * w + b


def _linear(x, p, name, bias=True):
    y = x @ p[f"{name}.weight"].T
    return y + p[f"{name}.bias"] if bias else y


def loss_fn(p: dict, idx, targets, cfg) -> jax.Array:
    b, t = idx.shape
    d, h = cfg.d_model, cfg.heads
    x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(t)]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(cfg.layers):
        pre = f"blocks.{i}."
        hdn = _layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"])
        q, k, v = jnp.split(_linear(hdn, p, pre + "qkv"), 3, axis=-1)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
        att = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(d // h).astype(np.float32)
        att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + _linear(y, p, pre + "proj")
        hdn = _layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"])
        x = x + _linear(jax.nn.gelu(_linear(hdn, p, pre + "mlp.0"), approximate=False),
                        p, pre + "mlp.2")
    logits = _linear(_layer_norm(x, p["ln.weight"], p["ln.bias"]), p, "head", bias=False)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def make_step(cfg, lr: float, wd: float = 0.01, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8):
    """One jitted AdamW training step with PyTorch's AdamW update rule."""

    def step(p, m, v, t, idx, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, targets, cfg)
        t = t + 1
        bc1 = 1 - b1 ** t.astype(jnp.float32)
        bc2 = 1 - b2 ** t.astype(jnp.float32)
        new_p, new_m, new_v = {}, {}, {}
        for k in p:
            pk = p[k] * (1 - lr * wd)
            new_m[k] = b1 * m[k] + (1 - b1) * g[k]
            new_v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k]
            denom = jnp.sqrt(new_v[k]) / jnp.sqrt(bc2) + eps
            new_p[k] = pk - (lr / bc1) * new_m[k] / denom
        return new_p, new_m, new_v, t, loss

    return jax.jit(step, donate_argnums=(0, 1, 2, 3))


class JaxTrainer:
    """Same interface as bench/train.py's TorchTrainer."""

    def __init__(self, cfg, model, lr: float):
        self.name = "jax jit"
        self.cfg = cfg
        self.p = _params_from_torch(model)
        self.m = {k: jnp.zeros_like(v) for k, v in self.p.items()}
        self.v = {k: jnp.zeros_like(v) for k, v in self.p.items()}
        self.t = jnp.zeros((), jnp.int32)
        self.step_fn = make_step(cfg, lr)

    def run(self, batches) -> tuple[float, float]:
        start = time.perf_counter()
        loss = None
        for x, y in batches:
            idx, tgt = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
            self.p, self.m, self.v, self.t, loss = self.step_fn(self.p, self.m, self.v, self.t,
                                                               idx, tgt)
        value = float(loss)
        return time.perf_counter() - start, value

"""Runs TorchTitan's trainer on pjrt (or CPU over gloo), with the version-skew workarounds.

    torchrun --nproc-per-node 2 bench/torchtitan_run.py --device pjrt -- \\
        --module llama3 --config llama3_debugmodel --parallelism.data-parallel-shard-degree 2

Everything after `--` goes to TorchTitan unchanged; this script adds the offline assets
(the test tokenizer from /work/shared/torchtitan-assets or TORCH_PJRT_TITAN_ASSETS, a small
local `c4_test` stand-in written from the standard library's docstrings), a short run
(seed 42, seq 256, local batch 2, 5 steps, no validation, no checkpoint saved) and these
workarounds for torchtitan 0.3.0 on torch 2.13, none of which is torch-pjrt's to fix:

- it imports `triton` without declaring it (in its expert-parallel kernels, which the
  llama3 model never calls): a stand-in for that one module;
- it calls `torch.distributed.set_timeout`, which torch 2.13 lacks: a stand-in that sets
  the timeout of the group's backends where they have one, and otherwise does nothing;
- its default `--parallelism.spmd-backend` needs a newer torch: `partial_dtensor`;
- FlexAttention has no backward on CPU and accepts no other device type: the same
  attention as one `scaled_dot_product_attention` with the block mask made dense;
- gloo refuses FSDP2's PREMUL_SUM reduce-scatter (TorchTitan's gradient divide factor 1):
  on CPU only, SUM then the same division (pjrt runs PREMUL_SUM itself);
- `--device cpu` runs the same job on CPU tensors over gloo (the reference), with stand-ins
  for what TorchTitan asks of `torch.cpu` and lacks (device name, capacity, memory
  statistics, an integer current device for a barrier);
- `--optimizer.implementation foreach` on both devices, so that both take the same AdamW
  path (pjrt has `_fused_adamw_`; the fused path was not compared here);
- `--seed-checkpoint DIR`: TorchTitan's seed checkpoint, written by one CPU process, loaded
  by every run, so that both devices start from the same weights (each device's random
  numbers, and DTensor's sharded initialisation on CPU meshes, differ).

Rank 0 prints `titan-loss step=N loss=X` lines (the losses TorchTitan logs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pydoc
import sys
import types

DEFAULT_ASSETS = "/work/shared/torchtitan-assets"


def _triton_stub() -> None:
    """Where Triton is missing: an empty stand-in for TorchTitan's one module that imports it
    unconditionally (the Triton kernels of its expert-parallel all-to-all, unused here).
    A fake `triton` itself would make torch's inductor believe Triton is installed."""
    import importlib.util
    if importlib.util.find_spec("triton") is not None:
        return

    def kernel(*args, **kwargs):
        raise RuntimeError("torchtitan_run.py: Triton is not installed")

    name = "torchtitan.distributed.minimal_async_ep.kernels"
    mod = types.ModuleType(name, "stand-in: Triton is not installed")
    for attr in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel",
                 "expand_topk_grad_kernel", "fill_combine_metadata_kernel",
                 "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel"):
        setattr(mod, attr, kernel)
    sys.modules[name] = mod


def _write_dataset(folder: str, rows: int = 400) -> str:
    """`c4_test` stand-in: JSON lines with a "text" field, from standard-library docstrings."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "train.jsonl")
    if os.path.exists(path):
        return folder
    import builtins
    import collections
    import itertools
    import json as json_mod
    import os.path as os_path
    import re
    import string
    texts = []
    for mod in (builtins, collections, itertools, json_mod, os_path, re, string, argparse):
        for name in sorted(dir(mod)):
            doc = pydoc.getdoc(getattr(mod, name, None))
            if doc and len(doc) > 200:
                texts.append(doc)
    texts = (texts * (rows // max(len(texts), 1) + 1))[:rows]
    tmp = path + f".{os.getpid()}"
    with open(tmp, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    os.replace(tmp, path)
    return folder


def _cpu_device_module() -> None:
    """The reference run on CPU: what TorchTitan asks of `torch.cpu` that it lacks (names,
    capacity, a memory-statistics dict with no entries; TorchTitan reports -1 for those)."""
    import torch
    cpu = torch.cpu
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    stand_ins = {
        "get_device_name": lambda device=None: "cpu",
        "get_device_properties": lambda device=None: types.SimpleNamespace(
            name="cpu", total_memory=total),
        "memory_stats": lambda device=None: {},
        "reset_peak_memory_stats": lambda device=None: None,
        "empty_cache": lambda: None,
    }
    for name, fn in stand_ins.items():
        if not hasattr(cpu, name):
            setattr(cpu, name, fn)


def _cpu_pg_timeouts() -> None:
    """The reference run on CPU: TorchTitan's timeout change after the first step passes
    `torch.cpu.current_device()` ("cpu", a string) as a barrier's device id; the same
    without device ids."""
    import torch.distributed as dist
    from torchtitan.distributed import utils

    def set_pg_timeouts(timeout, parallel_dims) -> None:
        dist.barrier()
        groups = [mesh.get_group()
                  for mesh in parallel_dims.get_all_one_dimensional_meshes().values()]
        for group in groups + [None]:
            dist.set_timeout(timeout, group)

    utils.set_pg_timeouts = set_pg_timeouts


def _gloo_sum_reduce_scatter() -> None:
    """The reference run over gloo: FSDP2's reduce-scatter as SUM then a division where it
    would use PREMUL_SUM (TorchTitan's gradient divide factor 1), which gloo refuses."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as c

    original = c._get_gradient_divide_factors

    def factors(rs_group, ar_group, reduce_dtype, device_type="", factor=None,
                force_sum_reduction_for_comms=False):
        return original(rs_group, ar_group, reduce_dtype, device_type, factor, True)

    c._get_gradient_divide_factors = factors


def _set_timeout_standin() -> None:
    import torch.distributed as dist
    if hasattr(dist, "set_timeout"):
        return

    def set_timeout(timeout: datetime.timedelta, group=None) -> None:
        pg = group or dist.distributed_c10d._get_default_group()
        for dev in ("cpu", "cuda", "pjrt"):
            try:
                backend = pg._get_backend(dist.distributed_c10d.torch.device(dev))
            except Exception:
                continue
            if hasattr(backend, "_set_default_timeout"):
                backend._set_default_timeout(timeout)

    dist.set_timeout = set_timeout


def _flex_to_sdpa() -> None:
    """FlexAttention's call as one SDPA with its block mask evaluated densely."""
    import torch
    import torch.nn.functional as F
    from torchtitan.models.common import attention

    def dense_mask(block_mask, q_len: int, kv_len: int, device) -> torch.Tensor:
        b = torch.arange(block_mask.kv_num_blocks.shape[0], device=device)
        q = torch.arange(q_len, device=device)
        kv = torch.arange(kv_len, device=device)
        h = torch.zeros(1, dtype=torch.long, device=device)
        return block_mask.mask_mod(b[:, None, None, None], h[None, :, None, None],
                                   q[None, None, :, None], kv[None, None, None, :])

    def compiled_flex_attn(q, k, v, *, score_mod, block_mask, scale, enable_gqa,
                           return_aux, kernel_options):
        if score_mod is not None or getattr(return_aux, "lse", False):
            raise NotImplementedError("SDPA stand-in: score_mod and lse are not supported")
        mask = dense_mask(block_mask, q.shape[-2], k.shape[-2], q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                             enable_gqa=enable_gqa)
        return out, None

    attention.FlexAttention.compiled_flex_attn = staticmethod(compiled_flex_attn)


def _log_losses() -> None:
    """Prints each step's loss as `titan-loss step=N loss=X` (from TorchTitan's metrics)."""
    from torchtitan.components import metrics

    cls = metrics.MetricsProcessor
    original = cls.log

    def log(self, step, global_avg_loss, *args, **kwargs):
        if os.environ.get("RANK", "0") == "0":
            print(f"titan-loss step={step} loss={float(global_avg_loss):.6f}", flush=True)
        return original(self, step, global_avg_loss, *args, **kwargs)

    cls.log = log


def _checkpoint_args(seed: str | None) -> list[str]:
    """No checkpoints; or create the seed checkpoint (one process); or start from it."""
    if seed is None:
        return ["--checkpoint.no-enable"]
    seed = os.path.abspath(seed)
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return ["--checkpoint.enable", "--checkpoint.create-seed-checkpoint",
                "--checkpoint.folder", seed]
    if not os.path.isdir(os.path.join(seed, "step-0")):
        raise SystemExit(f"torchtitan_run.py: no seed checkpoint at {seed}/step-0: write it "
                         "first with one process (--nproc-per-node 1)")
    return ["--checkpoint.enable", "--checkpoint.load-only",
            "--checkpoint.initial-load-path", os.path.join(seed, "step-0"),
            "--checkpoint.folder", os.path.join(os.path.dirname(seed), "unused-checkpoints")]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("pjrt", "cpu"), default="pjrt")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed-checkpoint", metavar="DIR",
                   help="one process: write the initial weights to DIR (TorchTitan's seed "
                        "checkpoint); several: start from DIR/step-0 (no other checkpoint)")
    p.add_argument("--work-dir", default=os.environ.get("TMPDIR", "/tmp") + "/torchtitan-run")
    args = p.parse_args(argv)

    if args.device == "cpu":
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # no pjrt: TorchTitan picks CPU
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _triton_stub()

    import torch
    if args.device == "cpu":
        import torch._utils
        torch._utils._get_available_device_type = lambda: "cpu"
        _cpu_device_module()
        _gloo_sum_reduce_scatter()
    else:
        import torch_pjrt  # noqa: F401

    _set_timeout_standin()
    _flex_to_sdpa()
    _log_losses()
    if args.device == "cpu":
        _cpu_pg_timeouts()

    assets = os.environ.get("TORCH_PJRT_TITAN_ASSETS", DEFAULT_ASSETS)
    data = _write_dataset(os.path.join(args.work_dir, "c4_test"))
    dump = os.path.join(args.work_dir, f"dump-{args.device}-{os.getpid()}")
    sys.argv = ["torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel",
                "--hf-assets-path", os.path.join(assets, "tokenizer"),
                "--dataloader.dataset", "c4_test", "--dataloader.dataset-path", data,
                "--dump-folder", dump,
                "--training.steps", str(args.steps), "--training.seq-len", "256",
                "--training.local-batch-size", "2", "--debug.seed", "42",
                "--parallelism.spmd-backend", "partial_dtensor",
                "--optimizer.implementation", "foreach",
                "--validator.no-enable",
                ] + _checkpoint_args(args.seed_checkpoint) + rest
    from torchtitan.train import main as titan_main
    titan_main()
    del torch


if __name__ == "__main__":
    main()

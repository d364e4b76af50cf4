"""Rank code of test_demo_parallel.py: the demo's --parallel training for each kind."""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch.distributed as dist

from torch_pjrt.demo import parallel, train

ARGS = ["--steps", "3", "--batch-size", "4", "--seq-len", "16", "--compare-cpu"]


def run_all() -> dict:
    dist.init_process_group("cpu:gloo,pjrt:pjrt", timeout=timedelta(seconds=120))
    p = argparse.ArgumentParser()
    train.add_arguments(p)
    out = {kind: parallel.train_parallel(p.parse_args([*ARGS, "--parallel", kind]))
           for kind in parallel.KINDS}
    dist.destroy_process_group()
    return out

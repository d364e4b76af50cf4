"""A plain accelerate script (Accelerator(), prepare, backward: no device named), run in a
fresh process by tests/integrations/test_huggingface.py; prints one JSON line: the
accelerator's device, where the model and batches were, and the losses.

    python accelerate_job.py [--cpu] [--steps N]
"""

from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args()
    accelerator = Accelerator(cpu=a.cpu)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g),
                                          torch.randn(64, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses, seen = [], set()
    for step, (x, y) in enumerate(loader):
        if step == a.steps:
            break
        seen.add((str(next(model.parameters()).device), str(x.device)))
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    print("RESULT " + json.dumps({"device": str(accelerator.device), "seen": sorted(seen),
                                  "losses": losses}))


if __name__ == "__main__":
    main()

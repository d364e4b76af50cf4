"""Training text that every machine has: the Python standard library's own sources."""

from __future__ import annotations

import os
import sysconfig

import torch


def stdlib_text(max_bytes: int = 4 << 20) -> bytes:
    """Up to `max_bytes` of the standard library's .py files, in a fixed order."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("test", "tests", "site-packages",
                                                              "idlelib", "__pycache__"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(dirpath, name), "rb") as f:
                data = f.read()
            chunks.append(data)
            total += len(data)
            if total >= max_bytes:
                return b"".join(chunks)[:max_bytes]
    return b"".join(chunks)


def load(path: str | None, max_bytes: int = 4 << 20) -> torch.Tensor:
    """Bytes of the training text as a uint8 tensor (byte-level vocabulary of 256)."""
    if path is None:
        data = stdlib_text(max_bytes)
    else:
        with open(path, "rb") as f:
            data = f.read(max_bytes)
    if len(data) < 1024:
        raise ValueError(f"training text too short ({len(data)} bytes): need at least 1 KiB")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def split(data: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    n = int(len(data) * (1 - val_fraction))
    return data[:n], data[n:]


def batch(data: torch.Tensor, batch_size: int, seq_len: int,
          gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows (inputs, next-byte targets) on the CPU, as int64."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([data[s:s + seq_len] for s in starts.tolist()]).long()
    y = torch.stack([data[s + 1:s + 1 + seq_len] for s in starts.tolist()]).long()
    return x, y

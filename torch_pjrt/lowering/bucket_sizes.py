"""The bucket policy for sizes that vary from call to call: one XLA program per bucket of
sizes, not per size. torch.compile's dynamic sizes (compile/buckets.py) and fused eager's
attention over a growing key/value cache (eager/dispatch.py) both round with it.

TORCH_PJRT_BUCKETS=k (default 4): sizes up to 16 round up to the next power of two (1, 2,
4, 8, 16); larger sizes round up to the next multiple of 2^j / k within their octave
(2^j, 2^(j+1)], i.e. k buckets per octave. With k=4 that is 20, 24, 28, 32, 40, 48, 56, 64,
80, ...: at most 25% padding and 4 programs per doubling of the size, and every bucket
above 16 is a multiple of 4 (of 8 above 32, ...), which keeps tiles aligned. k=1 is powers
of two; k must be 1, 2, 4, 8 or 16. TORCH_PJRT_BUCKETS=0 (or off) turns bucketing off.
"""

from __future__ import annotations

from .. import _env

SMALL = 16  # sizes up to this round to powers of two


def steps_per_octave() -> int:
    """Buckets per doubling of the size from TORCH_PJRT_BUCKETS; 0: bucketing is off."""
    raw = _env.get("TORCH_PJRT_BUCKETS").strip().lower()
    if raw in ("", "0", "off", "false", "no"):
        return 0
    if raw in ("on", "true", "yes"):
        return 4
    if raw not in ("1", "2", "4", "8", "16"):
        raise ValueError(f"TORCH_PJRT_BUCKETS={raw!r}: expected 0/off or 1, 2, 4, 8, 16 "
                         "(buckets per doubling of the size)")
    return int(raw)


def bucket(n: int, steps: int = 4) -> int:
    """The padded size for a true size `n`."""
    if n <= 1:
        return n
    up = 1 << (n - 1).bit_length()  # the next power of two
    if n <= SMALL or steps <= 1:
        return up
    step = (up // 2) // steps
    return -(-n // step) * step

"""Loops in a pending graph: a decode or training loop with no sync in it records the same
ops again and again; the graph is cut where that step repeats, so that the step compiles
once and runs once per iteration instead of compiling the whole loop unrolled."""

from __future__ import annotations

from collections import Counter

import numpy as np

from .. import _env

MIN_OPS = 64  # graphs shorter than this are not searched (their compile is short)
MIN_STEP = 8  # ops of the shortest step cut out
MIN_COVER = 0.5  # the repeating stretch covers at least this share of the graph
_CANDIDATES = 12  # periods tried: the most common distances between an op's recurrences

enabled = True  # TORCH_PJRT_FUSED_LOOPS, set by configure()


def configure() -> None:
    global enabled
    enabled = _env.flag("TORCH_PJRT_FUSED_LOOPS")


def cuts(wiring: tuple, outputs: list) -> list[int]:
    """Where to cut a graph (`wiring`: (entry, refs, run-time values) per node, as
    graph._run_graph builds it) into a prefix, steps of the same ops and a rest: the node
    positions that start a piece, or [] where no step repeats over most of the graph.

    The step is the period that covers the most nodes (the same op signature `p` nodes
    later, over a stretch of at least two periods; the shortest such period); its phase
    is where the fewest values cross the cut (a step's boundary, not a cut through the
    middle of its work: in a decode loop, the cache and the token)."""
    n = len(wiring)
    if not enabled or n < MIN_OPS:
        return []
    ids: dict[int, int] = {}
    seq = np.fromiter((ids.setdefault(id(w[0]), len(ids)) for w in wiring), np.int64, n)
    best = _period(seq)
    if best is None:
        return []
    cover, p, start, length = best
    if cover < MIN_COVER * n:
        return []
    cross = _crossings(wiring, outputs)
    # The cut one period into the stretch has a full period on each side for every phase.
    phase = min(range(p), key=lambda r: (cross[start + r + p], r))
    first = start + phase
    steps = (start + length - first) // p
    if steps < 2:
        return []
    bounds = [first + j * p for j in range(steps + 1)]
    return [c for c in bounds if 0 < c < n]


def _period(seq: np.ndarray) -> tuple[int, int, int, int] | None:
    """(nodes covered by whole periods, period, start, length) of the longest periodic
    stretch of `seq` with at least two periods, over the likeliest periods; or None."""
    n = len(seq)
    last: dict[int, int] = {}
    gaps: Counter = Counter()
    for i, s in enumerate(seq.tolist()):
        j = last.get(s)
        if j is not None and i - j >= MIN_STEP:
            gaps[i - j] += 1
        last[s] = i
    best = None
    for p, _ in gaps.most_common(_CANDIDATES):
        if 2 * p > n:
            continue
        same = np.concatenate(([False], seq[p:] == seq[:-p], [False]))
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        if not edges.size:
            continue
        runs = edges[1::2] - edges[0::2]  # lengths of the runs of equal pairs
        k = int(np.argmax(runs))
        length = int(runs[k]) + p  # seq[i] == seq[i + p] over the run: periodic over this
        cover = length // p * p
        if length // p >= 2 and (best is None or (cover, -p) > (best[0], -best[1])):
            best = (cover, p, int(edges[2 * k]), length)
    return best


def _crossings(wiring: tuple, outputs: list) -> np.ndarray:
    """For each cut position c (0..n), how many node results made before c are read at or
    after c (by a node, or as an output of the graph)."""
    n = len(wiring)
    last: dict[tuple, int] = {}
    for i, (_, refs, _) in enumerate(wiring):
        for r in refs:
            if type(r) is tuple:
                last[r] = i
    for r in outputs:
        last[r] = n
    diff = np.zeros(n + 2, np.int64)
    for (producer, _), reader in last.items():
        diff[producer + 1] += 1
        diff[reader + 1] -= 1
    return np.cumsum(diff)[:n + 1]

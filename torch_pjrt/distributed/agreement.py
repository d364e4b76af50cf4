"""Before each collective, its ranks agree through the store on what they are calling.

An XLA collective that one rank never joins waits forever, and one whose ranks pass
different shapes aborts the process (gloo) or moves the wrong bytes. So each rank first
sends a description of its call (the collective, its sequence number, shapes, dtypes,
parameters) to the participants' first rank through the process group's store, which
compares them and answers; a rank that does not arrive within the group's timeout, or
a description that differs, raises torch.distributed.DistBackendError on every rank
that did arrive, naming the collective and the ranks. TORCH_PJRT_DIST_CHECK=0 skips it.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

_OK = "ok"


class GroupBroken(dist.DistBackendError):
    pass


class Agreement:
    """The checks of one process group (`ranks`: the global rank of each group rank)."""

    def __init__(self, store, rank: int, ranks: list[int], timeout: timedelta, name: str):
        self.store = store.clone()  # its own connection and timeout
        self.store.set_timeout(timeout)
        self.rank = rank
        self.ranks = ranks
        self.timeout = timeout
        self.name = name
        self.seq: dict[tuple[int, ...], int] = {}
        self.broken: str | None = None

    def check(self, desc: str, parts: tuple[int, ...] | None = None) -> None:
        """Agree on `desc` with the group ranks `parts` (default: all; they must include
        this rank), or raise."""
        if self.broken is not None:
            raise GroupBroken(f"pjrt: process group {self.name!r} is unusable after an "
                              f"earlier error: {self.broken}")
        parts = parts or tuple(range(len(self.ranks)))
        seq = self.seq.get(parts, 0)
        self.seq[parts] = seq + 1
        scope = "-".join(map(str, parts)) if len(parts) < len(self.ranks) else "all"
        call = f"{desc} (call #{seq} on {self._who(parts)})"
        try:
            if self.rank == parts[0]:
                self._lead(scope, parts, seq, desc, call)
            else:
                self._follow(scope, parts, seq, desc, call)
        except dist.DistBackendError as e:
            self.broken = str(e)
            raise

    def _lead(self, scope: str, parts, seq: int, desc: str, call: str) -> None:
        got = {self.rank: desc}
        try:
            for _ in parts[1:]:
                r, s, d = _parse(self.store.queue_pop(f"{scope}/in", True))
                got[r] = d if s == seq else f"{d} (its call #{s})"
        except dist.DistStoreError:
            missing = [self.ranks[p] for p in parts if p not in got]
            error = (f"pjrt: {call} timed out after {self._seconds()}: rank(s) "
                     f"{_list(missing)} did not call it (they died, hang, or called "
                     f"another collective first)")
            self._answer(scope, [p for p in got if p != self.rank], error)
            raise dist.DistBackendError(error) from None
        differ = {r: d for r, d in got.items() if d != desc}
        verdict = _OK
        if differ:
            lines = "; ".join(f"rank {self.ranks[r]}: {d}" for r, d in sorted(got.items()))
            verdict = f"pjrt: collective mismatch at call #{seq} on {self._who(parts)}: {lines}"
        self._answer(scope, parts[1:], verdict)
        if verdict != _OK:
            raise dist.DistBackendError(verdict)

    def _follow(self, scope: str, parts, seq: int, desc: str, call: str) -> None:
        self.store.queue_push(f"{scope}/in", f"{self.rank}|{seq}|{desc}")
        try:
            verdict = self.store.queue_pop(f"{scope}/out{self.rank}", True).decode()
        except dist.DistStoreError:
            raise dist.DistBackendError(
                f"pjrt: {call} timed out after {self._seconds()} waiting for rank "
                f"{self.ranks[parts[0]]} (it died, hangs, or called another collective "
                f"first)") from None
        if verdict != _OK:
            raise dist.DistBackendError(verdict)

    def _answer(self, scope: str, parts, verdict: str) -> None:
        for p in parts:
            self.store.queue_push(f"{scope}/out{p}", verdict)

    def _who(self, parts) -> str:
        ranks = [self.ranks[p] for p in parts]
        return f"process group {self.name!r} (ranks {_list(ranks)})"

    def _seconds(self) -> str:
        return f"{self.timeout.total_seconds():g} s"


def _parse(raw: bytes) -> tuple[int, int, str]:
    r, s, d = raw.decode().split("|", 2)
    return int(r), int(s), d


def _list(ranks) -> str:
    return ", ".join(map(str, ranks))

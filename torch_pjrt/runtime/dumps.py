"""TORCH_PJRT_DUMP_DIR: each compiled program's StableHLO, optimized HLO and a map back
to the ATen ops or FX nodes it holds and the lines of user code they came from.

Files are named after the program as profiles and the metrics report name it (its
kind and the first 12 hex digits of its cache digest): `graph-3fa2c1d9e0b4.stablehlo.mlir`,
`graph-3fa2c1d9e0b4.hlo.txt` (after XLA's optimizations), `graph-3fa2c1d9e0b4.map.json`.
A program loaded from the disk cache is lowered again for its StableHLO (only while
dumping). In the HLO, each op's metadata names the graph position and ATen op it belongs
to (`op_name="3:aten.mm.default/..."`).
"""

from __future__ import annotations

import json
import os

from .. import _env
from . import sites, watch


def directory() -> str:
    return _env.get("TORCH_PJRT_DUMP_DIR").strip()


def configure() -> None:
    """Read TORCH_PJRT_DUMP_DIR (while set, each recorded op's line is noted)."""
    watch.set_dumping(bool(directory()))


def write(program: watch.Program, compiled, lowered) -> None:
    """The three files of `program` (its map rewritten each time it compiles)."""
    root = directory()
    if not root:
        return
    os.makedirs(root, exist_ok=True)
    stem = os.path.join(root, program.name)
    _write_text(stem + ".stablehlo.mlir", lambda: lowered.as_text())
    _write_text(stem + ".hlo.txt", lambda: compiled.as_text())
    _write_text(stem + ".map.json", lambda: json.dumps(program_map(program), indent=1))


def program_map(program: watch.Program) -> dict:
    """What the map file holds: the program and, in order, each op it computes."""
    return {
        "name": program.name,
        "kind": program.kind,
        "title": program.title,
        "digest": program.digest,
        "ops": [{"index": i, "op": op, "detail": detail,
                 "site": None if site is None else sites.text(site, full=True)}
                for i, (op, detail, site) in enumerate(program.ops)],
    }


def _write_text(path: str, make) -> None:
    try:
        text = make()
    except Exception as e:  # noqa: BLE001 - a dump must never break a run
        text = f"(not available: {type(e).__name__}: {e})\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

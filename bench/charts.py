"""Bar charts of the benchmarks' ratio tables, drawn by matplotlib (the `plot` extra) into
docs/benchmarks-<name>.png, which docs/benchmarks.md embeds in the section <name>.

The benchmarks draw theirs when they write their report (common.write_report); `python
bench/charts.py` redraws them all from bench/results/*.json without running anything."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ops(data: dict) -> tuple[str, str, dict, bool]:
    groups = {op: {"strict / CPU": r["strict"] / r["cpu"], "fused (record) / CPU":
                   r["fused"] / r["cpu"], "debug / CPU": r["debug"] / r["cpu"]}
              for op, r in data["us_per_op"].items()}
    return ("Per-op cost on pjrt, relative to CPU PyTorch eager (lower is better)",
            "time per op / CPU eager's (log scale)", groups, True)


def _train(data: dict) -> tuple[str, str, dict, bool]:
    groups = {}
    for key, r in data["configs"].items():
        c = r["config"]
        group = f"{key}: {c['layers']} layers, d={c['d_model']}, batch {c['batch']}"
        groups[group] = {name: x["ratio_to_cpu_eager"] for name, x in r["results"].items()
                         if x["ratio_to_cpu_eager"] and name != "cpu eager"}
    return ("GPT training step, relative to CPU PyTorch eager (lower is better)",
            "median step time / CPU eager's", groups, False)


CHARTS: dict[str, Callable[[dict], tuple[str, str, dict, bool]]] = {"ops": _ops,
                                                                    "train": _train}


def png_name(name: str) -> str:
    return f"benchmarks-{name}.png"


def draw(name: str, data: dict) -> str | None:
    """Draw the chart of the report `name` from its data; the markdown line that embeds it
    (None where the report has no chart)."""
    if name not in CHARTS:
        return None
    from matplotlib.figure import Figure  # no pyplot: no global state, no display

    title, ylabel, groups, log = CHARTS[name](data)
    series = list(dict.fromkeys(s for bars in groups.values() for s in bars))
    width = 0.8 / len(series)
    fig = Figure(figsize=(max(7.0, 0.35 * len(groups) * len(series) + 4), 4.5), dpi=100,
                 layout="constrained")
    ax = fig.add_subplot()
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [bars.get(s, 0.0) for bars in groups.values()], width, label=s)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="CPU eager = 1")
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(groups)), list(groups), rotation=20 if len(groups) > 3 else 0,
                  ha="right" if len(groups) > 3 else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(os.path.join(ROOT, "docs", png_name(name)))
    return f"![{title}]({png_name(name)})"


def main() -> None:
    from common import read_sections, write_sections

    sections = read_sections()
    for name in CHARTS:
        with open(os.path.join(ROOT, "bench", "results", f"{name}.json")) as f:
            line = draw(name, json.load(f))
        kept = [x for x in sections.get(name, []) if png_name(name) not in x]
        while kept and not kept[-1].strip():
            kept.pop()
        sections[name] = kept + ["", line]
    write_sections(sections)


if __name__ == "__main__":
    main()

"""The demo's loss curves as a PNG, drawn by matplotlib (the optional `plot` extra)."""

from __future__ import annotations

import importlib.util

INSTALL = 'pip install "torch-pjrt[plot]" (or pip install matplotlib)'


def require() -> None:
    """Exit saying how to install matplotlib where it is missing (before training)."""
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("torch_pjrt demo: --plot draws with matplotlib, which is not "
                         f"installed: {INSTALL}")


def loss_plot(path: str, series: dict[str, list[float]], title: str) -> None:
    """Write the curves (name -> loss of each step) to `path`, one named line each."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no display

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for name, losses in series.items():
        ax.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1.2)
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss (cross-entropy per byte)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path)

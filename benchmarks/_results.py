"""What every benchmark script does with its results: save JSON/CSV/markdown, describe the machine,
style log-log plots."""

from __future__ import annotations

import csv
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch


def environment(**extra: Any) -> dict[str, Any]:
    """The command and machine a result was measured with, plus ``extra``."""
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        **extra,
    }


def save_tables(out: Path, stem: str, meta: dict[str, Any], rows: list[dict[str, Any]], text: str) -> None:
    """Write ``stem.json`` (meta and rows), ``stem.csv`` (rows) and ``stem.md`` (``text``) to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    with open(out / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.md").write_text(text + "\n")


def style_log_axes(ax: Any, xlabel: str, title: str) -> None:
    """Log2 x axis, log y axis, grid and legend."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def save_figure(fig: Any, path: Path) -> bool:
    """Lay out, save (120 dpi) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def report_saved(out: Path, stem: str, plotted: bool) -> None:
    print(f"\nsaved {out / stem}.{{json,csv,md}}" + (" and .png" if plotted else " (install matplotlib for the plot)"))

"""What every benchmark script does with its results: save JSON/CSV/markdown, describe the machine,
style log-log plots."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import torch

from pyro_whvi.experiments.reporting import save_tables

__all__ = ["environment", "report_saved", "save_figure", "save_tables", "style_log_axes"]


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

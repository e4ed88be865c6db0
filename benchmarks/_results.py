"""What every benchmark script does with its results: save JSON/CSV/markdown, describe the machine,
style log-log plots, read ``whvi uci``'s per-split rows back and give their mean, and print tables of them."""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pyro_whvi.experiments.reporting import save_tables
from pyro_whvi.metrics import mean_and_standard_error

__all__ = [
    "by_split",
    "environment",
    "learned_noise_gap",
    "markdown",
    "mean_se",
    "paired_differences",
    "report_saved",
    "save_figure",
    "save_tables",
    "split_folders",
    "style_log_axes",
]


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


def by_split(folders: Path | tuple[Path, ...], name: str) -> dict[int, dict]:
    """``{split: row}`` of the per-split rows ``whvi uci`` keeps in the summary of ``name`` in a folder (empty where it
    has not written one yet), or in several, a split from the first that has it."""
    found: dict[int, dict] = {}
    for each in (folders,) if isinstance(folders, Path) else folders:
        table = each / f"uci_{name}.json"
        rows = json.loads(table.read_text())["meta"]["splits"] if table.exists() else []
        found |= {row["split"]: row for row in rows if row["split"] not in found}
    return found


def split_folders(folder: Path) -> tuple[Path, ...]:
    """The folders ``split<N>`` in ``folder`` (one ``whvi uci`` run per split), by ``N``: for :func:`by_split`."""
    return tuple(sorted(folder.glob("split*"), key=lambda each: int(each.name[len("split") :])))


def mean_se(values: list[float]) -> str:
    """``mean ± standard error`` to three decimals (the mean alone for one value)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    mean, standard_error = mean_and_standard_error(values)
    return f"{mean:.3f} ± {standard_error:.3f}"


def learned_noise_gap(row: dict) -> float:
    """A calibrated row's test MNLL with its learned noise alone (``learned_noise_mnll``, the same draws) minus the
    set's floor: its ``mnll_gap`` less the change the calibration made."""
    return row["mnll_gap"] - (row["mnll"] - row["learned_noise_mnll"])


def paired_differences(mine: Sequence[float], theirs: Sequence[float]) -> tuple[list[float], int]:
    """Per split, ``mine − theirs`` (the same splits in the same order), and on how many of them ``mine`` is lower."""
    differences = [a - b for a, b in zip(mine, theirs, strict=True)]
    return differences, sum(d < 0 for d in differences)


def markdown(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table of ``rows`` (each cell as ``str`` gives it) under ``header``."""
    lines = ["| " + " | ".join(map(str, line)) + " |" for line in (header, *rows)]
    return "\n".join([lines[0], "|---" * len(header) + "|", *lines[1:]])

"""Reporting results: the one table format every benchmark and command writes (atomically), and shared plots
(matplotlib is imported by the callers)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from torch import Tensor

from ..metrics import mean_and_standard_error
from ..train.files import check_writable, write_atomic

__all__ = ["check_writable", "draw_reliability", "save_tables", "summarize_by", "write_atomic"]


def save_tables(out: Path, stem: str, meta: dict[str, Any], rows: list[dict[str, Any]], text: str) -> None:
    """Write ``stem.json`` (meta and rows), ``stem.csv`` (rows) and ``stem.md`` (``text``) to ``out``,
    each atomically (:func:`write_atomic`)."""
    write_atomic(out / f"{stem}.json", json.dumps({"meta": meta, "results": rows}, indent=2))
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(out / f"{stem}.csv", table.getvalue())
    write_atomic(out / f"{stem}.md", text + "\n")


def summarize_by(rows: list[dict[str, Any]], keys: tuple[str, ...], metrics: tuple[str, ...]) -> list[dict[str, Any]]:
    """Mean and standard error of ``metrics`` over the rows sharing the values of ``keys`` (first-seen order),
    with the number of rows as ``runs``."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    summary = []
    for group_key, mine in groups.items():
        entry: dict[str, Any] = dict(zip(keys, group_key)) | {"runs": len(mine)}
        for metric in metrics:
            entry[metric], entry[metric + "_se"] = mean_and_standard_error(r[metric] for r in mine)
        summary.append(entry)
    return summary


def draw_reliability(ax: Any, confidence: Tensor, accuracy: Tensor, count: Tensor, title: str) -> None:
    """A reliability diagram on ``ax``: one bar per non-empty confidence bin, and the diagonal."""
    keep = count > 0
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    ax.bar(confidence[keep], accuracy[keep], width=1 / len(count), alpha=0.6, edgecolor="C0")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
    ax.set_title(title, fontsize=9)

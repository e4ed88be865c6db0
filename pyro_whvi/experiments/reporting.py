"""Reporting results: the one table format every benchmark and command writes (atomically), and shared plots
(matplotlib is imported by the callers)."""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from torch import Tensor

from ..metrics import mean_and_standard_error

__all__ = ["check_writable", "draw_reliability", "save_tables", "summarize_by", "write_atomic"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and :func:`os.replace`, so
    that a reader, or an interrupted run, sees the old file or the new one, never a part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as handle:  # "x": a fresh file with the usual permissions (umask)
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())  # the data on disk before the rename: no empty file after a crash
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def check_writable(out: Path) -> None:
    """Create the folder ``out`` if needed and check that files can be written in it.

    :raises OSError: naming ``out`` and the reason.
    """
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError("it exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        raise OSError(f"cannot write results to {out}: {error.strerror or error}") from None


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

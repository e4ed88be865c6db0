"""Writing a results table: the one format every benchmark and the command line use."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

__all__ = ["save_tables"]


def save_tables(out: Path, stem: str, meta: dict[str, Any], rows: list[dict[str, Any]], text: str) -> None:
    """Write ``stem.json`` (meta and rows), ``stem.csv`` (rows) and ``stem.md`` (``text``) to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    with open(out / f"{stem}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{stem}.md").write_text(text + "\n")

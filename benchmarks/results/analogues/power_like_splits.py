"""The power-like analogue over its splits: WHVI's default (``../large_calibration/spread_share/power_like_s<k>``:
the default's row is the calibrated one there, the spread share being 0.1 or more on each split, and
``learned_noise_mnll`` the same fit with its learned noise) against MC dropout's and the deep ensemble's defaults
(``power_like/default_peers``, one folder per run). MNLL minus the floor per split, then each method's mean and
WHVI's paired difference from it, on the splits every method has. Markdown.

Run from the repository root: ``python benchmarks/results/analogues/power_like_splits.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the summaries' reader
from _results import by_split, learned_noise_gap, markdown, mean_se, paired_differences

RESULTS = Path("benchmarks/results")
NAME = "hartmann4"


def rows() -> dict[str, dict[int, dict]]:
    """``{method: {split: row}}``: WHVI's default with the learned noise and calibrated, MC dropout, the ensemble."""
    whvi = by_split(tuple(sorted((RESULTS / "large_calibration" / "spread_share").glob("power_like_s*"))), NAME)
    learned = {  # the split's time without the held-out fit
        split: {**row, "mnll_gap": learned_noise_gap(row),
                "train_seconds": row["train_seconds"] - row["calibration_seconds"]}
        for split, row in whvi.items()
    }  # fmt: skip
    peers = RESULTS / "analogues" / "power_like" / "default_peers"
    return {
        "WHVI, the default (calibrated)": whvi,
        "WHVI, its learned noise (the same fit)": learned,
        "MC dropout, the default": by_split(tuple(sorted(peers.glob("mcd*"))), NAME),
        "deep ensemble, the default": by_split(tuple(sorted(peers.glob("ensemble*"))), NAME),
    }


def main() -> None:
    methods = rows()
    shared = sorted(set.intersection(*(set(table) for table in methods.values())))
    if not shared:
        raise SystemExit("power_like_splits: no split that every method has run yet")
    header = ["method", *(f"split {s}" for s in shared), "mean", "RMSE / σ", "s/split", "WHVI's default − it"]
    whvi = [methods["WHVI, the default (calibrated)"][s]["mnll_gap"] for s in shared]
    table = []
    for label, found in methods.items():
        gaps = [found[s]["mnll_gap"] for s in shared]
        seconds = [found[s]["train_seconds"] for s in shared]
        ratios = [found[s]["rmse_ratio"] for s in shared]
        cells = [label, *(f"{gap:.4f}" for gap in gaps), mean_se(gaps), mean_se(ratios)]
        cells.append(f"{min(seconds):.0f}-{max(seconds):.0f}")
        if label.startswith("WHVI, the default"):
            cells.append("")
        else:
            differences, lower = paired_differences(whvi, gaps)
            cells.append(f"{mean_se(differences)} (lower on {lower} of {len(shared)})")
        table.append(cells)
    print(markdown(header, table))


if __name__ == "__main__":
    main()

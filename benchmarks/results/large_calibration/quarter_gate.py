"""Could a held-out fit of a quarter of the steps tell which splits the full one helps? For each split in
``quarter_steps/`` (``whvi uci --likelihood gaussian --calibrate-noise on --steps 12625``: its held-out fit trains a
quarter of the default's 50,500 steps on the same held-out part) beside the same split in ``spread_share/`` (the
default's held-out fit, every split calibrated): each fit's noise factor, its gain on the held-out rows (MNLL with the
learned noise − calibrated) and seconds, and the test MNLL the full calibration removed. A markdown table sorted by the
spread share.

Run from the repository root: ``python benchmarks/results/large_calibration/quarter_gate.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the summaries' reader
from _results import by_split, markdown

HERE = Path("benchmarks/results/large_calibration")
HEADER = ["set", "split", "spread share", "test change (full fit's c)", "c: full fit", "quarter", "held-out gain: full",
          "quarter", "s: full fit", "quarter"]  # fmt: skip


def main() -> None:
    table = []
    for folder in sorted((HERE / "quarter_steps").iterdir()):
        name, split = folder.name.rsplit("_s", 1)
        summary = next(folder.glob("uci_*.json")).stem[len("uci_") :]
        quarter = by_split(folder, summary)[int(split)]
        full = by_split(HERE / "spread_share" / folder.name, summary)[int(split)]
        cells = [name, split, f"{full['spread_share']:.3f}", f"{full['mnll'] - full['learned_noise_mnll']:+.4f}"]
        cells += [f"{row['noise_factor']:.3f}" for row in (full, quarter)]
        cells += [f"{row['calibration_mnll'][0] - row['calibration_mnll'][1]:.4f}" for row in (full, quarter)]
        cells += [f"{row['calibration_seconds']:.0f}" for row in (full, quarter)]
        table.append((full["spread_share"], cells))
    print(markdown(HEADER, [cells for _, cells in sorted(table, key=lambda each: each[0])]))


if __name__ == "__main__":
    main()

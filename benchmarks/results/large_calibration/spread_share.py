"""One noise scale calibrated on held-out rows against its spread share (``whvi uci``'s ``spread_share``: q's
variance of f on the training rows over the learned noise variance), on the splits in ``spread_share/``, each the
default command with every split that keeps one noise scale calibrated (the threshold set below every share), so
that one row holds the share, the test MNLL with the learned noise (``learned_noise_mnll``, the same draws) and the
calibrated one. A markdown table sorted by the share, and ``spread_share.png``: the change in test MNLL against the
share, with the change predicted where the test rows' mean square error is the training residuals'.

Run from the repository root: ``python benchmarks/results/large_calibration/spread_share.py``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the tables' printer
from _results import learned_noise_gap, markdown, save_figure

from pyro_whvi.experiments.auto_calibration import SPREAD_SHARE_THRESHOLD

HERE = Path("benchmarks/results/large_calibration")
RUNS = HERE / "spread_share"
HEADER = ["set", "split", "training rows", "spread share", "learned noise: MNLL − floor", "calibrated", "change",
          "predicted", "factor c", "s (held-out fit / split)"]  # fmt: skip


def predicted_change(share: float) -> float:
    r"""The test MNLL that calibrating removes at spread share :math:`s` if the test rows' mean square error is the
    training residuals' :math:`(1 - s)\sigma^2`: the learned predictive's variance :math:`(1 + s)\sigma^2` is then
    :math:`k = (1 + s) / (1 - s)` times the best, which loses :math:`\tfrac12(\log k + 1/k - 1)` a row."""
    k = (1 + share) / (1 - share)
    return -0.5 * (math.log(k) + 1 / k - 1)


def rows() -> list[dict]:
    """Each run's row (one split), with its set's label, training rows and the change the calibration made."""
    found = []
    for path in sorted(RUNS.glob("*/uci_*.json")):
        meta = json.loads(path.read_text())["meta"]
        for row in meta["splits"]:
            if "spread_share" not in row or "learned_noise_mnll" not in row:
                raise SystemExit(f"{path}: a row with its spread share and learned-noise MNLL expected")
            rows_note = meta["config"]["protocol"].split("(")[1].split(" training rows")[0]
            change = row["mnll"] - row["learned_noise_mnll"]  # the same draws
            found.append(
                {**row, "set": path.parent.name.rsplit("_s", 1)[0], "training_rows": rows_note, "change": change}
            )
    return sorted(found, key=lambda row: row["spread_share"])


def main() -> None:
    found = rows()
    table = []
    for row in found:
        change = row["change"]
        learned = learned_noise_gap(row)
        seconds = f"{row['calibration_seconds']:.0f} / {row['train_seconds']:.0f}"
        share = row["spread_share"]
        gaps = [f"{learned:.4f}", f"{row['mnll_gap']:.4f}", f"{change:+.4f}", f"{predicted_change(share):+.4f}"]
        table.append([row["set"], row["split"], row["training_rows"], f"{share:.3f}", *gaps,
                      f"{row['noise_factor']:.3f}", seconds])  # fmt: skip
    print(markdown(HEADER, table))
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    shares = [row["spread_share"] for row in found]
    changes = [row["change"] for row in found]
    ax.scatter(shares, changes, label="measured (one split)")
    grid = [i / 100 * max(shares) * 1.1 for i in range(101)]
    ax.plot(grid, [predicted_change(s) for s in grid], label="predicted: test MSE = training residuals'")
    ax.axvline(SPREAD_SHARE_THRESHOLD, color="grey", linestyle=":", label="SPREAD_SHARE_THRESHOLD")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xlabel("spread share: Var_q f / σ² on the training rows")
    ax.set_ylabel("test MNLL, calibrated − learned noise")
    ax.set_title("One noise scale calibrated on held-out rows")
    ax.legend(fontsize=8)
    save_figure(fig, HERE / "spread_share.png")


if __name__ == "__main__":
    main()

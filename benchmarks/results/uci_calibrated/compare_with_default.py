"""Each split's row here against the learned noise's (``uci_table3/whvi``, the same network and draws with
``--calibrate-noise off``, the default until 2026-12-05) and the probe's prediction of it
(``noise_recalibration/mixture.json``): a markdown table and the means.

Run from the repository root: ``python benchmarks/results/uci_calibrated/compare_with_default.py``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path("benchmarks/results")
# set: (folder here, the probe's name for it)
SETS = {"yacht": ("whvi", "yacht"), "energy": ("whvi_energy", "energy"), "bostonHousing": ("whvi_boston", "boston")}
SETS["concrete"] = ("whvi_concrete", "concrete")
HEADER = ["set", "split", "learned noise MNLL", "**calibrated**", "change", "probe's", "factor c", "RMSE (calibrated / "
          "learned noise)", "s (held-out fit)"]  # fmt: skip


def splits(table: Path) -> list[dict]:
    """The per-split rows ``whvi uci`` keeps in a summary's meta (none where the run has not written it yet)."""
    return json.loads(table.read_text())["meta"]["splits"] if table.exists() else []


probe = json.loads((RESULTS / "noise_recalibration" / "mixture.json").read_text())
print("| " + " | ".join(HEADER) + " |\n" + "|---" * len(HEADER) + "|")
means = []
for name, (folder, key) in SETS.items():
    default = {row["split"]: row for row in splits(RESULTS / "uci_table3" / "whvi" / f"uci_{name}.json")}
    pairs = []
    for row in splits(RESULTS / "uci_calibrated" / folder / f"uci_{name}.json"):
        split, before = row["split"], default[row["split"]]
        entry = probe.get(f"{key}_s{split}_keep", probe.get(f"{key}_s{split}", {}))
        predicted = f"{entry['mixture']['mnll']:.3f}" if entry else "–"
        pairs.append((before["mnll"], row["mnll"]))
        cells = [name, split, f"{before['mnll']:.3f}", f"**{row['mnll']:.3f}**", f"{row['mnll'] - before['mnll']:+.3f}"]
        cells += [predicted, f"{row['noise_factor']:.3f}", f"{row['rmse']:.3f} / {before['rmse']:.3f}"]
        cells += [f"{row['train_seconds']:.0f} ({row['calibration_seconds']:.0f})"]
        print("| " + " | ".join(map(str, cells)) + " |")
    if pairs:
        before_mean, after_mean = (statistics.mean(pair[k] for pair in pairs) for k in (0, 1))
        means.append(f"{name} ({len(pairs)} splits): {before_mean:.3f} -> {after_mean:.3f}")
print("\nMeans, learned noise -> calibrated: " + "; ".join(means))

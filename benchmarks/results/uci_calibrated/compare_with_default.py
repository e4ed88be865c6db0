"""Each split's row here against the learned noise's (``uci_table3/whvi``, the same network and draws with
``--calibrate-noise off``, the default until 2026-12-05) and the probe's prediction of it
(``noise_recalibration/mixture.json``): a markdown table and the means. Then energy's variants with the calibration
(``energy_variants``, a variant's splits joined from its folders): each split against the default and MC dropout, and
each variant's mean with its paired difference from the default and from the tuned MC dropout.

Run from the repository root: ``python benchmarks/results/uci_calibrated/compare_with_default.py``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from pyro_whvi.metrics import mean_and_standard_error

RESULTS = Path("benchmarks/results")
# set: (folder here, the probe's name for it)
SETS = {"yacht": ("whvi", "yacht"), "energy": ("whvi_energy", "energy"), "bostonHousing": ("whvi_boston", "boston")}
SETS["concrete"] = ("whvi_concrete", "concrete")
# variant: its folders under energy_variants, a split from the first that has it
VARIANTS = {"NF-WHVI": ("nf-whvi", "nf-whvi_splits1-4"), "NF-WHVI, Adam 3e-3": ("nf-whvi_narrow",)}
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


def by_split(*tables: Path) -> dict[int, dict]:
    """``{split: row}`` of the summaries ``tables``, a split from the first that has it."""
    found: dict[int, dict] = {}
    for table in tables:
        found |= {row["split"]: row for row in splits(table) if row["split"] not in found}
    return found


def mean_se(values: list[float]) -> str:
    mean, standard_error = mean_and_standard_error(values)
    return f"{mean:.3f} ± {standard_error:.3f}"


def energy_variants() -> None:
    table = "uci_energy.json"
    default = by_split(RESULTS / "uci_calibrated" / "whvi_energy" / table)
    mcd, tuned = (by_split(RESULTS / folder / table) for folder in ("uci_table3/mcd", "mcd_tuned/choice_energy"))
    header = ["split", "variant", "learned noise", "**calibrated**", "factor c", "the default", "MC dropout",
              "s (held-out fit)"]  # fmt: skip
    print("\n| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    means = []
    for label, folders in VARIANTS.items():
        rows = by_split(*(RESULTS / "uci_calibrated" / "energy_variants" / each / table for each in folders))
        for split, row in sorted(rows.items()):
            learned = f"{row['learned_noise_mnll']:.3f}" if "learned_noise_mnll" in row else "–"
            cells = [split, label, learned, f"**{row['mnll']:.3f}**", f"{row['noise_factor']:.3f}"]
            cells += [f"{default[split]['mnll']:.3f}", f"{mcd[split]['mnll']:.3f}"]
            cells += [f"{row['train_seconds']:.0f} ({row['calibration_seconds']:.0f})"]
            print("| " + " | ".join(map(str, cells)) + " |")
        mnll = {split: row["mnll"] for split, row in rows.items()}
        against = {"the default": default, "the tuned MC dropout (`mcd_tuned/choice_energy`)": tuned}
        paired = [
            f"{mean_se([mnll[s] - other[s]['mnll'] for s in mnll])} against {name} (lower on "
            f"{sum(mnll[s] < other[s]['mnll'] for s in mnll)} of {len(mnll)})"
            for name, other in against.items()
        ]
        rmse = mean_se([row["rmse"] for row in rows.values()])
        means.append(f"{label} ({len(mnll)} splits): {mean_se(list(mnll.values()))}, RMSE {rmse}; " + ", ".join(paired))
    print("\n" + "\n".join(means))


energy_variants()

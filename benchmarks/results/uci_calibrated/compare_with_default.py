"""Each split's row here against the learned noise's (``uci_table3/whvi``, the same network and draws with
``--calibrate-noise off``, the default until 2026-12-05) and the probe's prediction of it
(``noise_recalibration/mixture.json``): a markdown table and the means. Then energy's variants with the calibration
(``energy_variants``, a variant's splits joined from its folders): each split against the default and MC dropout, and
each variant's mean with its paired difference from the default and from the tuned MC dropout. Then concrete at
Adam 3e-3 with the calibration (``concrete_narrow``, one folder per split) against the default and MC dropout's
default, its rate chosen and its noise calibrated (``mcd_tuned/calibrated/concrete``).

Run from the repository root: ``python benchmarks/results/uci_calibrated/compare_with_default.py``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the summaries' reader
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mcd_tuned"))  # the default's and MC dropout's rows
from _results import by_split, markdown, mean_se, paired_differences, split_folders
from compare import whvi_default
from compare_mcd_calibrated import rows as mcd_calibrated

RESULTS = Path("benchmarks/results")
# set: (folder here, the probe's name for it)
SETS = {"yacht": ("whvi", "yacht"), "energy": ("whvi_energy", "energy"), "bostonHousing": ("whvi_boston", "boston")}
SETS["concrete"] = ("whvi_concrete", "concrete")
# variant: its folders under energy_variants, a split from the first that has it
VARIANTS = {"NF-WHVI": ("nf-whvi", "nf-whvi_splits1-4"), "NF-WHVI, Adam 3e-3": ("nf-whvi_narrow",)}
HEADER = ["set", "split", "learned noise MNLL", "**calibrated**", "change", "probe's", "factor c", "RMSE (calibrated / "
          "learned noise)", "s (held-out fit)"]  # fmt: skip


probe = json.loads((RESULTS / "noise_recalibration" / "mixture.json").read_text())
table, means = [], []
for name, (folder, key) in SETS.items():
    default = by_split(RESULTS / "uci_table3" / "whvi", name)
    pairs = []
    for row in by_split(RESULTS / "uci_calibrated" / folder, name).values():
        split, before = row["split"], default[row["split"]]
        entry = probe.get(f"{key}_s{split}_keep", probe.get(f"{key}_s{split}", {}))
        predicted = f"{entry['mixture']['mnll']:.3f}" if entry else "–"
        pairs.append((before["mnll"], row["mnll"]))
        cells = [name, split, f"{before['mnll']:.3f}", f"**{row['mnll']:.3f}**", f"{row['mnll'] - before['mnll']:+.3f}"]
        cells += [predicted, f"{row['noise_factor']:.3f}", f"{row['rmse']:.3f} / {before['rmse']:.3f}"]
        cells += [f"{row['train_seconds']:.0f} ({row['calibration_seconds']:.0f})"]
        table.append(cells)
    if pairs:
        before_mean, after_mean = (statistics.mean(pair[k] for pair in pairs) for k in (0, 1))
        means.append(f"{name} ({len(pairs)} splits): {before_mean:.3f} -> {after_mean:.3f}")
print(markdown(HEADER, table))
print("\nMeans, learned noise -> calibrated: " + "; ".join(means))


def energy_variants() -> None:
    """Energy's variants (:data:`VARIANTS`) per split and their means, markdown."""
    default = by_split(RESULTS / "uci_calibrated" / "whvi_energy", "energy")
    mcd, tuned = (by_split(RESULTS / folder, "energy") for folder in ("uci_table3/mcd", "mcd_tuned/choice_energy"))
    header = ["split", "variant", "learned noise", "**calibrated**", "factor c", "the default", "MC dropout",
              "s (held-out fit)"]  # fmt: skip
    table, means = [], []
    for label, folders in VARIANTS.items():
        rows = by_split(tuple(RESULTS / "uci_calibrated" / "energy_variants" / each for each in folders), "energy")
        for split, row in sorted(rows.items()):
            learned = f"{row['learned_noise_mnll']:.3f}" if "learned_noise_mnll" in row else "–"
            cells = [split, label, learned, f"**{row['mnll']:.3f}**", f"{row['noise_factor']:.3f}"]
            cells += [f"{default[split]['mnll']:.3f}", f"{mcd[split]['mnll']:.3f}"]
            cells += [f"{row['train_seconds']:.0f} ({row['calibration_seconds']:.0f})"]
            table.append(cells)
        mnll = {split: row["mnll"] for split, row in rows.items()}
        against = {"the default": default, "the tuned MC dropout (`mcd_tuned/choice_energy`)": tuned}
        paired = []
        for name, other in against.items():
            differences, lower = paired_differences(list(mnll.values()), [other[s]["mnll"] for s in mnll])
            paired.append(f"{mean_se(differences)} against {name} (lower on {lower} of {len(mnll)})")
        rmse = mean_se([row["rmse"] for row in rows.values()])
        means.append(f"{label} ({len(mnll)} splits): {mean_se(list(mnll.values()))}, RMSE {rmse}; " + ", ".join(paired))
    print("\n" + markdown(header, table))
    print("\n" + "\n".join(means))


def concrete_narrow() -> None:
    """Concrete's ``--protocol narrow --calibrate-noise on`` per split and its mean, paired with the default and MC
    dropout's default on the same splits, markdown."""
    narrow = by_split(split_folders(RESULTS / "uci_calibrated" / "concrete_narrow"), "concrete")
    default, mcd = whvi_default("concrete"), mcd_calibrated("concrete")  # the latter checked against its rate choice
    header = ["split", "learned noise", "**calibrated**", "factor c", "RMSE", "the default", "its RMSE",
              "MC dropout, the default", "its RMSE", "s (held-out fit)"]  # fmt: skip
    table = []
    for split, row in sorted(narrow.items()):
        cells = [split, f"{row['learned_noise_mnll']:.3f}", f"**{row['mnll']:.3f}**", f"{row['noise_factor']:.3f}"]
        cells += [
            f"{row['rmse']:.3f}",
            *(f"{other[split][k]:.3f}" for other in (default, mcd) for k in ("mnll", "rmse")),
        ]
        table.append([*cells, f"{row['train_seconds']:.0f} ({row['calibration_seconds']:.0f})"])
    print("\n" + markdown(header, table))
    mnll = {split: row["mnll"] for split, row in narrow.items()}
    for name, other in {"the default": default, "MC dropout's default": mcd}.items():
        paired, lower = paired_differences(list(mnll.values()), [other[s]["mnll"] for s in mnll])
        print(f"{len(mnll)} splits: {mean_se(list(mnll.values()))} against {name} "
              f"({mean_se([other[s]['mnll'] for s in mnll])}): {mean_se(paired)} paired, lower on {lower}")  # fmt: skip


energy_variants()
concrete_narrow()

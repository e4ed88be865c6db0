"""The noise calibrated on held-out rows (``--calibrate-noise on``) from 3,000 training rows, where the default
(``--calibrate-noise auto``) does not calibrate. Per set and split: MNLL minus the known floor of the same fit with
its learned noise and calibrated (the row's ``learned_noise_mnll``, or the same seeded fit trained again without
the flag on the same machine, ``learned_noise_<set>``), the factor c chosen, the held-out rows' MNLL with the learned
noise and calibrated, the seconds, and the default's stored row (``../likelihood_choice/``, the same settings
trained on another machine, whose rounding leads to another fit). A markdown table.

Run from the repository root: ``python benchmarks/results/large_calibration/compare_calibrated.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the tables' printer
from _results import learned_noise_gap, markdown

RESULTS = Path("benchmarks/results")
HERE = RESULTS / "large_calibration"
# label: (folder here, the default's folder, the set's name)
SETS = {
    "power-like, noise growing along x1 (8,611 training rows)": ("power_like_ramp", "power_like_ramp", "hartmann4"),
    "protein-like, noise growing along x1 (41,157)": ("protein_like_ramp", "protein_like_ramp", "wingweight"),
    "bench hartmann6 (18,000)": ("bench_hartmann6", "hartmann6", "hartmann6"),
    "bench robot arm (18,000)": ("bench_robot", "robot", "robot"),
    "power-like, the default since 1d04c69 (the head's held-out fit alone)": (
        "by_default_power_like_ramp",
        "power_like_ramp",
        "hartmann4",
    ),
}
HEADER = ["set", "split", "likelihood", "learned noise: MNLL − floor", "**calibrated**", "change", "factor c",
          "held-out MNLL (learned / calibrated)", "s (held-out fit / split)", "the default's stored row"]  # fmt: skip
# What may differ between the runs' settings: the calibration, and what the table's header prints of it.
SETTING_OF_THE_FLAG = {"calibrate_noise", "protocol", "method_calibrations", "splits"}


def table(folder: Path, name: str) -> tuple[dict, dict[int, dict]]:
    """The run's settings and ``{split: row}`` from ``whvi uci``'s summary of ``name`` in ``folder`` (empty where
    it has not written one yet)."""
    path = folder / f"uci_{name}.json"
    if not path.exists():
        return {}, {}
    meta = json.loads(path.read_text())["meta"]
    return meta["config"], {row["split"]: row for row in meta["splits"]}


def learned_noise_gap_or_rerun(row: dict, rerun: dict) -> float:
    """The test MNLL minus the floor of ``row``'s fit with its learned noise alone: the row's own
    ``learned_noise_mnll`` (the same draws), or else the same seeded fit trained again without the flag on this
    machine (``rerun``, checked to be that fit: the same RMSE)."""
    if "learned_noise_mnll" in row:
        return learned_noise_gap(row)
    if abs(rerun["rmse"] - row["rmse"]) > 1e-9 * row["rmse"]:
        raise SystemExit(f"split {row['split']}: the rerun without the flag is another fit (RMSE {rerun['rmse']})")
    return rerun["mnll_gap"]


def main() -> None:
    rows = []
    for label, (here, default_folder, name) in SETS.items():
        calibrated_config, calibrated = table(HERE / here, name)
        _, rerun = table(HERE / f"learned_noise_{here}", name)
        default_config, default = table(RESULTS / "likelihood_choice" / default_folder, name)
        differ = {k for k in calibrated_config if calibrated_config.get(k) != default_config.get(k)}
        if differ - SETTING_OF_THE_FLAG:
            raise SystemExit(f"{label}: the runs differ in more than the calibration: {sorted(differ)}")
        for split, new in sorted(calibrated.items()):
            if "learned_noise_mnll" not in new and split not in rerun:
                continue
            learned = learned_noise_gap_or_rerun(new, rerun.get(split, {}))
            gaps = f"{learned:.4f}", f"**{new['mnll_gap']:.4f}**", f"{new['mnll_gap'] - learned:+.4f}"
            held_out = "{:.3f} / {:.3f}".format(*new["calibration_mnll"])
            seconds = f"{new['calibration_seconds']:.0f} / {new['train_seconds']:.0f}"
            stored = f"{default[split]['mnll_gap']:.3f}" if split in default else "–"
            cells = [label, split, new["likelihood"], *gaps, f"{new['noise_factor']:.3f}", held_out, seconds, stored]
            rows.append(cells)
    print(markdown(HEADER, rows))


if __name__ == "__main__":
    main()

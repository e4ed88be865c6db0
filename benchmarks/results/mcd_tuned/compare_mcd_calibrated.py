"""MC dropout with its noise calibrated on held-out rows (``whvi uci --calibrate-noise on``, as WHVI's default
calibrates below 3,000 training rows, and as Gal's grid search chooses the noise precision τ on held-out rows) at the
rate its default chose per split (``choice_<set>``): against the same fit's learned noise and against WHVI's default,
paired per split, over splits 0-4, 5-9, 10 on (as they were run) and all; then over every split, against the
published peers' means; then at 2,000 synthetic rows with a known floor (``rows2000``). Markdown tables.

The rows are in ``calibrated/<set>/split<N>/``, one ``whvi uci`` run per split at that split's chosen rate (the
command in the README): the fit on all training rows and the held-out fit are the ones the default's choice trained,
so each row's ``learned_noise_mnll`` is ``choice_<set>``'s MNLL, which :func:`rows` checks.

Run from the repository root: ``python benchmarks/results/mcd_tuned/compare_mcd_calibrated.py``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the summaries' readers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare.py, beside this file
from _results import paired_differences, split_folders
from compare import HERE, SETS, against_published, by_split, chosen, markdown, mean_se, split_parts, whvi_default

CALIBRATED = HERE / "calibrated"
SYNTHETIC = ("hartmann6", "robot")  # the 2,000-row sets of ``rows2000``


def rows(name: str, where: Path | None = None, default: dict[int, dict] | None = None) -> dict[int, dict]:
    """``{split: row}`` of MC dropout with its noise calibrated on ``name`` (the folders ``split<N>`` in ``where``,
    by default ``calibrated/<name>``), each checked against the row of that split with the learned noise
    (``default``, by default ``choice_<name>``'s): the same rate and, with the learned noise, the same test MNLL (the
    same fit)."""
    default = chosen(name) if default is None else default
    found: dict[int, dict] = {}
    for folder in split_folders(CALIBRATED / name if where is None else where):
        meta = json.loads((folder / f"uci_{name}.json").read_text())["meta"]
        ran = meta["config"]["dropout"]
        for row in meta["splits"]:
            split = row["split"]
            learned, rate = default[split]["mnll"], default[split]["dropout"]
            if ran != rate or not math.isclose(row["learned_noise_mnll"], learned, rel_tol=1e-9):
                raise SystemExit(
                    f"{folder}: rate {ran} and learned-noise MNLL {row['learned_noise_mnll']!r}; choice_{name}'s "
                    f"split {split}: rate {rate} and MNLL {learned!r}: not the same fit"
                )
            found.setdefault(split, row)
    return found


def main() -> None:
    header = [
        "set",
        "splits",
        "MC dropout, learned noise",
        "MC dropout, calibrated",
        "calibrated − learned",
        "calibration lower on",
        "WHVI, the default",
        "WHVI − MC dropout calibrated",
        "WHVI lower on",
    ]
    table, factors = [], []
    for name in SETS:
        calibrated, whvi = rows(name), whvi_default(name)
        shared = sorted(set(calibrated) & set(whvi))
        for part in split_parts(shared) if shared else []:
            learned = [calibrated[s]["learned_noise_mnll"] for s in part]
            mine = [calibrated[s]["mnll"] for s in part]
            theirs = [whvi[s]["mnll"] for s in part]
            (gain, gained), (paired, below) = paired_differences(mine, learned), paired_differences(theirs, mine)
            cells = [name, f"{part[0]}-{part[-1]}", mean_se(learned), mean_se(mine), mean_se(gain)]
            cells += [f"{gained} of {len(part)}", mean_se(theirs), mean_se(paired)]
            table.append([*cells, f"{below} of {len(part)}"])
        if shared:
            chosen_factors = [calibrated[s]["noise_factor"] for s in shared]
            factors.append([name, f"{min(chosen_factors):.2f}-{max(chosen_factors):.2f}", f"{len(shared)}"])
    print(markdown(header, table))
    print("\n" + markdown(["set", "noise factor chosen", "splits"], factors))


def synthetic() -> None:
    """At 2,000 rows (``rows2000``: 1,800 for training, a known floor) MC dropout calibrated (``calibrated_<f>``)
    against its learned noise (``choice_<f>``, the default's rows before the calibration): MNLL minus the floor."""
    table = []
    for name in SYNTHETIC:
        learned_rows = by_split(HERE / "rows2000" / f"choice_{name}", name)
        found = rows(name, HERE / "rows2000" / f"calibrated_{name}", learned_rows)
        if not found:
            continue
        shared = sorted(found)
        gaps = [found[s]["mnll_gap"] for s in shared]
        learned = [learned_rows[s]["mnll_gap"] for s in shared]  # the same fit's, as rows() checks
        gain, gained = paired_differences(*([found[s][k] for s in shared] for k in ("mnll", "learned_noise_mnll")))
        factors = ", ".join(f"{found[s]['noise_factor']:.2f}" for s in shared)
        cells = [name, ",".join(map(str, shared)), mean_se(learned), mean_se(gaps), mean_se(gain)]
        table.append([*cells, f"{gained} of {len(shared)}", factors])
    if table:
        header = ["function (2,000 rows)", "splits", "learned noise", "calibrated", "change", "lower on", "factors"]
        print("\nMNLL − floor\n\n" + markdown(header, table))


if __name__ == "__main__":
    main()
    against_published(lambda name: [("WHVI, the default", whvi_default(name)), ("MC dropout, calibrated", rows(name))])
    synthetic()

"""MC dropout with its rate chosen on held-out rows (``choice_bench/<function>``) against MC dropout at the default's
fixed rate, 0.005, trained on the same machine (``fixed_bench/<function>``) and as stored for the default
(``heteroscedastic/default_bench/<function>_mcd_table3_head``, made on another machine: the same network, head,
schedule and seeds), and WHVI's default (``likelihood_choice/<function>``) on the synthetic bench (20,000 rows, 18,000
for training): per function the test MNLL above the known floor and RMSE / σ (mean ± standard error over the splits
the chosen rate has), the rates chosen, the seconds a split took, on how many splits the chosen rate's MNLL is lower
than the fixed rate's on the same machine, and on how many WHVI's default is lower than each. A markdown table.

Run from the repository root: ``python benchmarks/results/mcd_tuned/compare_bench.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import RESULTS, by_split, mean_se  # this folder's helpers

FUNCTIONS = ("hartmann6", "borehole", "otlcircuit", "robot")


def main() -> None:
    header = ["function", "setting", "splits", "MNLL − floor", "RMSE / σ", "s/split", "chosen lower on"]
    header.append("WHVI lower on")
    print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    for name in FUNCTIONS:
        chosen = by_split(RESULTS / "mcd_tuned" / "choice_bench" / name, name)
        if not chosen:
            continue
        stored = by_split(RESULTS / "heteroscedastic" / "default_bench" / f"{name}_mcd_table3_head", name)
        fixed = by_split(RESULTS / "mcd_tuned" / "fixed_bench" / name, name)
        whvi = by_split(RESULTS / "likelihood_choice" / name, name)
        shared = sorted(set(chosen) & set(fixed) & set(stored) & set(whvi))
        rates = ", ".join(f"{chosen[s]['dropout']:g}" for s in shared)
        settings = [
            ("WHVI, the default", whvi),
            ("MC dropout, rate 0.005, the default (as stored, another machine)", stored),
            ("MC dropout, rate 0.005, the default (this machine)", fixed),
            (f"MC dropout, rate chosen on held-out rows (chose {rates})", chosen),
        ]
        for label, table in settings:
            cells = [
                name,
                label,
                ",".join(map(str, shared)),
                mean_se([table[s]["mnll_gap"] for s in shared]),
                mean_se([table[s]["rmse_ratio"] for s in shared]),
                f"{sum(table[s]['train_seconds'] for s in shared) / len(shared):.0f}",
                f"{sum(chosen[s]['mnll'] < fixed[s]['mnll'] for s in shared)} of {len(shared)}"
                if table is chosen
                else "",
                "" if table is whvi else f"{sum(whvi[s]['mnll'] < table[s]['mnll'] for s in shared)} of {len(shared)}",
            ]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

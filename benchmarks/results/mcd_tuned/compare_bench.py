"""MC dropout with its rate chosen on held-out rows (``choice_bench/<function>``) against MC dropout at the default's
fixed rate, 0.005, trained on the same machine (``fixed_bench/<function>``) and as stored for the default
(``heteroscedastic/default_bench/<function>_mcd_table3_head``, made on another machine: the same network, head,
schedule and seeds), and WHVI's default (``likelihood_choice/<function>``) on the synthetic bench (20,000 rows, 18,000
for training): per function the test MNLL above the known floor and RMSE / σ (mean ± standard error over the splits
the chosen rate has), the rates chosen, the seconds a split took, on how many splits the chosen rate's MNLL is lower
than the fixed rate's on the same machine, and on how many WHVI's default is lower than each. A markdown table; with
``--rows 2000`` the same for the 2,000-row sets (``rows2000/choice_<function>`` and ``fixed_<function>``, below the
threshold from which the default keeps the fixed rate; WHVI not run there).

Run from the repository root: ``python benchmarks/results/mcd_tuned/compare_bench.py [--rows 2000]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import HERE, RESULTS, by_split, markdown, mean_se  # this folder's helpers

FUNCTIONS = ("hartmann6", "borehole", "otlcircuit", "robot")


def settings_at_18000(name: str) -> list[tuple[str, dict[int, dict]]]:
    """``(label, {split: row})`` of WHVI's default and MC dropout's settings on the bench's ``name`` (18,000 training
    rows), the chosen rate last and the fixed rate trained here before it."""
    stored = by_split(RESULTS / "heteroscedastic" / "default_bench" / f"{name}_mcd_table3_head", name)
    return [
        ("WHVI, the default", by_split(RESULTS / "likelihood_choice" / name, name)),
        ("MC dropout, rate 0.005, the default (as stored, another machine)", stored),
        ("MC dropout, rate 0.005, the default (this machine)", by_split(HERE / "fixed_bench" / name, name)),
        ("MC dropout, rate chosen on held-out rows", by_split(HERE / "choice_bench" / name, name)),
    ]


def settings_at_2000(name: str) -> list[tuple[str, dict[int, dict]]]:
    """As :func:`settings_at_18000` on the 2,000-row set ``name`` (1,800 training rows), MC dropout alone."""
    folder = HERE / "rows2000"
    return [
        ("MC dropout, rate 0.005 (the default until 2026-12-06)", by_split(folder / f"fixed_{name}", name)),
        ("MC dropout, rate chosen on held-out rows (the default)", by_split(folder / f"choice_{name}", name)),
    ]


def main() -> None:
    at_2000 = sys.argv[1:] == ["--rows", "2000"]
    header = ["function", "setting", "splits", "MNLL − floor", "RMSE / σ", "s/split", "chosen lower on"]
    header += [] if at_2000 else ["WHVI lower on"]
    rows = []
    for name in FUNCTIONS:
        settings = (settings_at_2000 if at_2000 else settings_at_18000)(name)
        chosen, fixed = settings[-1][1], settings[-2][1]
        shared = sorted(set.intersection(*(set(table) for _, table in settings)))
        if not shared:
            continue
        whvi = settings[0][1]
        rates = ", ".join(f"{chosen[s]['dropout']:g}" for s in shared)
        lower = sum(chosen[s]["mnll"] < fixed[s]["mnll"] for s in shared)
        for label, table in settings:
            cells = [
                name,
                label + (f" (chose {rates})" if table is chosen else ""),
                ",".join(map(str, shared)),
                mean_se([table[s]["mnll_gap"] for s in shared]),
                mean_se([table[s]["rmse_ratio"] for s in shared]),
                f"{sum(table[s]['train_seconds'] for s in shared) / len(shared):.0f}",
                f"{lower} of {len(shared)}" if table is chosen else "",
            ]
            if not at_2000:
                below = sum(whvi[s]["mnll"] < table[s]["mnll"] for s in shared)
                cells.append("" if table is whvi else f"{below} of {len(shared)}")
            rows.append(cells)
    print(markdown(header, rows))


if __name__ == "__main__":
    main()

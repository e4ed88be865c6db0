"""MC dropout at each rate measured here against its default (``uci_table3/mcd``: rate 0.005) and WHVI's default
(``uci_calibrated``): per set the test MNLL and RMSE (mean ± standard error over the splits) of each rate, of the
best rate per split chosen on the test rows (an oracle: more than tuning MC dropout could give), and of MC dropout
with its rate chosen on held-out rows (``choice_<set>``), and on how many splits WHVI's default is lower than each.
Then, where both have more than splits 0-4, the two over splits 0-4, 5-9, 10 on and all, paired; and each over every
split it has against the published peers' means. Markdown tables.

Run from the repository root: ``python benchmarks/results/mcd_tuned/compare.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the published numbers
from _results import by_split, markdown, mean_se, paired_differences
from uci_summary import published

RESULTS = Path("benchmarks/results")
HERE = RESULTS / "mcd_tuned"
# set: the folders of WHVI's default's splits (``uci_calibrated``), the first one's splits first
SETS = {
    "yacht": ("whvi",),
    "energy": ("whvi_energy",),
    "bostonHousing": ("whvi_boston", "whvi_boston_splits5-9", "whvi_boston_splits10-19"),
    "concrete": ("whvi_concrete", "whvi_concrete_splits5-9", "whvi_concrete_splits10-19"),
}
# label: the folder of a set's table, given the set's name
SETTINGS = {
    "rate 0.005 (the default)": lambda name: default_rate(name),
    "rate 0.01": lambda name: HERE / f"p0.01_{name}",
    "rate 0.05": lambda name: HERE / f"p0.05_{name}",
}
CHOSEN = "the rate chosen on held-out rows from 0.005, 0.01, 0.05, 0.1 (`--dropout 0.005,0.01,0.05,0.1`)"
ORACLE = "the best of the fixed rates per split, chosen on the test rows (an oracle)"


def default_rate(name: str) -> Path:
    """The folder of MC dropout at its default rate on ``name``: rerun at engine version 3 where it was on all five
    splits, else ``uci_table3/mcd`` (engine version 1)."""
    rerun = HERE / f"p0.005_engine3_{name}"
    return rerun if len(by_split(rerun, name)) == 5 else RESULTS / "uci_table3" / "mcd"


def whvi_default(name: str) -> dict[int, dict]:
    """``{split: row}`` of WHVI's default on ``name`` (:data:`SETS`' folders)."""
    return by_split(tuple(RESULTS / "uci_calibrated" / each for each in SETS[name]), name)


def chosen(name: str) -> dict[int, dict]:
    """``{split: row}`` of MC dropout with its rate chosen on held-out rows (the default) on ``name``."""
    return by_split(HERE / f"choice_{name}", name)


def main() -> None:
    header = ["set", "MC dropout setting", "splits", "test MNLL", "test RMSE", "WHVI's default lower on"]
    rows = []
    for name in SETS:
        whvi = whvi_default(name)
        tables = {label: by_split(folder(name), name) for label, folder in SETTINGS.items()}
        complete = sorted(set(whvi).intersection(*tables.values()))
        if complete:
            tables[ORACLE] = {s: min((t[s] for t in tables.values()), key=lambda row: row["mnll"]) for s in complete}
        tables[CHOSEN] = chosen(name)
        for label, table in [("WHVI, the default", whvi), *tables.items()]:
            shared = sorted(set(table) & set(whvi))
            if not shared:
                continue
            mnll = [table[s]["mnll"] for s in shared]
            rmse = [table[s]["rmse"] for s in shared]
            below = sum(whvi[s]["mnll"] < table[s]["mnll"] for s in shared)
            lower = "" if table is whvi else f"{below} of {len(shared)}"
            chose = ", ".join(f"{table[s]['dropout']:g}" for s in shared) if label == CHOSEN else ""
            rates = f" (chose {chose})" if chose else ""
            if label.startswith("rate 0.005"):
                rates = " (engine version 3)" if "engine3" in str(default_rate(name)) else " (`uci_table3/mcd`)"
            rows.append([name, label + rates, ",".join(map(str, shared)), mean_se(mnll), mean_se(rmse), lower])
    print(markdown(header, rows))


def split_parts(shared: list[int]) -> list[list[int]]:
    """The sorted splits ``shared`` over 0-4, 5-9 and 10 on (as they were run), then all, where there are splits past
    0-4; else ``shared`` alone."""
    if max(shared, default=0) < 5:
        return [shared]
    cuts = ((0, 5), (5, 10), (10, shared[-1] + 1))
    return [*filter(None, ([s for s in shared if low <= s < high] for low, high in cuts)), shared]


def more_splits() -> None:
    """Where WHVI's default and the chosen rate both have splits past 0-4: each over splits 0-4, 5-9, 10 on (as
    they were run) and all, with the paired difference per split (mean ± standard error), a markdown table."""
    header = ["set", "splits", "WHVI, the default", "MC dropout, rate chosen", "WHVI − MC dropout", "WHVI lower on"]
    rows = []
    for name in SETS:
        whvi = whvi_default(name)
        choice = chosen(name)
        shared = sorted(set(whvi) & set(choice))
        if max(shared, default=0) < 5:
            continue
        for part in split_parts(shared):
            mine, theirs = ([table[s]["mnll"] for s in part] for table in (whvi, choice))
            paired, below = paired_differences(mine, theirs)
            cells = [name, f"{part[0]}-{part[-1]}", mean_se(mine), mean_se(theirs), mean_se(paired)]
            rows.append([*cells, f"{below} of {len(part)}"])
    if rows:
        print("\n" + markdown(header, rows))


def whvi_and_chosen(name: str) -> list[tuple[str, dict[int, dict]]]:
    """WHVI's default and MC dropout with its rate chosen on ``name``: ``(label, {split: row})``."""
    return [("WHVI, the default", whvi_default(name)), ("MC dropout, rate chosen", chosen(name))]


def against_published(methods: Callable[[str], list[tuple[str, dict[int, dict]]]] = whvi_and_chosen) -> None:
    """Each ``(label, {split: row})`` of ``methods(name)`` (WHVI's default and MC dropout's, the rate chosen) over
    every split it has on a set with more than five, against the published peers' means."""
    rows = []
    for name in SETS:
        peers = ", ".join(f"{peer}: {value:.2f}" for peer, value in published(name).items())
        for label, table in methods(name):
            if len(table) > 5:
                splits = f"{min(table)}-{max(table)}"
                rows.append([name, label, splits, mean_se([row["mnll"] for row in table.values()]), peers])
    if rows:
        print("\n" + markdown(["set", "method", "splits", "test MNLL", "published (20 splits)"], rows))


if __name__ == "__main__":
    main()
    more_splits()
    against_published()

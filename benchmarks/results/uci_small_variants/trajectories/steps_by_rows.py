"""A probe's summary (not part of the library): for each ``trajectory.py`` JSON given, split by split, the test MNLL
minus the floor at 50,500 and at 101,000 steps of one run, with the training rows and the noise estimate over σ, as
a markdown table sorted by the rows; and per size, on how many splits twice the steps was lower. The floor
(``0.5 log(2 pi sigma^2) + 0.5``) and σ come from the data folder's ``README.json`` (``whvi synthetic`` writes it),
so the synthetic sets must exist where the JSON says they were.

usage: python steps_by_rows.py TRAJECTORY_JSON...
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

rows = []
for name in sys.argv[1:]:
    run = json.loads(Path(name).read_text())
    made = json.loads((Path(run["data"]) / "README.json").read_text())
    sigma, points = made["sigma"], {point["step"]: point for point in run["points"]}
    floor = 0.5 * math.log(2 * math.pi * sigma**2) + 0.5
    short, long = points[50_500], points[101_000]
    train_rows = made["num_points"] - math.ceil(made["num_points"] / 10)  # the 90/10 splits of whvi synthetic
    label = f"{made['function']}, {made['num_points']:,} rows, σ {made['noise_fraction']:g}, seed {made['seed']}"
    rows.append((train_rows, label, run["split"], short, long, floor, sigma))

print("| training rows | set | split | MNLL − floor, 50,500 / 101,000 steps | change | noise / σ |")
print("|---|---|---|---|---|---|")
lower: dict[int, list[bool]] = defaultdict(list)
for train_rows, label, split, short, long, floor, sigma in sorted(rows, key=lambda row: row[:3]):
    change = long["mnll"] - short["mnll"]
    lower[train_rows].append(change < 0)
    print(
        f"| {train_rows:,} | {label} | {split} | {short['mnll'] - floor:.3f} / {long['mnll'] - floor:.3f} | "
        f"{change:+.3f} | {short['noise_scale'] / sigma:.2f} / {long['noise_scale'] / sigma:.2f} |"
    )
print()
for train_rows, each in sorted(lower.items()):
    print(f"- {train_rows:,} training rows: twice the steps lower on {sum(each)} of {len(each)} splits")

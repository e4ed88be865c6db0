"""The factor rule on the four small UCI sets (``whvi uci --choose-by noise-factor``; the default for part of
2026-12-07, when these runs were made): WHVI below 3,000 training rows at ``narrow`` where its calibrated noise
factor on the held-out rows is at most 1, else ``table3`` (``pyro_whvi/experiments/auto_narrow.py``). Prints each
split against the default (``table3``, calibrated: ``whvi*/``), and checks each row against the run of the protocol
it chose (``narrow`` calibrated, where it ran: ``narrow_choice/``, ``energy_variants/``, ``concrete_narrow/``;
``table3`` calibrated: the default's): the same seeds and the same fits, so the test MNLL is the same float where
that run was made on the same machine (elsewhere it differs in the rounding). Then the means, the paired differences
and the fits trained.

Run from the repository root: ``python benchmarks/results/uci_calibrated/factor_rule_default.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for the summaries' reader
sys.path.insert(0, str(Path(__file__).resolve().parent))  # narrow_choice's folders
from _results import by_split, markdown, mean_se, paired_differences
from narrow_choice import HERE, STRICT_RULE, UCI, clearly_below_one

from pyro_whvi.metrics import mean_and_standard_error

RULE = HERE / "factor_rule_default"
#: The check planned before its runs (the README): Boston's splits 5-19, where ``narrow`` had never run. The default
#: goes back to ``table3`` if the rule's mean there is above the old default's by more than one standard error.
PLANNED = ("bostonHousing", range(5, 20))
HEADER = ["set", "split", "chosen", "factors read", "test MNLL, before", "**now**", "change", "its protocol's own run"]


def main() -> None:
    before_all, now_all, fits, strict_all = [], [], [], []
    for name, (default_folders, narrow_folders) in UCI.items():
        folders = tuple(sorted(RULE.glob(f"{name}*")))
        now, before, narrow = (by_split(each, name) for each in (folders, default_folders, narrow_folders))
        lines = []
        for split in sorted(now):
            row = now[split]
            factors = row["noise_factors"]
            own = (narrow if row["protocol"] == "narrow" else before).get(split)
            same = "–" if own is None else "the same float"
            if own is not None and own["mnll"] != row["mnll"]:  # made on another machine: its own rounding
                same = f"{row['mnll'] - own['mnll']:+.1e} from it"
            old = before[split]["mnll"] if split in before else None
            change = "–" if old is None else f"{row['mnll'] - old:+.3f}"
            shown = ", ".join(f"{label} {value:.3f}" for label, value in factors.items())
            old_text = "–" if old is None else f"{old:.3f}"
            lines.append([name, split, row["protocol"], shown, old_text, f"**{row['mnll']:.3f}**", change, same])
            fits.append(len(factors) + 1)
            if old is not None:
                before_all.append(old)
                now_all.append(row["mnll"])
                strict = row["protocol"] == "narrow" and clearly_below_one(row)  # its factor is narrow's there
                strict_all.append(row["mnll"] if strict else old)
        if not lines:
            continue
        print(f"\n## {name}\n\n" + markdown(HEADER, lines))
        paired = [split for split in sorted(now) if split in before]
        differences, lower = paired_differences([now[s]["mnll"] for s in paired], [before[s]["mnll"] for s in paired])
        narrow_count = sum(now[s]["protocol"] == "narrow" for s in now)
        if name == PLANNED[0]:
            planned = [s for s in paired if s in PLANNED[1]]
            check, _ = paired_differences([now[s]["mnll"] for s in planned], [before[s]["mnll"] for s in planned])
            mean, standard_error = mean_and_standard_error(check)
            verdict = "above by more than one SE: table3 stays the default" if mean > standard_error else "not above"
            print(
                f"\nthe planned check, {name}'s splits {planned[0]}-{planned[-1]} ({len(planned)} of "
                f"{len(PLANNED[1])}): now − before {mean_se(check)}, {verdict}"
            )
        print(
            f"\n{name} ({len(now)} splits, narrow on {narrow_count}): now {mean_se([now[s]['mnll'] for s in now])}, "
            f"before {mean_se([before[s]['mnll'] for s in paired])} on the {len(paired)} paired; now − before "
            f"{mean_se(differences)} (lower on {lower}, higher on {sum(d > 0 for d in differences)})"
        )
    if not now_all:
        print(f"no summaries in {RULE} yet")
        return
    differences, lower = paired_differences(now_all, before_all)
    print(
        f"\nAll {len(differences)} paired splits: now − before {mean_se(differences)} (lower on {lower}, higher on "
        f"{sum(d > 0 for d in differences)}; the largest rise {max(differences):+.3f}). Fits trained: "
        f"{sum(fits)} over {len(fits)} splits, {sum(fits) / (2 * len(fits)):.2f} times the calibrated table3's two"
    )
    differences, lower = paired_differences(strict_all, before_all)
    print(
        f"{STRICT_RULE} (narrow_choice.clearly_below_one; posed after these runs): now − before "
        f"{mean_se(differences)} (lower on {lower}, higher on {sum(d > 0 for d in differences)})"
    )


if __name__ == "__main__":
    main()

"""One table and one figure from several ``whvi uci`` results, next to the WHVI paper's Table 3.

    python benchmarks/uci_summary.py --results benchmarks/results --datasets yacht,bostonHousing,concrete,energy

Reads ``uci_<dataset>.json`` (written by ``whvi uci``) for each dataset and writes
``uci_summary.{md,png}`` to ``--out`` (default: the first results folder). ``--results`` may be given
several times: a method's row comes from the first folder that has it for that dataset (e.g. runs at
another step count first, then the rest), and every row says its step count; the header names the rows whose noise
was calibrated on held-out rows (``--calibrate-noise``). Test RMSE and MNLL per method,
mean ± standard error over splits, with the paper's values (2 x 128 ReLU, mean (std) over 8 splits).
On the eight standard sets of :data:`PUBLISHED_MNLL` (matched by name) the table adds the published MNLL of MC
dropout, grid-searched, and of deep ensembles as fixed reference rows, and the verdict says whether WHVI's MNLL is
at or below the best of them. The markdown also says, per dataset, whether WHVI's RMSE is within one of the paper's
standard deviations of its Table 3 value or better, whether its MNLL is below the paper's and below the mean-field
(MFG) one, and which WHVI variants in the table (every method of
:data:`~pyro_whvi.experiments.methods.WHVI_COVARIANCES`, with or without ``+iblm``) have an MNLL at or below MC
dropout's.

On a set with a known noise level (``whvi synthetic``, whose JSON rows carry the distance to the floor) a
second table gives each method's MNLL minus the floor, RMSE and estimated noise over the true σ, and the
verdict names the methods within :data:`FLOOR_MNLL_GAP` nats of the floor with a noise estimate within
:data:`FLOOR_NOISE_TOLERANCE` of σ (issue 28's check); the figure then shows those ratios instead::

    python benchmarks/uci_summary.py --results benchmarks/results/synthetic \\
        --results benchmarks/results/synthetic/more_methods --results benchmarks/results/synthetic/nf-whvi \\
        --datasets borehole,hartmann6,otlcircuit,robot,rastrigin5 --out benchmarks/results/synthetic
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyro_whvi.experiments.methods import WHVI_COVARIANCES, parse_method
from pyro_whvi.experiments.reporting import write_atomic
from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.experiments.uci_protocols import AUTO_WIDE_FROM_ROWS
from pyro_whvi.experiments.uci_report import FLOOR_LABELS, FLOOR_METRICS

# WHVI paper, Table 3 (2 x 128 ReLU): dataset -> method -> (RMSE mean, std, MNLL mean, std)
PAPER_TABLE_3 = {
    "bostonHousing": {
        "mcd": (3.91, 0.86, 6.90, 2.93),
        "mfg": (4.47, 0.85, 2.99, 0.41),
        "whvi": (3.14, 0.71, 4.33, 1.80),
    },
    "concrete": {"mcd": (5.12, 0.79, 3.20, 0.36), "mfg": (8.01, 0.41, 3.41, 0.05), "whvi": (4.70, 0.72, 3.17, 0.37)},
    "energy": {"mcd": (2.07, 0.11, 4.15, 0.15), "mfg": (3.10, 0.14, 4.91, 0.09), "whvi": (0.58, 0.07, 2.00, 0.60)},
    "yacht": {"mcd": (1.90, 0.54, 2.95, 1.27), "mfg": (7.01, 1.22, 3.38, 0.29), "whvi": (0.69, 0.16, 1.80, 1.01)},
}

# The published MNLL (negative test log-likelihood, mean over the standard splits of Hernandez-Lobato and Adams, 2015)
# of the strongest practical peers, fixed reference rows of the table: MC dropout grid-searched (the updated table of
# Gal's DropoutUncertaintyExps README) and deep ensembles of 5 networks (Lakshminarayanan et al. 2017, Table 1).
PUBLISHED_MNLL = {
    "MC dropout, grid-searched (Gal's DropoutUncertaintyExps)": {
        "bostonHousing": 2.40,
        "concrete": 2.93,
        "energy": 1.21,
        "kin8nm": -1.14,
        "naval": -4.45,
        "power": 2.80,
        "protein": 2.87,
        "yacht": 1.25,
    },
    "deep ensembles, 5 networks (Lakshminarayanan et al. 2017, Table 1)": {
        "bostonHousing": 2.41,
        "concrete": 3.06,
        "energy": 1.38,
        "kin8nm": -1.20,
        "naval": -5.63,
        "power": 2.79,
        "protein": 2.83,
        "yacht": 1.18,
    },
}


def _plain(name: str) -> str:
    return "".join(c for c in name.lower() if c.isalnum())


def published(dataset: str) -> dict[str, float]:
    """Peer -> published MNLL on ``dataset``, matched by name without case or punctuation, either name a prefix of the
    other (``naval-propulsion-plant`` is ``naval``, ``boston`` is ``bostonHousing``); empty for another data set."""
    mine = _plain(dataset)
    found = {}
    for peer, values in PUBLISHED_MNLL.items():
        for name, value in values.items():
            theirs = _plain(name)
            if min(len(mine), len(theirs)) >= 4 and (mine.startswith(theirs) or theirs.startswith(mine)):
                found[peer] = value
    return found


# A method is at the floor when its test MNLL is within FLOOR_MNLL_GAP nats of the best possible and its learned
# noise scale within a fraction FLOOR_NOISE_TOLERANCE of the true sigma.
FLOOR_MNLL_GAP = 0.1
FLOOR_NOISE_TOLERANCE = 0.1
TEMPERED = " (KL "  # a row label's mark of a run with a KL weight other than 1
DROPOUT = " (dropout "  # an MC dropout row's mark of a rate other than the default, or of rates chosen from


def load(folders: list[Path], dataset: str) -> dict:
    """Method -> summary entry (with the run's ``steps``), each from the first folder that has it. A run with a
    tempered objective (``whvi uci --kl-weight``) is its own row, ``"<method> (KL <weight>)"``, or with the weight
    chosen on validation, ``"<method> (KL from <candidates>)"``; MC dropout at a rate other than the default is
    ``"mcd (dropout <rate>)"``, or with the rate chosen on validation ``"mcd (dropout from <candidates>)"``."""
    merged: dict = {}
    for folder in folders:
        path = folder / f"uci_{dataset}.json"
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        config = record["meta"]["config"]
        weight = config.get("kl_weight", 1.0)
        if isinstance(weight, list):  # candidates, one chosen per split on validation (whvi uci --kl-weight a,b)
            mark = f"{TEMPERED}from {','.join(f'{w:g}' for w in weight)})"
        else:
            mark = "" if weight == 1.0 else f"{TEMPERED}{weight:g})"
        rate = config.get("dropout", UCIConfig.dropout)
        rates = f"from {','.join(f'{r:g}' for r in rate)}" if isinstance(rate, list) else f"{rate:g}"
        rated = "" if rate == UCIConfig.dropout else f"{DROPOUT}{rates})"
        for entry in record["results"]:
            label = entry["method"] + mark + (rated if parse_method(entry["method"]).base == "mcd" else "")
            rows = [row for row in record["meta"]["splits"] if row["method"] == entry["method"]]
            merged.setdefault(
                label,
                {
                    **entry,
                    "steps": config["schedule"]["steps"],
                    "config": config,
                    "split_mnll": {row["split"]: row["mnll"] for row in rows},
                    "calibrated": any("noise_factor" in row for row in rows),
                },
            )
    if not merged:
        raise SystemExit(f"uci_summary: no uci_{dataset}.json in {', '.join(map(str, folders))}")
    return merged


def is_whvi_variant(method: str) -> bool:
    """Whether ``method`` (a row of :func:`load`) is one of the library's WHVI guides, however initialized, trained
    on the ELBO or with a KL weight chosen on validation rows (a weight given by hand is a diagnostic of what the KL
    costs: looking at test scores to give it would tune on the test set)."""
    _, tempered, weight = method.partition(TEMPERED)
    name = method.split(" (")[0]
    return (not tempered or weight.startswith("from ")) and parse_method(name).base in WHVI_COVARIANCES


def has_floor(summary: dict) -> bool:
    """Whether every row of a dataset's ``summary`` carries the distance to a known noise floor."""
    return all(all(metric in row for metric in FLOOR_METRICS) for row in summary.values())


def _on_splits(row: dict, mcd: dict) -> str | None:
    """``""`` when ``row``'s MNLL is at or below MC dropout's over the same splits; where the two rows were run on
    different splits, the comparison is over the splits both have, named (``" (splits 0, 1)"``); ``None`` when
    it is above, or no split is shared. Rows without their splits' values are compared by their means."""
    mine, theirs = row.get("split_mnll", {}), mcd.get("split_mnll", {})
    if mine.keys() == theirs.keys() or not mine or not theirs:  # the same splits, or a row that does not say
        return "" if row["mnll"] <= mcd["mnll"] else None
    common = sorted(mine.keys() & theirs.keys())
    if not common or sum(mine[k] for k in common) > sum(theirs[k] for k in common):
        return None
    return f" (splits {', '.join(map(str, common))})"


def _at_or_below(pairs: list[tuple[str, dict, dict]]) -> list[str]:
    """The labels of the ``(label, row, reference)`` pairs whose row is at or below its reference
    (:func:`_on_splits`), each with the splits compared where that is not all of them."""
    return [
        label + note for label, row, reference in pairs for note in [_on_splits(row, reference)] if note is not None
    ]


def _against_mcd_with_the_same_choice(summary: dict) -> list[str] | None:
    """The WHVI variants with a KL weight chosen on validation rows whose MNLL is at or below that of MC dropout
    given the same choice (``"mcd (KL from <candidates>)"``, its weight decay's weight chosen the same way), over
    the splits both were run on (:func:`_on_splits`); ``None`` when no such pair of rows is in the table."""
    pairs = [
        (m, row, summary[reference])
        for m, row in summary.items()
        for _, tempered, weights in [m.partition(TEMPERED)]
        for reference in [f"mcd{TEMPERED}{weights}"]
        if tempered and weights.startswith("from ") and is_whvi_variant(m) and reference in summary
    ]
    return _at_or_below(pairs) if pairs else None


def checks(dataset: str, summary: dict) -> dict:
    """Per dataset: ``rmse_ok`` (WHVI's RMSE at most the paper's Table 3 value plus one of its standard deviations),
    ``mnll_below_paper``, ``mnll_below_mfg`` (``None`` where a row is missing), ``at_or_below_published`` (WHVI's
    MNLL at most the best published practical peer's, :data:`PUBLISHED_MNLL`; ``None`` without WHVI's row or a
    published value), ``at_or_below_mcd`` (the WHVI variants whose MNLL is at or below MC dropout's, over the splits
    both were run on, named where that is not all of them: :func:`_on_splits`), ``at_or_below_mcd_same_choice`` (the
    same for a KL weight chosen on validation rows, against MC dropout given that choice:
    :func:`_against_mcd_with_the_same_choice`), ``at_or_below_ensemble`` (the same against our deep ensemble's row,
    ``None`` without one) and ``at_floor`` (the methods within :data:`FLOOR_MNLL_GAP` of the
    noise floor with their noise within :data:`FLOOR_NOISE_TOLERANCE` of σ; ``None`` without a known floor)."""
    whvi, mfg, mcd = summary.get("whvi"), summary.get("mfg"), summary.get("mcd")
    paper = PAPER_TABLE_3.get(dataset, {}).get("whvi")
    peers = published(dataset)
    return {
        "rmse_ok": None if whvi is None or paper is None else whvi["rmse"] <= paper[0] + paper[1],
        "mnll_below_paper": None if whvi is None or paper is None else whvi["mnll"] < paper[2],
        "mnll_below_mfg": None if whvi is None or mfg is None else whvi["mnll"] < mfg["mnll"],
        "at_or_below_published": None if whvi is None or not peers else whvi["mnll"] <= min(peers.values()),
        "at_or_below_mcd": None
        if mcd is None
        else _at_or_below([(m, row, mcd) for m, row in summary.items() if is_whvi_variant(m)]),
        "at_or_below_mcd_same_choice": _against_mcd_with_the_same_choice(summary),
        "at_or_below_ensemble": None
        if "ensemble" not in summary
        else _at_or_below([(m, row, summary["ensemble"]) for m, row in summary.items() if is_whvi_variant(m)]),
        "at_floor": [
            m
            for m, row in summary.items()
            if row["mnll_gap"] <= FLOOR_MNLL_GAP and abs(row["noise_ratio"] - 1) <= FLOOR_NOISE_TOLERANCE
        ]
        if has_floor(summary)
        else None,
    }


def verdict_line(dataset: str, verdict: dict) -> str:
    parts = []
    if dataset in PAPER_TABLE_3:
        parts += [
            f"WHVI RMSE within one paper std of Table 3 or better: {verdict['rmse_ok']}",
            f"WHVI MNLL below the paper's: {verdict['mnll_below_paper']}",
        ]
    parts.append(
        f"below MFG's: {verdict['mnll_below_mfg']}" if parts else f"WHVI MNLL below MFG's: {verdict['mnll_below_mfg']}"
    )
    if verdict.get("at_or_below_published") is not None:
        best = min(published(dataset).values())
        parts.append(f"at or below the best published peer's ({best:.2f}): {verdict['at_or_below_published']}")
    if verdict["at_floor"] is not None:
        parts.append(
            f"within {FLOOR_MNLL_GAP} nats of the floor with noise within {FLOOR_NOISE_TOLERANCE:.0%} of σ: "
            + (", ".join(verdict["at_floor"]) or "none")
        )
    beat_mcd = verdict["at_or_below_mcd"]
    parts.append(
        "WHVI variants with MNLL at or below MC dropout's: "
        + ("no MC dropout row" if beat_mcd is None else ", ".join(beat_mcd) or "none")
    )
    if verdict.get("at_or_below_ensemble") is not None:
        parts.append("at or below our deep ensemble's: " + (", ".join(verdict["at_or_below_ensemble"]) or "none"))
    same_choice = verdict["at_or_below_mcd_same_choice"]
    if same_choice is not None:
        parts.append(
            "with the KL weight chosen on validation rows for MC dropout too: " + (", ".join(same_choice) or "none")
        )
    return f"- {dataset}: " + "; ".join(parts)


def table(folders: list[Path], datasets: list[str]) -> tuple[str, dict]:
    lines = [
        "| dataset | method | splits | steps | test RMSE | paper RMSE | test MNLL | paper MNLL | s/split |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    floor_lines = [
        "| dataset | method | splits | steps | variational params | "
        + " | ".join(FLOOR_LABELS[m] for m in FLOOR_METRICS)
        + " | s/split |",
        "|---|---|---|---|---|" + "---|" * len(FLOOR_METRICS) + "---|",
    ]
    summaries, verdicts = {}, []
    for dataset in datasets:
        summary = load(folders, dataset)
        summaries[dataset] = summary
        floor = has_floor(summary)
        for method, e in summary.items():
            paper = PAPER_TABLE_3.get(dataset, {}).get(method)
            paper_rmse = f"{paper[0]:.2f} ({paper[1]:.2f})" if paper else "–"
            paper_mnll = f"{paper[2]:.2f} ({paper[3]:.2f})" if paper else "–"
            lines.append(
                f"| {dataset} | {method} | {e['splits']} | {e['steps']:,} | {e['rmse']:.3f} ± {e['rmse_se']:.3f} | "
                f"{paper_rmse} | {e['mnll']:.3f} ± {e['mnll_se']:.3f} | {paper_mnll} | {e['train_seconds']:.0f} |"
            )
            if floor:
                cells = " | ".join(f"{e[m]:.3f} ± {e[m + '_se']:.3f}" for m in FLOOR_METRICS)
                floor_lines.append(
                    f"| {dataset} | {method} | {e['splits']} | {e['steps']:,} | {e['parameters']:,} | {cells} | "
                    f"{e['train_seconds']:.0f} |"
                )
        for peer, value in published(dataset).items():
            lines.append(f"| {dataset} | published: {peer} | – | – | – | – | – | {value:.2f} | – |")
        verdicts.append(verdict_line(dataset, checks(dataset, summary)))
    config = next(iter(next(iter(summaries.values())).values()))["config"]
    schedule = config["schedule"]
    header = (
        f"Our runs: {config['layers']}x{config['hidden']} ReLU, the steps in each row, batch "
        f"{schedule['batch_size']} (noise fixed for the first {schedule['fixed_noise_steps']}), lr {schedule['lr']}, "
        f"{config['samples']} test samples, mean ± standard error over splits."
    )
    if any(dataset in PAPER_TABLE_3 for dataset in datasets):
        header += " Paper: Table 3, mean (std) over 8 splits, 50,500 steps."
    if any(published(dataset) for dataset in datasets):
        header += (
            " Rows 'published:' are the MNLL the peer's authors report on the standard splits (their own protocols),"
            " fixed reference values, not runs."
        )
    calibrated = [f"{m} on {d}" for d, summary in summaries.items() for m, e in summary.items() if e["calibrated"]]
    if calibrated:
        header += (
            " Noise calibrated on held-out training rows (`whvi uci --calibrate-noise`, under `auto` the default for"
            f" WHVI below {AUTO_WIDE_FROM_ROWS:,} training rows; its factor per split in the run's own table):"
            f" {', '.join(calibrated)}."
        )
    blocks = [header, "", *lines]
    if len(floor_lines) > 2:
        blocks += [
            "",
            "Against the known noise floor (MNLL minus the best possible; RMSE and noise over σ):",
            "",
            *floor_lines,
        ]
    return "\n".join([*blocks, "", *verdicts]), summaries


def plot(summaries: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(summaries)
    fig, axes = plt.subplots(2, len(datasets), figsize=(3.2 * len(datasets), 5.6), squeeze=False)
    for column, dataset in enumerate(datasets):
        methods = list(summaries[dataset])
        floor = has_floor(summaries[dataset])
        for row, metric in enumerate(("rmse_ratio", "mnll_gap") if floor else ("rmse", "mnll")):
            ax = axes[row][column]
            values = [summaries[dataset][m][metric] for m in methods]
            errors = [summaries[dataset][m][metric + "_se"] for m in methods]
            ax.bar(methods, values, yerr=errors, color=[f"C{k}" for k in range(len(methods))], alpha=0.7, capsize=3)
            peers = published(dataset)
            if row == 1 and not floor and peers:
                ax.axhline(min(peers.values()), color="k", ls=":", lw=1.2, label="best published peer")
            if floor:  # the floor itself (RMSE = σ) and the check's MNLL margin above it
                ax.axhline((1.0, FLOOR_MNLL_GAP)[row], color="k", ls="--", lw=1.2, label="floor check")
            paper = [PAPER_TABLE_3.get(dataset, {}).get(m) for m in methods]
            for k, p in enumerate(paper):
                if p:
                    ax.plot([k - 0.4, k + 0.4], [p[2 * row]] * 2, "k--", lw=1.2, label="paper" if k == 0 else None)
            ax.set_title(f"{dataset}: {FLOOR_LABELS.get(metric, 'test ' + metric.upper())}", fontsize=9)
            ax.tick_params(axis="x", labelrotation=30, labelsize=7)
            if column == 0 and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--results",
        type=Path,
        action="append",
        help="folder with uci_*.json; repeat it to merge folders, earlier ones first (default benchmarks/results)",
    )
    parser.add_argument("--datasets", default="yacht,bostonHousing,concrete,energy", help="comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: --results)")
    args = parser.parse_args(argv)
    folders = args.results or [Path("benchmarks/results")]
    out = args.out or folders[0]
    out.mkdir(parents=True, exist_ok=True)
    text, summaries = table(folders, [d for d in args.datasets.split(",") if d])
    write_atomic(out / "uci_summary.md", text + "\n")
    plot(summaries, out / "uci_summary.png")
    print(text)
    print(f"\nwrote {out / 'uci_summary.md'} and {out / 'uci_summary.png'}")


if __name__ == "__main__":
    main()

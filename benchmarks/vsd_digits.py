"""VSD vs MC dropout vs mean-field VI (AutoNormal) on scikit-learn's digits (VSD paper §4.1 set-up, small).

Same network, data, optimizer and step budget for every method; each method's one hyperparameter
(VSD and MFG: the KL weight, App. I.2; MC dropout: the rate) and the stopping step are chosen on the
validation NLL of a held-out part of the training set, the same protocol and number of candidates
for all. Test error, NLL and ECE from Monte-Carlo predictive samples, mean ± standard error over
seeds (each seed: its own split and init).

    python benchmarks/vsd_digits.py --models mlp     # then --models cnn

``--init iblm`` starts VSD and MFG from :func:`pyro_whvi.iblm_` (MC dropout from a prior draw).

Methods: ``vsd`` (AutoVSDGuide, T reflections), ``vsd-h`` (the same with the hierarchical
prior, §3.3; not in the default list), ``mcd`` (MC dropout: the same network with dropout,
a point estimate under the prior as weight decay, Pyro's AutoDelta), ``mfg`` (AutoNormal).
Writes ``vsd_digits_<models>.json`` / ``.csv`` / ``.md`` / ``.png`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyro
from pyro.infer.autoguide import AutoDelta, AutoNormal, init_to_sample

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, report_saved, save_figure

from pyro_whvi import AutoVSDGuide, iblm_
from pyro_whvi.data import load_digits_split
from pyro_whvi.experiments.methods import predictive_samples
from pyro_whvi.experiments.reporting import save_tables, summarize_by
from pyro_whvi.metrics import categorical_nll, error_rate, expected_calibration_error, reliability_diagram
from pyro_whvi.nn import BayesianCNN, BayesianMLP
from pyro_whvi.train.engine import Minibatches, Schedule
from pyro_whvi.train.selection import holdout, select_best, train_keeping_best

METHODS = ("vsd", "vsd-h", "mcd", "mfg")
MODELS = ("mlp", "cnn")


def make_model(kind: str, dropout: float):
    if kind == "mlp":
        return BayesianMLP([64, 100, 100, 10], likelihood="categorical", dropout=dropout)
    if kind == "cnn":
        return BayesianCNN(dropout=dropout)
    raise ValueError(f"unknown model {kind!r}; choose from {MODELS}")


def make_guide(method: str, model, args):
    if method in ("vsd", "vsd-h"):
        hierarchical = method == "vsd-h"
        return AutoVSDGuide(model, reflections=args.reflections, init_alpha=args.init_alpha, hierarchical=hierarchical)
    if method == "mcd":
        return AutoDelta(model, init_loc_fn=init_to_sample)
    if method == "mfg":
        return AutoNormal(model, init_loc_fn=init_to_sample, init_scale=0.01)
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def fit_candidate(method: str, kind: str, setting: float, data, fit, val, seed: int, args):
    """Train one candidate; its :class:`KeepBest` (best validation NLL's state and step), the model and guide."""
    pyro.set_rng_seed(seed)
    pyro.clear_param_store()
    model = make_model(kind, setting if method == "mcd" else 0.0)
    guide = make_guide(method, model, args)
    x_fit, y_fit = data.x_train[fit], data.y_train[fit]
    num_fit = len(y_fit)
    if args.init == "iblm" and method != "mcd":
        iblm_(guide, (x_fit, y_fit), batch_size=min(128, num_fit), progress=False)

    def validate() -> float:
        logits = predictive_samples(model, guide, data.x_train[val], args.val_samples)
        return -float(categorical_nll(logits, data.y_train[val]))

    schedule = Schedule(args.steps, 0, args.batch_size, args.lr, lr_gamma=0.0, lr_power=0.0)
    keeper = train_keeping_best(
        model,
        guide,
        x_fit,
        y_fit,
        schedule,
        validate,
        args.eval_every,
        kl_weight=args.kl_weight if method == "mcd" else setting,
        warm_up=False,  # the first step sets the guide up, as in a plain SVI loop (the stored results' streams)
        sampler=Minibatches(num_fit, args.batch_size, seed=None),  # the global stream, as the stored results drew
        progress=f"{method}={setting}/{kind}/seed {seed}",
    )
    return keeper, model, guide


def run(method: str, kind: str, seed: int, args) -> tuple[dict, tuple]:
    """Select the method's hyperparameter and stopping step on validation NLL, then evaluate on the test set."""
    data = load_digits_split(seed=seed, images=kind == "cnn")
    fit, val = holdout(len(data.y_train), args.val_fraction, seed)
    settings = args.dropouts if method == "mcd" else args.kl_weights
    start = time.perf_counter()
    chosen = select_best(settings, lambda setting: fit_candidate(method, kind, setting, data, fit, val, seed, args))
    seconds = time.perf_counter() - start
    keeper, setting, model, guide = chosen
    keeper.restore()
    pyro.set_rng_seed(1000 + seed)
    logits = predictive_samples(model, guide, data.x_test, args.samples)
    row = {
        "method": method,
        "model": kind,
        "seed": seed,
        "setting": setting,
        "best_step": keeper.best_step,
        "val_nll": -keeper.best_score,
        "error": float(error_rate(logits, data.y_test)),
        "nll": float(categorical_nll(logits, data.y_test)),
        "ece": float(expected_calibration_error(logits, data.y_test)),
        "train_seconds": seconds,
    }
    return row, reliability_diagram(logits, data.y_test, num_bins=10)


def plot_reliability(diagrams: dict, models: list[str], path: Path) -> bool:
    """Accuracy against confidence per method (seed 0), one panel per network; the diagonal is calibration."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], models):
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="calibrated")
        for (method, model), (confidence, accuracy, count) in diagrams.items():
            if model == kind:
                keep = count > 0
                ax.plot(confidence[keep], accuracy[keep], marker="o", label=method)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_title(f"digits, {kind}: reliability (seed 0)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    return save_figure(fig, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn", help=f"comma separated, from {MODELS}")
    parser.add_argument("--methods", default="vsd,mcd,mfg", help=f"comma separated, from {METHODS}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4000, help="SVI steps per candidate (at most)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--kl-weights", default="0.001,0.003,0.01,0.03", help="candidate KL weights of VSD and MFG")
    parser.add_argument("--kl-weight", type=float, default=0.01, help="KL weight of MC dropout's prior (weight decay)")
    parser.add_argument("--dropouts", default="0.05,0.1,0.2,0.3", help="candidate MC dropout rates")
    parser.add_argument("--val-fraction", type=float, default=0.2, help="part of the training set for selection")
    parser.add_argument("--eval-every", type=int, default=500, help="validation checks (early stopping)")
    parser.add_argument("--val-samples", type=int, default=30)
    parser.add_argument("--reflections", type=int, default=2, help="VSD's T")
    parser.add_argument("--init-alpha", type=float, default=0.05, help="VSD's initial alpha (p / (1 - p))")
    parser.add_argument(
        "--init", choices=("prior", "iblm"), default="prior", help="VSD's and MFG's start: a prior draw or I-BLM"
    )
    parser.add_argument("--samples", type=int, default=100, help="Monte-Carlo samples at test time (paper: 100)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.kl_weights = [float(v) for v in args.kl_weights.split(",")]
    args.dropouts = [float(v) for v in args.dropouts.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    models = [m for m in args.models.split(",") if m]
    rows, diagrams = [], {}
    for kind in models:
        for method in methods:
            for seed in range(args.seeds):
                row, diagram = run(method, kind, seed, args)
                rows.append(row)
                if seed == 0:
                    diagrams[(method, kind)] = diagram
    summary = summarize_by(rows, ("model", "method"), ("error", "nll", "ece", "train_seconds"))
    stem = "vsd_digits_" + "-".join(models)
    lines = [
        f"# digits: {args.seeds} seeds; up to {args.steps} SVI steps of {args.batch_size}; VSD/MFG KL weight from "
        f"{args.kl_weights}, MC dropout rate from {args.dropouts}, and the stopping step, chosen on validation NLL "
        f"({args.val_fraction:.0%} of the training set); {args.samples} test samples",
        "",
        "| model | method | test error | test NLL | ECE | train s |",
        "|---|---|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['model']} | {e['method']} | {e['error']:.4f} ± {e['error_se']:.4f} | {e['nll']:.4f} ± "
            f"{e['nll_se']:.4f} | {e['ece']:.4f} ± {e['ece_se']:.4f} | {e['train_seconds']:.1f} |"
        )
    text = "\n".join(lines)
    config = {k: str(v) for k, v in vars(args).items()}
    save_tables(args.out, stem, {"config": config, "environment": environment(), "summary": summary}, rows, text)
    print(text)
    report_saved(args.out, stem, plot_reliability(diagrams, models, args.out / f"{stem}.png"))


if __name__ == "__main__":
    main()

"""The WHVI paper's GP experiment as a library function: random-feature GPs (mean field, full
covariance, WHVI) vs inducing points at matched parameter counts (NeurIPS 2020, App. D.4, Fig. 13).

Used by ``whvi gp`` and ``benchmarks/gp_rf_vs_inducing.py``; the benchmark script's docstring
describes the protocol. Shape letters: ``D`` WHVI block size, ``N_RF = D^2`` features, ``M``
inducing points.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 and Table 10.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..data.synthetic import SYNTHETIC_FUNCTIONS, make_synthetic_dataset
from ..gp.posteriors import WHVIWeightPosterior
from .baselines import GPyTorchSVGP, inducing_points_for_parameters, initial_inducing_points
from .gp_regressors import GP_SCHEDULE, GPRegressor, RandomFeatureRegressor
from .memory_budget import MAX_STEPS
from .reporting import save_tables

__all__ = ["COVARIANCES", "METHODS", "add_arguments", "finish_arguments", "run", "save", "summarize"]

METHODS = ("rf", "rf-whvi", "svgp-gpytorch", "svgp-gpflow")
COVARIANCES = ("diagonal", "full")
#: the paper's learning rates (App. D.4); hartmann6 uses a larger one
PAPER_LEARNING_RATE = {"hartmann6": 5e-3}
DEFAULT_LEARNING_RATE = 6e-4


def whvi_budget(block: int, covariance: str) -> int:
    return 4 * block if covariance == "diagonal" else 3 * block + block * (block + 1) // 2


def rf_features_for(budget: int, covariance: str) -> int:
    """The most (even) features a Gaussian q(w) can have within ``budget`` parameters."""
    if covariance == "diagonal":
        features = budget // 2
    else:  # F + F(F+1)/2 <= budget
        features = int((-3 + math.sqrt(9 + 8 * budget)) / 2)
    return max(2, features - features % 2)


def build(method: str, covariance: str, block: int, input_dim: int, train_x: torch.Tensor, args) -> GPRegressor:
    budget = whvi_budget(block, covariance)
    if method == "rf-whvi":
        return RandomFeatureRegressor(input_dim, block * block, args.projection, "whvi", covariance, seed=args.seed)
    if method == "rf":
        features = rf_features_for(budget, covariance)
        return RandomFeatureRegressor(input_dim, features, args.projection, "gaussian", covariance, seed=args.seed)
    num_inducing = min(inducing_points_for_parameters(budget, input_dim, covariance), train_x.shape[0])
    inducing = initial_inducing_points(train_x, num_inducing, seed=args.seed)
    if method == "svgp-gpytorch":
        return GPyTorchSVGP(inducing, covariance)
    from .baselines import GPflowSVGP

    return GPflowSVGP(inducing, covariance)


def evaluate(model: GPRegressor, test_x: torch.Tensor, test_y: torch.Tensor) -> tuple[float, float]:
    mean, variance = model.predict(test_x)
    mean, variance = mean.double(), variance.double()
    rmse = (mean - test_y).pow(2).mean().sqrt().item()
    mnll = (0.5 * torch.log(2 * math.pi * variance) + 0.5 * (mean - test_y).pow(2) / variance).mean().item()
    return rmse, mnll


def run(args) -> list[dict]:
    rows = []
    configs = [
        (name, covariance, block, method)
        for name in args.functions
        for covariance in args.covariances
        for block in args.blocks
        for method in args.methods
    ]
    datasets = {}
    for name, covariance, block, method in tqdm(configs, desc="GP runs"):
        if name not in datasets:
            datasets[name] = make_synthetic_dataset(name, num_points=args.num_points, seed=args.seed)
        data = datasets[name]
        input_dim = data.train_x.shape[1]
        torch.manual_seed(args.seed)
        model = build(method, covariance, block, input_dim, data.train_x, args)
        learning_rate = PAPER_LEARNING_RATE.get(name, DEFAULT_LEARNING_RATE) * args.lr_scale
        schedule = dataclasses.replace(
            GP_SCHEDULE,
            steps=args.steps,
            fixed_noise_steps=args.fixed_noise_steps,
            lr=learning_rate,
            batch_size=args.batch_size,
        )
        result = model.fit(data.train_x, data.train_y, schedule, seed=args.seed, progress=args.progress)
        rmse, mnll = evaluate(model, data.test_x, data.test_y)
        rows.append(
            {
                "function": name,
                "covariance": covariance,
                "whvi_block": block,
                "budget": whvi_budget(block, covariance),
                "method": method,
                "parameters": model.num_variational_parameters,
                "size": _size(model),
                "rmse": rmse,
                "mnll": mnll,
                "final_loss": statistics.fmean(result.losses[-50:]),
                "seconds": result.seconds,
                "ms_per_step": 1000 * result.seconds / max(1, args.steps),
            }
        )
        tqdm.write(
            f"{name:10s} {covariance:8s} D={block:3d} {method:14s} params {rows[-1]['parameters']:6d} "
            f"rmse {rmse:.4f} mnll {mnll:8.3f} {result.seconds:6.1f}s"
        )
    return rows


def _size(model: GPRegressor) -> str:
    if isinstance(model, RandomFeatureRegressor):
        weights = model.model.weights
        features = model.model.covar_module.num_features
        return f"N_RF={features}" + (f" (D={weights.latent_dim})" if isinstance(weights, WHVIWeightPosterior) else "")
    return f"M={getattr(model, 'num_inducing', '?')}"


def summarize(rows: list[dict], args) -> str:
    lines = [
        "| function | covariance | D | method | size | params | test RMSE | test MNLL | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['function']} | {row['covariance']} | {row['whvi_block']} | {row['method']} | {row['size']} | "
            f"{row['parameters']} | {row['rmse']:.4f} | {row['mnll']:.3f} | {row['seconds']:.1f} |"
        )
    lines += ["", "RF-WHVI vs RF (Gaussian q(w)) at the same budget, test RMSE (wins / comparisons):", ""]
    for name in args.functions:
        for covariance in args.covariances:
            wins = total = 0
            for block in args.blocks:
                pick = {
                    r["method"]: r
                    for r in rows
                    if r["function"] == name and r["covariance"] == covariance and r["whvi_block"] == block
                }
                if "rf" in pick and "rf-whvi" in pick:
                    total += 1
                    wins += pick["rf-whvi"]["rmse"] < pick["rf"]["rmse"]
            if total:
                lines.append(f"- {name}, {covariance}: RF-WHVI better in {wins}/{total}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, args) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [(c, metric) for c in args.covariances for metric in ("rmse", "mnll")]
    fig, axes = plt.subplots(
        len(panels), len(args.functions), figsize=(3.2 * len(args.functions), 2.6 * len(panels)), squeeze=False
    )
    for i, (covariance, metric) in enumerate(panels):
        for j, name in enumerate(args.functions):
            ax = axes[i][j]
            for method in args.methods:
                points = sorted(
                    (r["parameters"], r[metric])
                    for r in rows
                    if r["function"] == name and r["covariance"] == covariance and r["method"] == method
                )
                if points:
                    dashed = method == "svgp-gpflow"  # drawn over GPyTorch's SVGP, which it matches
                    style = {"linestyle": "--", "marker": "x"} if dashed else {"marker": "o"}
                    ax.plot(*zip(*points), label=method, **style)
            ax.set_xscale("log", base=2)
            if metric == "rmse":
                ax.set_yscale("log")
            ax.set_title(f"{name} ({covariance})", fontsize=9)
            ax.set_xlabel("variational parameters", fontsize=8)
            ax.set_ylabel(f"test {metric.upper()}", fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def add_arguments(parser: argparse.ArgumentParser, default_out: Path) -> None:
    """The experiment's options (shared by ``whvi gp`` and the benchmark script)."""
    parser.add_argument("--functions", default=",".join(SYNTHETIC_FUNCTIONS), help="comma-separated function names")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from {','.join(METHODS)}")
    parser.add_argument("--covariances", default=",".join(COVARIANCES), help="diagonal and/or full")
    parser.add_argument("--blocks", default="8,16,32", help="WHVI sizes D (N_RF = D^2), comma-separated")
    parser.add_argument("--quick", action="store_true", help="at most 10,000 points, 3,000 steps (lr x4)")
    parser.add_argument("--num-points", type=int, default=None, help="points per function (default: the paper's)")
    parser.add_argument("--steps", type=int, default=None, help="Adam steps (default 12,000; quick 3,000)")
    parser.add_argument("--fixed-noise-steps", type=int, default=None, help="default: the first 5/6 of the steps")
    parser.add_argument("--lr-scale", type=float, default=None, help="multiplies the paper's lr (default 1; quick 4)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--projection", default="sorf", choices=("dense", "fastfood", "sorf"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", action="store_true", help="a progress bar per training run")
    parser.add_argument("--out", type=Path, default=default_out, help=f"output folder (default {default_out})")
    parser.add_argument("--stem", default="gp_rf_vs_inducing", help="file name stem of the outputs")


def finish_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Split the lists, check every value (``parser.error`` on a bad one) and fill the schedule defaults."""
    # Each name once: a repeated one would train and report the same run twice.
    args.functions = list(dict.fromkeys(f for f in args.functions.split(",") if f))
    args.methods = list(dict.fromkeys(m for m in args.methods.split(",") if m))
    args.covariances = list(dict.fromkeys(c for c in args.covariances.split(",") if c))
    try:
        args.blocks = list(dict.fromkeys(int(b) for b in args.blocks.split(",") if b))
    except ValueError:
        parser.error(f"--blocks must be comma-separated powers of two, got {args.blocks!r}")
    for value, valid, flag in (
        (args.functions, tuple(SYNTHETIC_FUNCTIONS), "--functions"),
        (args.methods, METHODS, "--methods"),
        (args.covariances, COVARIANCES, "--covariances"),
    ):
        unknown = sorted(set(value) - set(valid))
        if unknown or not value:
            parser.error(f"{flag}: unknown {unknown}; choose from {list(valid)}")
    if not args.blocks or any(b < 2 or b & (b - 1) for b in args.blocks):
        parser.error(f"--blocks must be powers of two >= 2, got {args.blocks}")
    for name in ("num_points", "steps", "fixed_noise_steps", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "fixed_noise_steps" else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    for name in ("steps", "fixed_noise_steps"):
        if (getattr(args, name) or 0) > MAX_STEPS:
            parser.error(f"--{name.replace('_', '-')}: at most {MAX_STEPS:,} steps expected, got {getattr(args, name)}")
    if args.num_points is not None and args.num_points < 3:
        parser.error(f"--num-points: at least 3 expected (a fifth held out leaves 1 test and 2 training points), "
                     f"got {args.num_points}")  # fmt: skip
    if args.lr_scale is not None and not 0 < args.lr_scale < math.inf:
        parser.error(f"--lr-scale must be a positive number, got {args.lr_scale}")
    if not 0 <= args.seed < 2**32:
        parser.error(f"--seed must be in [0, 2**32) (numpy's seeds), got {args.seed}")
    if args.quick:
        args.num_points = args.num_points or 10000
    args.steps = args.steps if args.steps is not None else (3000 if args.quick else 12000)
    if args.fixed_noise_steps is None:
        args.fixed_noise_steps = args.steps * 5 // 6
    if args.lr_scale is None:
        args.lr_scale = 4.0 if args.quick else 1.0
    return args


def save(rows: list[dict], args: argparse.Namespace, meta: dict) -> str:
    """Write ``<stem>.{json,csv,md,png}`` to ``args.out``; returns the markdown summary."""
    text = summarize(rows, args)
    save_tables(args.out, args.stem, meta, rows, text)
    plot(rows, args.out / f"{args.stem}.png", args)
    return text

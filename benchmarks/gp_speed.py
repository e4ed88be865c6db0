"""Speed of random-feature GPs: structured (Fastfood, SORF) vs dense features, and RF-WHVI vs SVGP steps.

Two measurements, each a ratio against a baseline timed in the same process:

1. **Features.** ``RandomFeatureKernel.featurize`` for ``N_RF = 2m`` features of ``N`` inputs of
   dimension ``d``: dense projection (an ``N x d x m`` matmul) vs Fastfood and SORF (FWHTs,
   ``O(N m log P)``), forward and forward + backward.
2. **Training steps.** One Adam step (minibatch ELBO, backward, update) of RF-WHVI with
   ``N_RF = D^2`` features vs GPyTorch's whitened SVGP with the number of inducing points matched
   to RF-WHVI's variational parameter count (rounded up), for each covariance setting.

Times are medians of ``--repeats`` runs of ``--iterations`` calls after a warm-up.

    python benchmarks/gp_speed.py --iterations 40 --repeats 7   # float32, as in docs/results/gp.md
    python benchmarks/gp_speed.py --quick                        # fewer sizes and repeats
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 \
        python benchmarks/gp_speed.py --stem gp_speed_malloc_tuned # glibc keeps freed blocks

The steps are timed first, before the feature timings free large blocks and so move glibc's
thresholds; with the defaults, the largest steps spend a measurable share of their time faulting
freshly returned memory back in, which the second command removes for every method alike.

Writes ``gp_speed.{json,csv,md,png}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, report_saved, save_figure, save_tables

from pyro_whvi.experiments.baselines import GPyTorchSVGP, inducing_points_for_parameters, initial_inducing_points
from pyro_whvi.experiments.gp_regressors import RandomFeatureRegressor
from pyro_whvi.gp import RandomFeatureKernel
from pyro_whvi.train.engine import Schedule

PROJECTIONS = ("dense", "fastfood", "sorf")


def median_ms(fn: Callable[[], object], iterations: int, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        times.append((time.perf_counter() - start) / iterations)
    return 1000 * statistics.median(times)


def feature_rows(args) -> list[dict]:
    rows = []
    for num_dims in tqdm(args.dims, desc="features"):
        x = torch.rand(args.num_points, num_dims, dtype=args.dtype)
        timings = {}
        for projection in PROJECTIONS:
            kernel = RandomFeatureKernel(args.num_features // 2, projection, num_dims=num_dims, seed=0).to(args.dtype)

            def forward(kernel=kernel, x=x):
                with torch.no_grad():
                    return kernel.featurize(x)

            def backward(kernel=kernel, x=x):
                kernel.zero_grad()
                kernel.featurize(x).sum().backward()

            timings[projection] = (
                median_ms(forward, args.iterations, args.repeats),
                median_ms(backward, args.iterations, args.repeats),
            )
        for projection in PROJECTIONS:
            rows.append(
                {
                    "d": num_dims,
                    "projection": projection,
                    "forward_ms": timings[projection][0],
                    "forward_backward_ms": timings[projection][1],
                    "dense_over_this_forward": timings["dense"][0] / timings[projection][0],
                    "dense_over_this_forward_backward": timings["dense"][1] / timings[projection][1],
                }
            )
    return rows


def step_ms(model, x: torch.Tensor, y: torch.Tensor, args) -> float:
    schedule = Schedule(steps=args.iterations, fixed_noise_steps=0, lr=1e-3, lr_power=0.0, batch_size=args.batch_size)
    model.fit(x, y, schedule)  # warm-up
    return statistics.median(1000 * model.fit(x, y, schedule).seconds / args.iterations for _ in range(args.repeats))


def step_rows(args) -> list[dict]:
    rows = []
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(4 * args.batch_size, args.step_dim, generator=generator, dtype=args.dtype)
    y = torch.sin(3 * x).sum(-1)
    for covariance in ("diagonal", "full"):
        for block in tqdm(args.blocks, desc=f"steps ({covariance})"):
            whvi = {
                projection: RandomFeatureRegressor(
                    args.step_dim, block * block, projection, "whvi", covariance, dtype=args.dtype
                )
                for projection in args.step_projections
            }
            budget = next(iter(whvi.values())).num_variational_parameters
            num_inducing = inducing_points_for_parameters(budget, args.step_dim, covariance)
            svgp = GPyTorchSVGP(initial_inducing_points(x, num_inducing, seed=0), covariance)
            svgp_ms = step_ms(svgp, x, y, args)
            for projection, model in whvi.items():
                whvi_ms = step_ms(model, x, y, args)
                rows.append(
                    {
                        "covariance": covariance,
                        "D": block,
                        "N_RF": block * block,
                        "projection": projection,
                        "parameters": budget,
                        "M": num_inducing,
                        "svgp_parameters": svgp.num_variational_parameters,
                        "rf_whvi_ms": whvi_ms,
                        "svgp_ms": svgp_ms,
                        "svgp_over_rf_whvi": svgp_ms / whvi_ms,
                    }
                )
    return rows


def summarize(features: list[dict], steps: list[dict], args) -> str:
    lines = [
        f"Features: N = {args.num_points} inputs, N_RF = {args.num_features}, {args.dtype}; "
        "ratio = dense time / this time (> 1: faster than dense).",
        "",
        "| d | projection | forward ms | fwd+bwd ms | dense / this (fwd) | dense / this (fwd+bwd) |",
        "|---|---|---|---|---|---|",
    ]
    for r in features:
        lines.append(
            f"| {r['d']} | {r['projection']} | {r['forward_ms']:.2f} | {r['forward_backward_ms']:.2f} | "
            f"{r['dense_over_this_forward']:.2f} | {r['dense_over_this_forward_backward']:.2f} |"
        )
    lines += [
        "",
        f"Training steps: batch {args.batch_size}, d = {args.step_dim}, RF-WHVI with each feature projection; "
        "ratio = SVGP time / RF-WHVI time (> 1: RF-WHVI faster).",
        "",
        "| covariance | D | N_RF | features | RF-WHVI params | SVGP M (params) | RF-WHVI ms | SVGP ms "
        "| SVGP / RF-WHVI |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in steps:
        lines.append(
            f"| {r['covariance']} | {r['D']} | {r['N_RF']} | {r['projection']} | {r['parameters']} | "
            f"{r['M']} ({r['svgp_parameters']}) | {r['rf_whvi_ms']:.2f} | {r['svgp_ms']:.2f} | "
            f"{r['svgp_over_rf_whvi']:.2f} |"
        )
    return "\n".join(lines)


def plot(features: list[dict], steps: list[dict], args, path: Path) -> bool:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for projection in ("fastfood", "sorf"):
        points = [(r["d"], r["dense_over_this_forward_backward"]) for r in features if r["projection"] == projection]
        left.plot(*zip(*points), marker="o", label=projection)
    left.axhline(1.0, color="gray", linestyle="--", label="dense")
    left.set(xscale="log", yscale="log", xlabel="input dimension d", ylabel="dense time / structured time")
    left.set_title("features, forward + backward")
    for covariance in ("diagonal", "full"):
        for projection in args.step_projections:
            points = [
                (r["parameters"], r["svgp_over_rf_whvi"])
                for r in steps
                if r["covariance"] == covariance and r["projection"] == projection
            ]
            right.plot(*zip(*points), marker="o", label=f"{covariance}, {projection} features")
    right.axhline(1.0, color="gray", linestyle="--")
    right.set(xscale="log", yscale="log", xlabel="variational parameters", ylabel="SVGP step / RF-WHVI step")
    right.set_title("training step at matched parameters")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return save_figure(fig, path)


def parse(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    parser.add_argument("--dims", default=None, help="input dimensions for the feature timing")
    parser.add_argument("--num-features", type=int, default=4096, help="N_RF for the feature timing")
    parser.add_argument("--num-points", type=int, default=1024, help="N inputs for the feature timing")
    parser.add_argument("--blocks", default=None, help="WHVI sizes D for the step timing")
    parser.add_argument("--step-dim", type=int, default=8, help="input dimension for the step timing")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--step-projections", default="dense,sorf", help="feature projections for RF-WHVI steps")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--stem", default="gp_speed")
    args = parser.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    args.dims = [int(v) for v in (args.dims or ("8,256,1024" if args.quick else "8,64,256,512,1024,2048")).split(",")]
    args.blocks = [int(v) for v in (args.blocks or ("8,32" if args.quick else "8,16,32,64")).split(",")]
    args.iterations = args.iterations or (5 if args.quick else 20)
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.step_projections = args.step_projections.split(",")
    if unknown := set(args.step_projections) - set(PROJECTIONS):
        parser.error(f"--step-projections: unknown {sorted(unknown)}; choose from {PROJECTIONS}")
    if args.num_features % 2:
        parser.error(f"--num-features must be even, got {args.num_features}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # Steps first, in the allocator state of a fresh process: the feature timings free large blocks, which
    # moves glibc's mmap/trim thresholds and would make the later steps look faster than a user sees them.
    steps = step_rows(args)
    features = feature_rows(args)
    text = summarize(features, steps, args)
    print("\n" + text)
    meta = {"config": {k: str(v) for k, v in vars(args).items()}, "environment": environment()}
    rows = [{"kind": "features", **r} for r in features] + [{"kind": "step", **r} for r in steps]
    keys = sorted({k for r in rows for k in r})
    save_tables(args.out, args.stem, meta, [{k: r.get(k, "") for k in keys} for r in rows], text)
    report_saved(args.out, args.stem, plot(features, steps, args, args.out / f"{args.stem}.png"))


if __name__ == "__main__":
    main()

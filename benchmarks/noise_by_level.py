"""Where a model's distance to the noise floor lies, by the noise level of the test rows (issue 49, item 5).

On a folder written by ``whvi synthetic --noise-profile ramp`` (one true :math:`\\sigma(x)` per row in
``noise_std.txt``) this trains each method as ``whvi uci`` does (the same seed, protocol and likelihood), draws
``--samples`` predictive samples of the test rows, sorts the rows by their true :math:`\\sigma(x)` into
``--bins`` equal groups, and reports per group, each over the group's mean :math:`\\sigma(x)^2`:

* ``mnll_above_floor``: the predictive mixture's MNLL minus the floor's, :math:`\\tfrac12\\log(2\\pi\\sigma(x)^2)
  + \\tfrac12` (the group's share of the split's MNLL - floor: their mean is the split's);
* ``noise2``: the mean over draws of the predicted noise variance (a head's, or the one learned scale's square);
* ``var_f``: the variance of ``f`` over the posterior draws (what the posterior is unsure of);
* ``error2``: the squared error of the posterior mean of ``f`` (how far the mean is from the targets);
* ``noise_cv``: the head's standard deviation over draws over its mean (0 for one noise scale).

A calibrated predictive has ``noise2 + var_f`` near ``error2``, and an exact one has ``error2`` near 1. Usage::

    python benchmarks/noise_by_level.py --data-dir /tmp/syn49/ramp/hartmann4 --methods whvi,mcd \\
        --protocol table3 --likelihood heteroscedastic --out benchmarks/results/analogues/power_like_heteroscedastic
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, save_tables

from pyro_whvi.experiments.methods import parse_method
from pyro_whvi.experiments.noisy_sets import noise_floor, split_noise_std
from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.experiments.uci_data import check_source, dataset_name, load_dataset_split, parse_splits
from pyro_whvi.experiments.uci_protocols import REGRESSION_LIKELIHOODS, UCI_PROTOCOLS
from pyro_whvi.experiments.uci_train import predict_split, train_split
from pyro_whvi.metrics import gaussian_mnll


def by_level(f: torch.Tensor, noise: torch.Tensor, y: torch.Tensor, sigma: torch.Tensor, bins: int) -> list[dict]:
    """The module's numbers for the predictive draws ``f``, ``noise`` (``(S, N)``, or a scalar noise) on targets
    ``y`` with true noise ``sigma`` (``(N,)``), per group of rows by ``sigma``, lowest first; all in ``y``'s units."""
    f, y, sigma = f.double(), y.double(), sigma.double()
    noise = noise.double().expand_as(f)
    groups = []
    for level, rows in enumerate(sigma.argsort().chunk(bins)):
        true2 = sigma[rows].pow(2).mean()
        mean_noise = noise[:, rows].mean(0)
        groups.append(
            {
                "level": level,
                "sigma": sigma[rows].mean().item(),
                "mnll_above_floor": gaussian_mnll(f[:, rows], noise[:, rows], y[rows])
                - noise_floor(sigma[rows].numpy())["mnll_floor"],
                "noise2": (noise[:, rows].pow(2).mean() / true2).item(),
                "var_f": (f[:, rows].var(0).mean() / true2).item(),
                "error2": ((y[rows] - f[:, rows].mean(0)).pow(2).mean() / true2).item(),
                "noise_cv": (noise[:, rows].std(0) / mean_noise).mean().item(),
            }
        )
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="a folder written by whvi synthetic --noise-profile ramp")
    parser.add_argument("--methods", default="whvi,mcd")
    parser.add_argument("--protocol", default="table3", choices=sorted(UCI_PROTOCOLS))
    parser.add_argument("--likelihood", default="heteroscedastic", choices=REGRESSION_LIKELIHOODS)
    parser.add_argument("--splits", type=parse_splits, default=(0,), help="e.g. 0-4 (default 0)")
    parser.add_argument("--bins", type=int, default=3, help="groups of test rows by their true noise (default 3)")
    parser.add_argument("--samples", type=int, default=256, help="posterior draws per test row (default 256)")
    parser.add_argument("--steps", type=int, default=None, help="SVI steps (default: the protocol's)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if args.bins < 1 or args.samples < 2:
        parser.error(f"--bins expected >= 1 and --samples >= 2, got {args.bins} and {args.samples}")
    splits = args.splits
    try:
        check_source(args.data_dir, splits)
        sigmas = split_noise_std(args.data_dir, splits)
    except (ValueError, FileNotFoundError) as error:
        parser.error(f"--data-dir: {error}")
    if not sigmas or not isinstance(next(iter(sigmas.values())), np.ndarray):
        parser.error(
            f"--data-dir {args.data_dir}: needs one noise value per row in noise_std.txt; write the folder with "
            "whvi synthetic --noise-profile ramp"
        )
    torch.set_num_threads(1)
    name = dataset_name(args.data_dir)
    configs = {
        method: UCIConfig.from_protocol(
            args.protocol, name, steps=args.steps, methods=(method,), likelihood=args.likelihood, samples=args.samples
        )
        for method in args.methods.split(",")
    }
    rows = []
    for split in splits:
        data = load_dataset_split(args.data_dir, split)
        for method, config in configs.items():
            trained = train_split(args.data_dir, parse_method(method), split, config, data=data)
            f, noise = predict_split(trained, data.x_test, config)
            assert noise is not None  # a regression set
            sigma = torch.as_tensor(sigmas[split]) / data.y_scale  # the targets are standardized
            for group in by_level(f, noise, data.y_test, sigma, args.bins):
                rows.append({"method": method, "split": split, **group, "seconds": trained.seconds})
    lines = [
        f"### {name}: {args.protocol}, {args.likelihood} likelihood, test rows in {args.bins} groups by true noise",
        "",
        "each over the group's mean sigma(x)^2 but the MNLL; mean over draws of the noise variance, the variance of "
        "f over draws, the squared error of f's posterior mean",
        "",
        "| method | split | group (lowest noise first) | MNLL - floor | noise^2 | Var f | error^2 of the mean | "
        "head's CV over draws |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['split']} | {r['level']} | {r['mnll_above_floor']:.3f} | {r['noise2']:.3f} | "
            f"{r['var_f']:.3f} | {r['error2']:.3f} | {r['noise_cv']:.3f} |"
        )
    text = "\n".join(lines)
    print(text)
    stem = f"noise_by_level_{name}_{args.protocol}_{args.likelihood}"
    meta = environment(data_dir=str(args.data_dir), splits=splits, samples=args.samples, bins=args.bins)
    args.out.mkdir(parents=True, exist_ok=True)
    save_tables(args.out, stem, meta, rows, text)
    print(f"\nsaved {args.out / stem}.{{json,csv,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""WHVI vs mean-field VI on UCI regression splits (WHVI paper §3.2, Table 3 set-up, shortened).

Trains a Bayesian MLP (default 2 x 128 ReLU, N(0, 1/fan_in) weight priors, learned noise scale) with Pyro's SVI under
``AutoWHVIGuide`` (WHVI, NF-WHVI) and ``AutoNormal`` with the same network, steps and learning
rate, and reports test RMSE and MNLL (64 posterior samples) in the targets' original units.

    python benchmarks/uci_regression.py --data-dir ../shared/datasets/uci/yacht --splits 5

Writes ``uci_<dataset>.json`` and ``.md`` to ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import cast

import pyro
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_sample
from tqdm import tqdm

from pyro_whvi import AutoWHVIGuide
from pyro_whvi.data import gaussian_mnll, load_uci_split, num_uci_splits, rmse
from pyro_whvi.models import BayesianMLP

METHODS = ("whvi", "nf-whvi", "mean-field")


def make_guide(method: str, model: BayesianMLP):
    if method == "whvi":
        return AutoWHVIGuide(model)
    if method == "nf-whvi":
        return AutoWHVIGuide(model, flows=5)
    if method == "mean-field":
        # AutoWHVIGuide's mean-field init (a prior draw, sd 0.1 of the fan-in prior's ~0.1): the same start.
        return AutoNormal(model, init_loc_fn=init_to_sample, init_scale=0.01)
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def run_split(method: str, data_dir: Path, split: int, args) -> dict:
    pyro.set_rng_seed(split)
    pyro.clear_param_store()
    data = load_uci_split(data_dir, split)
    widths = [data.x_train.shape[1], *([args.hidden] * args.layers), 1]
    model = BayesianMLP(widths, noise_scale=args.noise_scale)
    guide = make_guide(method, model)
    svi_model = guide.model if isinstance(guide, AutoWHVIGuide) else model
    decay = (args.final_lr / args.lr) ** (1.0 / args.steps)
    optim = pyro.optim.ClippedAdam({"lr": args.lr, "lrd": decay, "clip_norm": 10.0})
    svi = SVI(svi_model, guide, optim, Trace_ELBO())
    start = time.perf_counter()
    progress = tqdm(range(args.steps), desc=f"{method} split {split}", leave=False, mininterval=1.0)
    for _ in progress:
        loss = svi.step(data.x_train, data.y_train)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        predictive = Predictive(svi_model, guide=guide, num_samples=args.samples, return_sites=["f"])
        f = predictive(data.x_test)["f"].reshape(args.samples, -1)
        noise = cast(torch.Tensor, model.noise_scale).detach()
    num_params = sum(p.numel() for p in guide.parameters())
    return {
        "method": method,
        "split": split,
        "rmse": rmse(f, data.y_test) * data.y_std,
        "mnll": gaussian_mnll(f, noise, data.y_test) + math.log(data.y_std),
        "final_loss": loss,
        "variational_parameters": num_params,
        "train_seconds": seconds,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="a UCI dataset directory in the split format")
    parser.add_argument("--splits", type=int, default=5, help="use the first N splits")
    parser.add_argument("--methods", default="whvi,mean-field", help=f"comma separated, from {METHODS}")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--final-lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--noise-scale", type=float, default=0.1, help="initial noise std (standardized units)")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    available = num_uci_splits(args.data_dir)
    splits = range(min(args.splits, available))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    rows = [run_split(method, args.data_dir, split, args) for method in methods for split in tqdm(splits, desc=method)]
    name = args.data_dir.name
    summary = []
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        entry = {"method": method, "parameters": mine[0]["variational_parameters"]}
        for metric in ("rmse", "mnll"):
            values = [r[metric] for r in mine]
            entry[metric] = statistics.mean(values)
            entry[metric + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
        summary.append(entry)
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: str(v) for k, v in vars(args).items()}
    (args.out / f"uci_{name}.json").write_text(
        json.dumps({"config": config, "rows": rows, "summary": summary}, indent=2)
    )
    lines = [
        f"# {name}: first {len(splits)} splits, {args.layers}x{args.hidden} ReLU, {args.steps} full-batch SVI steps",
        "",
        "| method | variational params | test RMSE | test MNLL |",
        "|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['method']} | {e['parameters']} | {e['rmse']:.3f} ± {e['rmse_std']:.3f} | "
            f"{e['mnll']:.3f} ± {e['mnll_std']:.3f} |"
        )
    (args.out / f"uci_{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The WHVI paper's 1-D toy problem (§3.1, Fig. 4): predictive bands of WHVI, NF-WHVI and mean-field VI.

A 2 x 128 cosine network (``BayesianMLP``, fixed noise sd ``exp(-1.5)``) is fitted to 128 points on
[-1, 2] with a gap, by Pyro's SVI with the same steps and learning rate under

* ``AutoWHVIGuide(model, expose="all")``: every weight and bias under WHVI (vectors reshaped, §2.5);
* ``AutoWHVIGuide(model, expose="all", flows=3)``: NF-WHVI;
* ``AutoNormal(model)``: mean-field Gaussian.

It saves ``toy_regression.png`` (mean, 50% and 95% bands of f, data, true function, the gap shaded)
and ``toy_regression.json`` (RMSE to the true function, mean predictive variance on the data and in
the gap, parameter counts) in ``--out``.

    python benchmarks/toy_regression.py              # 4000 steps per guide, a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pyro
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_sample
from tqdm import tqdm

from pyro_whvi import AutoWHVIGuide
from pyro_whvi.data import TOY_GAP, TOY_NOISE_SCALE, toy_function, toy_regression_1d
from pyro_whvi.models import BayesianMLP

METHODS: dict[str, dict[str, Any] | None] = {
    "WHVI": {"expose": "all"},
    "NF-WHVI": {"expose": "all", "flows": 3},
    "mean-field": None,
}


def fit(name: str, steps: int, x: torch.Tensor, y: torch.Tensor, grid: torch.Tensor, samples: int) -> dict:
    pyro.set_rng_seed(1)
    pyro.clear_param_store()
    model = BayesianMLP([1, 128, 128, 1], activation=torch.cos, noise_scale=TOY_NOISE_SCALE, learn_noise=False)
    kwargs = METHODS[name]
    if kwargs is None:
        guide: AutoNormal | AutoWHVIGuide = AutoNormal(model, init_loc_fn=init_to_sample, init_scale=0.01)
    else:
        guide = AutoWHVIGuide(model, **kwargs)
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": 0.01, "lrd": 0.1 ** (1 / steps)}), Trace_ELBO())
    for _ in tqdm(range(steps), desc=name, mininterval=1.0):
        svi.step(x, y)
    with torch.no_grad():
        f = Predictive(model, guide=guide, num_samples=samples, return_sites=["f"])(torch.cat([x, grid]))["f"]
    f = f.reshape(samples, -1)
    on_data, on_grid = f[:, : len(y)], f[:, len(y) :]
    in_gap = (grid[:, 0] > TOY_GAP[0]) & (grid[:, 0] < TOY_GAP[1])
    return {
        "rmse_to_truth": float((on_data.mean(0) - toy_function(x[:, 0])).pow(2).mean().sqrt()),
        "variance_on_data": float(on_data.var(0).mean()),
        "variance_in_gap": float(on_grid[:, in_gap].var(0).mean()),
        "variational_parameters": sum(p.numel() for p in guide.parameters()),
        "grid_samples": on_grid,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    torch.set_default_dtype(torch.float64)
    x, y = toy_regression_1d(128, seed=0)
    grid = torch.linspace(-1.5, 2.5, 201).unsqueeze(-1)
    results = {name: fit(name, args.steps, x, y, grid, args.samples) for name in METHODS}
    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), sharey=True)
    for axis, (name, result) in zip(axes, results.items()):
        f = result.pop("grid_samples")
        low95, low50, mid, high50, high95 = torch.quantile(f, torch.tensor([0.025, 0.25, 0.5, 0.75, 0.975]), dim=0)
        axis.axvspan(*TOY_GAP, color="0.92")
        axis.fill_between(grid[:, 0], low95, high95, alpha=0.25, color="C0", label="95%")
        axis.fill_between(grid[:, 0], low50, high50, alpha=0.4, color="C0", label="50%")
        axis.plot(grid[:, 0], mid, color="C0", label="median")
        axis.plot(grid[:, 0], toy_function(grid[:, 0]), "k--", lw=1, label="truth")
        axis.scatter(x[:, 0], y, s=6, color="C3", label="data")
        axis.set_title(f"{name} ({result['variational_parameters']} params, RMSE {result['rmse_to_truth']:.3f})")
        axis.set_ylim(-3, 3)
    axes[0].legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out / "toy_regression.png", dpi=120)
    (args.out / "toy_regression.json").write_text(json.dumps({"steps": args.steps, "results": results}, indent=2))
    for name, result in results.items():
        print(name, {key: round(value, 4) for key, value in result.items()})


if __name__ == "__main__":
    main()

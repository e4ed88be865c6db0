"""What other learners reach on a set with a known noise floor (issue 28): is a gap the data's or the model's?

On a folder written by ``whvi synthetic`` (its ``noise_std.txt`` gives the true :math:`\\sigma`) this fits, per
split, four learners that share nothing with WHVI and reports each one's test ``RMSE / sigma``,
``MNLL - floor`` and predictive noise ``/ sigma``, the numbers ``whvi uci --data-dir`` reports:

* ``quadratic``: least squares on every input and its square, a smooth, additive baseline;
* ``additive``: ridge regression on a piecewise-linear basis of ``K`` evenly spaced knots per input (a sum of
  one-input functions of any shape), ``K`` chosen from 10 to 320 on a validation tenth of the training rows;
* ``mlp``: a plain ReLU network (``--mlp-layers`` x ``--mlp-width``) fitted by least squares with Adam
  (1e-3, cosine decay, batch 256) for ``--mlp-epochs``, stopped at the epoch of lowest validation RMSE
  (``mlp_last``: the last epoch);
* ``gp``: an exact GP with an ARD RBF kernel (GPyTorch) on the first ``--gp-rows`` training rows, its
  hyperparameters fitted to the marginal likelihood of the first ``--gp-fit-rows`` of them (default: all) from
  three initial length scales, the best kept.

The point predictors' predictive noise is their validation RMSE. Inputs and targets are standardized with the
training statistics, as in ``whvi uci``. Usage::

    python benchmarks/synthetic_learnability.py --data-dir synbench/rastrigin5 --splits 0-4 \\
        --out benchmarks/results/synthetic_learnability
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import gpytorch
import torch
from _results import environment, save_tables
from tqdm import tqdm

from pyro_whvi.experiments.noisy_sets import noise_floor, read_noise_std
from pyro_whvi.experiments.reporting import summarize_by
from pyro_whvi.experiments.uci_data import check_source, dataset_name, load_dataset_split, parse_splits
from pyro_whvi.metrics import gaussian_mnll

KNOTS = (10, 20, 40, 80, 160, 320)
RIDGE = 1e-3  # on standardized targets: keeps the normal equations well posed, negligible beside 16k rows
GP_LENGTHSCALES = (1.0, 0.3, 0.1)
GP_STEPS = 80
Prediction = tuple[torch.Tensor, torch.Tensor, float]  # test mean, test predictive std, the learned noise std


def least_squares(features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    gram = features.T @ features + RIDGE * torch.eye(features.shape[1], dtype=features.dtype)
    return torch.linalg.solve(gram, features.T @ y)


def with_validation(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The first nine tenths of the training rows to fit, the last tenth to validate (rows are in random order)."""
    cut = len(x) - len(x) // 10
    return x[:cut], y[:cut], x[cut:], y[cut:]


def rms(error: torch.Tensor) -> torch.Tensor:
    return error.pow(2).mean().sqrt()


def quadratic(x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor) -> Prediction:
    def features(z: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.ones(len(z), 1, dtype=z.dtype), z, z**2], 1)

    x_fit, y_fit, x_val, y_val = with_validation(x, y)
    weights = least_squares(features(x_fit), y_fit)
    noise = rms(features(x_val) @ weights - y_val)
    return features(x_test) @ weights, noise.expand(len(x_test)), float(noise)


def additive(x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor) -> Prediction:
    low, high = x.min(0).values, x.max(0).values

    def features(z: torch.Tensor, knots: int) -> torch.Tensor:
        grid = low + (high - low) * torch.linspace(0, 1, knots, dtype=z.dtype)[:, None]  # (K, D)
        hats = (1 - (z[:, None, :] - grid).abs() / ((high - low) / (knots - 1))).clamp(min=0)
        return torch.cat([torch.ones(len(z), 1, dtype=z.dtype), hats.reshape(len(z), -1)], 1)

    x_fit, y_fit, x_val, y_val = with_validation(x, y)
    scores = {k: float(rms(features(x_val, k) @ least_squares(features(x_fit, k), y_fit) - y_val)) for k in KNOTS}
    knots = min(scores, key=scores.__getitem__)
    weights = least_squares(features(x_fit, knots), y_fit)
    noise = scores[knots]
    return features(x_test, knots) @ weights, torch.tensor(noise, dtype=x.dtype).expand(len(x_test)), noise


def mlp(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor) -> dict[str, Prediction]:
    x_fit, y_fit, x_val, y_val = with_validation(x.float(), y.float())
    layers: list[torch.nn.Module] = []
    width_in = x.shape[1]
    for _ in range(args.mlp_layers):
        layers += [torch.nn.Linear(width_in, args.mlp_width, dtype=torch.float32), torch.nn.ReLU()]
        width_in = args.mlp_width
    net = torch.nn.Sequential(*layers, torch.nn.Linear(width_in, 1, dtype=torch.float32))
    batches = math.ceil(len(x_fit) / 256)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.mlp_epochs * batches)
    best: tuple[float, Prediction] = (math.inf, (x_test[:, 0], x_test[:, 0], math.nan))
    for _ in tqdm(range(args.mlp_epochs), desc="mlp epochs", leave=False):
        for batch in torch.randperm(len(x_fit)).split(256):
            loss = (net(x_fit[batch]).squeeze(-1) - y_fit[batch]).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        with torch.no_grad():
            noise = float(rms(net(x_val).squeeze(-1) - y_val))
            mean = net(x_test.float()).squeeze(-1).double()
            last = (mean, torch.tensor(noise, dtype=x.dtype).expand(len(x_test)), noise)
        if noise < best[0]:
            best = (noise, last)
    return {"mlp": best[1], "mlp_last": last}


class ExactRBF(gpytorch.models.ExactGP):
    def __init__(self, x: torch.Tensor, y: torch.Tensor, likelihood: gpytorch.likelihoods.GaussianLikelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[1]))

    def forward(self, z: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))


def fit_exact_gp(x: torch.Tensor, y: torch.Tensor, lengthscales: tuple[float, ...] = GP_LENGTHSCALES) -> ExactRBF:
    """An :class:`ExactRBF` on ``x, y`` (float64), its hyperparameters fitted to their marginal likelihood by Adam
    from each initial length scale; the one with the lowest negative log marginal likelihood at its last step."""
    fits = []
    with gpytorch.settings.max_cholesky_size(len(x) + 1):  # exact: Cholesky, not conjugate gradients
        for lengthscale in lengthscales:
            model = ExactRBF(x, y, gpytorch.likelihoods.GaussianLikelihood().double()).double()
            model.covar_module.base_kernel.lengthscale = lengthscale
            model.likelihood.noise = 0.05
            marginal = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
            optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
            model.train()
            for _ in tqdm(range(GP_STEPS), desc=f"gp, length scale {lengthscale}", leave=False):
                optimizer.zero_grad()
                loss = -marginal(model(x), y)
                loss.backward()
                optimizer.step()
            fits.append((float(loss.detach()), lengthscale, model))
    return min(fits, key=lambda fit: fit[:2])[2]


def exact_gp(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, x_test: torch.Tensor) -> Prediction:
    """Hyperparameters from the first ``--gp-fit-rows`` training rows (each Adam step costs a Cholesky of that
    size), then the exact posterior given the first ``--gp-rows`` (one Cholesky)."""
    fit_rows = args.gp_fit_rows or args.gp_rows
    model = fit_exact_gp(x[:fit_rows], y[:fit_rows], args.gp_lengthscales)
    model.set_train_data(x[: args.gp_rows], y[: args.gp_rows], strict=False)
    model.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(args.gp_rows + 1):
        predictive = model.likelihood(model(x_test))
    return predictive.mean, predictive.variance.sqrt(), float(model.likelihood.noise.detach().sqrt())


def run_split(args: argparse.Namespace, split: int, sigma: float) -> list[dict]:
    data = load_dataset_split(args.data_dir, split)
    x, y, x_test, y_test = (t.double() for t in (data.x_train, data.y_train, data.x_test, data.y_test))
    floor = noise_floor(sigma)["mnll_floor"]
    rows = []
    learners = {
        "quadratic": lambda: {"quadratic": quadratic(x, y, x_test)},
        "additive": lambda: {"additive": additive(x, y, x_test)},
        "mlp": lambda: mlp(args, x, y, x_test),
        "gp": lambda: {"gp": exact_gp(args, x, y, x_test)},
    }
    for learner in args.learners:
        torch.manual_seed(split)
        start = time.perf_counter()
        predictions = learners[learner]()
        seconds = time.perf_counter() - start
        for name, (mean, scale, noise) in predictions.items():
            mnll = gaussian_mnll(mean[None], scale, y_test) + math.log(data.y_scale)
            rows.append(
                {
                    "learner": name,
                    "split": split,
                    "rmse_over_sigma": float(rms(mean - y_test)) * data.y_scale / sigma,
                    "mnll_minus_floor": mnll - floor,
                    "noise_over_sigma": noise * data.y_scale / sigma,
                    "seconds": seconds,
                }
            )
    return rows


def write_results(args: argparse.Namespace, sigma: float, rows: list[dict]) -> str:
    """The per-split rows and a summary per learner as ``<out>/<set>.{json,csv,md}``; returns the summary table."""
    metrics = ("rmse_over_sigma", "mnll_minus_floor", "noise_over_sigma", "seconds")
    summary = summarize_by(rows, ("learner",), metrics)
    lines = [
        "| learner | splits | MNLL - floor | RMSE / sigma | noise / sigma | s a split |",
        "|---|---|---|---|---|---|",
    ]
    for entry in summary:
        lines.append(
            f"| {entry['learner']} | {entry['runs']}"
            f" | {entry['mnll_minus_floor']:.3f} ± {entry['mnll_minus_floor_se']:.3f}"
            f" | {entry['rmse_over_sigma']:.3f} | {entry['noise_over_sigma']:.3f} | {entry['seconds']:.0f} |"
        )
    text = "\n".join(lines)
    meta = environment(
        data_dir=str(args.data_dir),
        sigma=sigma,
        summary=summary,
        **{k: v for k, v in vars(args).items() if k not in ("data_dir", "out", "splits")},
        splits=sorted({row["split"] for row in rows}),
    )
    save_tables(args.out, dataset_name(args.data_dir), meta, rows, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="a `whvi synthetic` folder (with noise_std.txt)")
    parser.add_argument("--splits", type=parse_splits, default=(0,), help="e.g. 0-4 (default 0)")
    parser.add_argument("--learners", default="quadratic,additive,mlp,gp", help="comma-separated subset")
    parser.add_argument("--mlp-layers", type=int, default=4)
    parser.add_argument("--mlp-width", type=int, default=512)
    parser.add_argument("--mlp-epochs", type=int, default=200)
    parser.add_argument("--gp-rows", type=int, default=3000, help="training rows of the exact GP (O(n^3) time)")
    parser.add_argument(
        "--gp-fit-rows",
        type=int,
        default=None,
        help="rows whose marginal likelihood fits the GP's hyperparameters (default: --gp-rows); the posterior is "
        "then exact on --gp-rows, one Cholesky of that size (18,000 rows: 2.6 GB)",
    )
    parser.add_argument(
        "--gp-lengthscales",
        type=lambda text: tuple(float(value) for value in text.split(",")),
        default=GP_LENGTHSCALES,
        help="initial length scales of the GP's fits, comma-separated (default 1,0.3,0.1); the best fit is kept",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/synthetic_learnability"))
    args = parser.parse_args(argv)
    args.learners = [name.strip() for name in args.learners.split(",") if name.strip()]
    unknown = sorted(set(args.learners) - {"quadratic", "additive", "mlp", "gp"})
    if unknown or not args.learners:
        parser.error(f"--learners: choose from quadratic, additive, mlp, gp; got {args.learners}")
    if min(args.mlp_layers, args.mlp_width, args.mlp_epochs, args.gp_rows - 1) < 1:
        parser.error("--mlp-layers, --mlp-width, --mlp-epochs expected >= 1 and --gp-rows >= 2")
    if not args.gp_lengthscales or min(args.gp_lengthscales) <= 0:
        parser.error(f"--gp-lengthscales: positive numbers expected, got {args.gp_lengthscales}")
    if args.gp_fit_rows is not None and not 2 <= args.gp_fit_rows <= args.gp_rows:
        parser.error(f"--gp-fit-rows: expected 2 to --gp-rows ({args.gp_rows}), got {args.gp_fit_rows}")
    try:
        check_source(args.data_dir, args.splits)
        sigma = read_noise_std(args.data_dir)
    except (ValueError, FileNotFoundError) as error:
        parser.error(f"--data-dir: {error}")
    if sigma is None:
        parser.error(f"--data-dir {args.data_dir}: no noise_std.txt; write the set with `whvi synthetic`")
    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for split in tqdm(args.splits, desc="splits"):
        rows += run_split(args, split, sigma)
        text = write_results(args, sigma, rows)  # after every split: a stopped run keeps the splits it finished
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

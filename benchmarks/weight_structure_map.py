r"""Can a network whose weights have WHVI's structure fit and generalize as a dense one does? (issue 49, item 3)

A diagnostic for where WHVI loses to MC dropout (energy): no prior and no posterior, only point estimates. Each
network is named by one letter per layer, ``d`` a dense weight and ``w`` WHVI's structure
:math:`W = S_1 H \operatorname{diag}(g) H S_2` on the stacked blocks WHVI's guide uses (the layout of
:class:`~pyro_whvi.distributions.WHVILayout`), with ``s1``, ``g`` and ``s2`` learned. WHVI's posterior mean of a
weight has this structure, so a ``w`` network that generalizes worse than the dense one says the structure, not
the inference, holds the mean back. ``--terms R`` sums ``R`` such structures per weight (over :math:`\sqrt R`):
``R`` times the parameters, a richer mean at :math:`O(R D)`.

Every network is trained the same way: ReLU between layers, full-batch Adam on the Gaussian negative
log-likelihood with one learned noise scale, float64, the split's seed; targets standardized as ``whvi uci``
does. Dense layers start as :class:`torch.nn.Linear`; structured ones at :math:`s_1, s_2 \sim 1 + 0.1\,N(0, 1)`
and :math:`g \sim N(0, 2D / D_{in})`, so an entry of :math:`W` has variance :math:`2 / D_{in}` (He's).
Reported: train and test RMSE in the targets' units, the test MNLL with the learned noise, the parameters.
Usage::

    python benchmarks/weight_structure_map.py --data-dir ../shared/datasets/uci/energy --splits 0-4 \
        --nets ddd,www,dww,wdw --terms 1,2,4 --out benchmarks/results/weight_structure_map

References: Rossi et al., *Walsh-Hadamard Variational Inference for Bayesian Deep Learning*, NeurIPS 2020, §2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, save_tables

from pyro_whvi.distributions import WHVILayout
from pyro_whvi.distributions.whvi_matrix import whvi_weight
from pyro_whvi.experiments.arguments import positive, positive_float
from pyro_whvi.experiments.reporting import summarize_by
from pyro_whvi.experiments.uci_data import UCIData, check_source, dataset_name, load_dataset_split, parse_splits
from pyro_whvi.metrics import gaussian_mnll, rmse


class StructuredLinear(nn.Module):
    """A linear layer whose weight is a sum of ``terms`` WHVI structures over :math:`\\sqrt{terms}`."""

    def __init__(self, in_features: int, out_features: int, terms: int) -> None:
        super().__init__()
        self.layout = WHVILayout.for_shape((out_features, in_features))
        shape = (terms, *self.layout.block_shape)
        self.s1 = nn.Parameter(1 + 0.1 * torch.randn(shape))
        self.s2 = nn.Parameter(1 + 0.1 * torch.randn(shape))
        self.g = nn.Parameter(torch.randn(shape) * math.sqrt(2 * self.layout.block_size / in_features))
        self.bias = nn.Parameter(torch.zeros(out_features))

    @property
    def weight(self) -> Tensor:
        terms = [whvi_weight(s1, g, s2, self.layout) for s1, g, s2 in zip(self.s1, self.g, self.s2)]
        return torch.stack(terms).sum(0) / math.sqrt(len(terms))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T + self.bias


def network(net: str, in_features: int, width: int, terms: int) -> nn.Sequential:
    """The layers of ``net`` (one letter per layer), ReLU between them, one output."""
    sizes = [in_features] + [width] * (len(net) - 1) + [1]
    layers: list[nn.Module] = []
    for letter, fan_in, fan_out in zip(net, sizes[:-1], sizes[1:]):
        layers.append(nn.Linear(fan_in, fan_out) if letter == "d" else StructuredLinear(fan_in, fan_out, terms))
        layers.append(nn.ReLU())
    return nn.Sequential(*layers[:-1])


def fit(net: str, terms: int, data: UCIData, width: int, steps: int, lr: float, seed: int) -> dict:
    """Train ``net`` on ``data``'s training rows; its row of the table."""
    torch.manual_seed(seed)
    x, y = data.x_train.double(), data.y_train.double().reshape(-1)
    model = network(net, x.shape[1], width, terms).double()
    log_noise = nn.Parameter(torch.tensor(0.0, dtype=torch.double))
    optimizer = torch.optim.Adam([*model.parameters(), log_noise], lr=lr)
    start = time.process_time()
    for _ in range(steps):
        optimizer.zero_grad()
        residual = model(x).reshape(-1) - y
        (0.5 * (residual / log_noise.exp()).pow(2).mean() + log_noise).backward()
        optimizer.step()
    with torch.no_grad():
        # One prediction (a point estimate), as the metrics' one "sample"; back in the targets' units.
        train_f = model(x).reshape(1, -1) * data.y_scale
        test_f = model(data.x_test.double()).reshape(1, -1) * data.y_scale
        y_train, y_test = y * data.y_scale, data.y_test.double().reshape(-1) * data.y_scale
        noise = log_noise.exp().item() * data.y_scale
    return {
        "net": net,
        "terms": terms if "w" in net else 0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_rmse": rmse(train_f, y_train),
        "test_rmse": rmse(test_f, y_test),
        "test_mnll": gaussian_mnll(test_f, noise, y_test),
        "noise": noise,
        "cpu_seconds": time.process_time() - start,
    }


def _nets(text: str) -> list[str]:
    nets = text.split(",")
    if any(len(net) < 2 or set(net) - {"d", "w"} for net in nets):
        raise argparse.ArgumentTypeError(
            f"expected networks of two or more layers, one letter each (d dense, w WHVI's structure), separated by "
            f"commas, e.g. ddd,www; got {text!r}"
        )
    return list(dict.fromkeys(nets))


def _terms(text: str) -> list[int]:
    try:
        return list(dict.fromkeys(positive(part) for part in text.split(",")))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas, e.g. 1,2,4; got {text!r}"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="a UCI split folder")
    parser.add_argument("--splits", type=parse_splits, default=(0,), help="e.g. 0-4 (default 0)")
    parser.add_argument("--nets", type=_nets, default=_nets("ddd,www"), help="e.g. ddd,www,dww (default ddd,www)")
    parser.add_argument("--terms", type=_terms, default=[1], help="structures summed per w weight, e.g. 1,2,4")
    parser.add_argument("--width", type=int, default=128, help="hidden units (default 128, WHVI's 2 x 128)")
    parser.add_argument("--steps", type=positive, default=5000, help="Adam steps on all training rows (default 5000)")
    parser.add_argument("--lr", type=positive_float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/weight_structure_map"))
    args = parser.parse_args(argv)
    if args.width < 2:
        parser.error(f"--width: at least 2 hidden units expected, got {args.width}")
    try:
        check_source(args.data_dir, args.splits)
    except (ValueError, FileNotFoundError) as error:
        parser.error(f"--data-dir: {error}")
    torch.set_num_threads(1)
    runs = [(net, terms) for net in args.nets for terms in (args.terms if "w" in net else [1])]
    rows = []
    name = dataset_name(args.data_dir)
    with tqdm(total=len(runs) * len(args.splits), desc=name) as progress:
        for split in args.splits:
            data = load_dataset_split(args.data_dir, split)
            for net, terms in runs:
                rows.append({"split": split} | fit(net, terms, data, args.width, args.steps, args.lr, seed=split))
                progress.update()
    metrics = ("train_rmse", "test_rmse", "test_mnll", "cpu_seconds")
    summary = summarize_by(rows, ("net", "terms", "parameters"), metrics)
    lines = [
        f"### {name}: point estimates, {args.steps} Adam steps at {args.lr}, width {args.width}, splits "
        f"{','.join(map(str, args.splits))} (mean ± standard error)",
        "",
        "| net | terms | parameters | train RMSE | test RMSE | test MNLL (learned noise) | CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        cells = " | ".join(f"{s[m]:.3f} ± {s[m + '_se']:.3f}" for m in metrics[:3])
        lines.append(f"| {s['net']} | {s['terms'] or '-'} | {s['parameters']} | {cells} | {s['cpu_seconds']:.0f} |")
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = environment(data_dir=str(args.data_dir), splits=args.splits, width=args.width, steps=args.steps)
    save_tables(args.out, f"weight_structure_{name}", meta, rows, text)
    print(f"\nsaved {args.out / ('weight_structure_' + name)}.{{json,csv,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a trained regression network's ELBO goes, and where its learned noise comes from (issue 28, item 2).

For each split this trains ``--method`` exactly as ``whvi uci`` does (:func:`pyro_whvi.experiments.uci.train_split`,
same seeds, same schedule), then measures on the training data:

* the expected log-likelihood and the KL of every latent site (Monte Carlo over ``--draws`` guide draws:
  ``log q - log p`` per site, the terms ``Trace_ELBO`` sums), grouped into WHVI ``g`` sites and the rest;
* the learned noise scale ``sigma`` against what the ELBO's optimum for ``sigma`` is made of: the RMSE of
  the predictive mean on the training data and the posterior spread of ``f`` there,
  ``sigma^2 ~ residual^2 + mean Var_q f`` (the Gaussian likelihood's expectation under ``q``);
* the test RMSE and MNLL, and the test MNLL the same posterior would have with ``sigma`` replaced by the
  training residual (what the noise would be if ``q`` had no spread on the training inputs).

Units are the targets' original ones. Usage::

    python benchmarks/elbo_terms.py --data-dir ../shared/datasets/uci/yacht --method whvi --splits 0-4 \\
        --steps 50500 --out benchmarks/results/elbo_terms
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample

from pyro_whvi.experiments.methods import parse_method, predictive_samples
from pyro_whvi.experiments.reporting import save_tables
from pyro_whvi.experiments.uci import UCIConfig, parse_splits, train_split
from pyro_whvi.experiments.uci_config import UCI_PROTOCOLS
from pyro_whvi.experiments.uci_data import dataset_name
from pyro_whvi.metrics import gaussian_mnll, rmse

G_SUFFIX = "_whvi_g"


def site_kls(model, guide, x: torch.Tensor, y: torch.Tensor, draws: int) -> tuple[dict[str, float], float]:
    """Monte Carlo ``E_q[log q - log p]`` of every latent site (guide sites of one model site summed, e.g. an
    ``AutoNormal`` site's unconstrained draw and its transform) and ``E_q[log p(y | f)]`` on all of ``(x, y)``."""
    kls: dict[str, float] = {}
    log_likelihood = 0.0
    with torch.no_grad():
        for _ in range(draws):
            guide_trace = poutine.trace(guide).get_trace(x, y)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
            guide_trace.compute_log_prob()
            model_trace.compute_log_prob()
            for name, site in model_trace.nodes.items():
                if site["type"] != "sample" or site_is_subsample(site) or site["infer"].get("_deterministic"):
                    continue
                if site["is_observed"]:
                    log_likelihood += float(site["log_prob_sum"]) / draws
                    continue
                log_q = sum(
                    float(s["log_prob_sum"])
                    for n, s in guide_trace.nodes.items()
                    if s["type"] == "sample" and n in (name, name + "_unconstrained")
                )
                kls[name] = kls.get(name, 0.0) + (log_q - float(site["log_prob_sum"])) / draws
    return kls, log_likelihood


def diagnose(source: Path, method: str, split: int, config: UCIConfig, draws: int) -> dict:
    trained = train_split(source, parse_method(method), split, config)
    data, model, guide = trained.data, trained.model, trained.guide
    scale = data.y_scale
    kls, log_likelihood = site_kls(model, guide, data.x_train, data.y_train, draws)
    f_train = predictive_samples(model, guide, data.x_train, config.samples)
    f_test = predictive_samples(model, guide, data.x_test, config.samples)
    sigma = float(model.noise_scale.detach())
    residual = rmse(f_train, data.y_train)
    spread = float(f_train.var(0).mean().sqrt())
    g_kl = sum(v for k, v in kls.items() if k.endswith(G_SUFFIX))
    return {
        "dataset": dataset_name(source),
        "method": method,
        "split": split,
        "n_train": data.x_train.shape[0],
        "noise": sigma * scale,
        "train_residual": residual * scale,
        "train_sd_f": spread * scale,
        "sigma_from_terms": math.sqrt(residual**2 + spread**2) * scale,
        "test_rmse": rmse(f_test, data.y_test) * scale,
        "test_mnll": gaussian_mnll(f_test, sigma, data.y_test) + math.log(scale),
        "test_mnll_noise_at_residual": gaussian_mnll(f_test, residual, data.y_test) + math.log(scale),
        "expected_log_likelihood": log_likelihood,
        "kl_whvi_g": g_kl,
        "kl_other": sum(kls.values()) - g_kl,
        "kl_sites": kls,
    }


def table(rows: list[dict]) -> str:
    columns = [
        ("noise", "noise σ"),
        ("train_residual", "train residual"),
        ("train_sd_f", "train sd of f"),
        ("sigma_from_terms", "√(res² + sd²)"),
        ("test_rmse", "test RMSE"),
        ("test_mnll", "test MNLL"),
        ("test_mnll_noise_at_residual", "MNLL, σ = residual"),
        ("expected_log_likelihood", "E log p(y|f)"),
        ("kl_whvi_g", "KL g sites"),
        ("kl_other", "KL other"),
    ]
    lines = [
        "| dataset | method | split | " + " | ".join(label for _, label in columns) + " |",
        "|---|---|---|" + "---|" * len(columns),
    ]
    for row in rows:
        cells = " | ".join(f"{row[key]:.3f}" if abs(row[key]) < 1000 else f"{row[key]:.0f}" for key, _ in columns)
        lines.append(f"| {row['dataset']} | {row['method']} | {row['split']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="a dataset in the UCI split format")
    parser.add_argument("--method", default="whvi", help="a whvi uci method (default whvi)")
    parser.add_argument("--splits", type=parse_splits, default=(0,))
    parser.add_argument(
        "--protocol",
        "--preset",  # its name before whvi uci's --protocol
        dest="protocol",
        choices=tuple(UCI_PROTOCOLS),
        default="table3",
        help="whvi uci's (default table3)",
    )
    parser.add_argument("--steps", type=int, help="SVI steps (default: the protocol's)")
    parser.add_argument("--lr", type=float, help="Adam's initial learning rate (default: the protocol's)")
    parser.add_argument("--hidden", type=int, help="hidden units per layer (default: the protocol's)")
    parser.add_argument("--draws", type=int, default=64, help="guide draws of the Monte Carlo KLs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "elbo_terms")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = UCIConfig.from_protocol(
        args.protocol,
        args.data_dir.name,
        steps=args.steps,
        lr=args.lr,
        hidden=args.hidden,
        methods=(args.method,),
        splits=args.splits,
    )
    rows = [diagnose(args.data_dir, args.method, split, config, args.draws) for split in args.splits]
    text = table(rows)
    protocol = {
        "layers": config.layers,
        "hidden": config.hidden,
        "steps": config.schedule.steps,
        "lr": config.schedule.lr,
    }
    meta = {"data_dir": str(args.data_dir), "method": args.method, **protocol, "draws": args.draws}
    flat = [{k: v for k, v in row.items() if k != "kl_sites"} for row in rows]
    name = f"elbo_terms_{dataset_name(args.data_dir)}_{args.method}" + (
        "" if args.protocol == "table3" else f"_{args.protocol}"
    )
    save_tables(args.out, name, {**meta, "rows": rows}, flat, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does I-BLM help? Test MNLL vs SVI step from three initializations (the I-BLM paper's Fig. 5–8 set-up).

Tasks: ``concrete`` (a UCI split directory; 5 x 100 ReLU network, Gaussian likelihood with a learned
noise scale) and ``digits`` (``sklearn``'s bundled 8x8 digits; the small ``BayesianCNN``). Guides:
Pyro's ``AutoNormal`` (``mfg``) and ``AutoWHVIGuide`` (``whvi``; mean-field last layer, as in the
WHVI paper's experiments). Initializations:

* ``default``: the guide as constructed (AutoNormal: Pyro's ``init_to_feasible``, zero means and
  scale 0.1; AutoWHVIGuide: its own defaults);
* ``xavier``: zero means and variance ``2 / (D_in + D_out)`` (:func:`pyro_whvi.init.xavier_normal_`);
* ``iblm``: :func:`pyro_whvi.iblm_` with its defaults except a batch of 256 (``--iblm-batch``): the
  CNN's first FC layer regresses 129 coefficients, more than the default 128 rows, and ``iblm_``
  warns that its regressions would then be prior-dominated.

Then the same SVI for all: Adam (lr 1e-3, the paper's), minibatches of 64, ``Trace_ELBO`` with one
particle, ``--steps`` steps; test MNLL (regression: in the targets' original units) every
``--eval-every`` steps from step 0, mean ± standard error over ``--seeds`` seeds (seed ``s`` uses
split ``s`` of the UCI directory / digits split ``s``). Also timed: the initialization against the
``--steps`` SVI steps of the same run (the ratio is what the I-BLM paper's Fig. 4 argues is small).

    python benchmarks/iblm_init.py --data-dir ../shared/datasets/uci/concrete

Writes ``iblm_init.json`` / ``.md`` / ``.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import pyro
import torch
from pyro.infer.autoguide import AutoNormal
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, report_saved, save_figure, save_tables

from pyro_whvi import AutoWHVIGuide, iblm_, xavier_normal_
from pyro_whvi.data import load_digits_split, load_uci_split, num_uci_splits
from pyro_whvi.experiments.methods import predictive_samples
from pyro_whvi.metrics import categorical_nll, gaussian_mnll, mean_and_standard_error
from pyro_whvi.nn import BayesianCNN, BayesianMLP
from pyro_whvi.train.engine import Schedule, train

TASKS = ("concrete", "digits")
GUIDES = ("mfg", "whvi")
INITS = ("default", "xavier", "iblm")


def _data(task: str, seed: int, args):
    if task == "concrete":
        uci = load_uci_split(args.data_dir, seed % num_uci_splits(args.data_dir))
        return uci.x_train, uci.y_train, uci.x_test, uci.y_test, uci.y_std
    digits = load_digits_split(seed=seed, images=True)
    return digits.x_train, digits.y_train, digits.x_test, digits.y_test, None


def _model(task: str, x, args):
    if task == "concrete":
        return BayesianMLP([x.shape[1], *[args.width] * args.depth, 1], noise_scale=args.noise_scale)
    return BayesianCNN()


def _guide(name: str, model):
    # WHVI as in the paper's experiments: "the last layer assumes a fully factorized Gaussian" (§3.2).
    return AutoNormal(model) if name == "mfg" else AutoWHVIGuide(model, mean_field_last_layer=True)


def _test_mnll(task, model, guide, x, y, y_std, samples: int) -> float:
    f = predictive_samples(model, guide, x, samples)
    if task == "concrete":
        return gaussian_mnll(f, model.noise_scale.detach(), y) + math.log(y_std)
    return float(categorical_nll(f, y))


def run(task: str, guide_name: str, init: str, seed: int, args) -> dict:
    pyro.set_rng_seed(seed)
    pyro.clear_param_store()
    x, y, x_test, y_test, y_std = _data(task, seed, args)
    model = _model(task, x, args)
    guide = _guide(guide_name, model)
    start = time.perf_counter()
    with torch.no_grad():
        guide(x[: args.batch], y[: args.batch])  # set the guide up: the "default" initialization
    if init == "xavier":
        xavier_normal_(guide, x[: args.batch], y[: args.batch])
    elif init == "iblm":
        prior = args.iblm_prior if args.iblm_prior in ("evidence", "model") else float(args.iblm_prior)
        hidden = args.iblm_hidden_noise if args.iblm_hidden_noise == "evidence" else float(args.iblm_hidden_noise)
        iblm_(
            guide,
            (x, y),
            batch_size=args.iblm_batch,
            prior_variance=prior,
            samples=args.iblm_samples,
            hidden_noise_variance=hidden,
            progress=False,
        )
    init_seconds = time.perf_counter() - start
    steps, mnll = [0], [_test_mnll(task, model, guide, x_test, y_test, y_std, args.samples)]
    evaluation_seconds = 0.0

    def evaluate(step: int) -> None:
        nonlocal evaluation_seconds
        if step % args.eval_every == 0 or step == args.steps:
            tick = time.perf_counter()
            steps.append(step)
            mnll.append(_test_mnll(task, model, guide, x_test, y_test, y_std, args.samples))
            evaluation_seconds += time.perf_counter() - tick

    # The same SVI for every initialization: Adam at a constant rate, minibatches drawn with replacement
    # (seeded by the run's seed); the model's noise scale learns from the first step.
    schedule = Schedule(args.steps, 0, args.batch, args.lr, lr_gamma=0.0, lr_power=0.0)
    tick = time.perf_counter()
    train(model, guide, x, y, schedule, seed=seed, warm_up=False, callback=evaluate, progress=False)
    train_seconds = time.perf_counter() - tick - evaluation_seconds
    return {
        "task": task,
        "guide": guide_name,
        "init": init,
        "seed": seed,
        "steps": steps,
        "mnll": mnll,
        "init_seconds": init_seconds,
        "train_seconds": train_seconds,
    }


def summarize(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["guide"], row["init"]), []).append(row)
    summary = []
    for (task, guide, init), mine in groups.items():
        curves = torch.tensor([r["mnll"] for r in mine])
        start, start_se = mean_and_standard_error(curves[:, 0].tolist())
        end, end_se = mean_and_standard_error(curves[:, -1].tolist())
        ratio, ratio_se = mean_and_standard_error([r["init_seconds"] / r["train_seconds"] for r in mine])
        summary.append(
            {
                "task": task,
                "guide": guide,
                "init": init,
                "runs": len(mine),
                "steps": mine[0]["steps"],
                "mnll_curve": curves.mean(0).tolist(),
                "mnll_curve_se": (curves.std(0) / math.sqrt(len(mine))).tolist() if len(mine) > 1 else None,
                "mnll_start": start,
                "mnll_start_se": start_se,
                "mnll_end": end,
                "mnll_end_se": end_se,
                "init_over_train": ratio,
                "init_over_train_se": ratio_se,
                "init_seconds": statistics.fmean(r["init_seconds"] for r in mine),
                "train_seconds": statistics.fmean(r["train_seconds"] for r in mine),
            }
        )
    return summary


def plot(summary: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = sorted({(e["task"], e["guide"]) for e in summary})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (task, guide) in zip(axes[0], panels):
        for entry in (e for e in summary if (e["task"], e["guide"]) == (task, guide)):
            steps, curve = entry["steps"], torch.tensor(entry["mnll_curve"])
            (line,) = ax.plot(steps, curve, label=entry["init"])
            if entry["mnll_curve_se"] is not None:
                se = torch.tensor(entry["mnll_curve_se"])
                ax.fill_between(steps, curve - se, curve + se, color=line.get_color(), alpha=0.2)
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(f"{task}, {guide}")
        ax.set_xlabel("SVI step")
        ax.set_ylabel("test MNLL")
        ax.legend()
    return save_figure(fig, path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, help="UCI concrete in the split format (for the concrete task)")
    parser.add_argument("--tasks", default="concrete,digits", help=f"comma separated, from {TASKS}")
    parser.add_argument("--guides", default="mfg,whvi", help=f"comma separated, from {GUIDES}")
    parser.add_argument("--inits", default="default,xavier,iblm", help=f"comma separated, from {INITS}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--noise-scale", type=float, default=0.3, help="initial noise std (standardized units)")
    parser.add_argument("--samples", type=int, default=100, help="Monte-Carlo samples for the test MNLL")
    parser.add_argument("--iblm-batch", type=int, default=256, help="I-BLM's minibatch per regression")
    parser.add_argument("--iblm-prior", default="evidence", help="I-BLM's prior_variance: evidence, model or a float")
    parser.add_argument("--iblm-samples", type=int, default=1, help="I-BLM's draws per propagation (0: q's medians)")
    parser.add_argument("--iblm-hidden-noise", default="0.01", help="I-BLM's hidden_noise_variance")
    parser.add_argument("--stem", default="iblm_init")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    tasks, guides, inits = ([v for v in s.split(",") if v] for s in (args.tasks, args.guides, args.inits))
    for values, allowed, what in ((tasks, TASKS, "--tasks"), (guides, GUIDES, "--guides"), (inits, INITS, "--inits")):
        if not set(values) <= set(allowed):
            parser.error(f"{what}: choose from {allowed}, got {values}")
    if "concrete" in tasks and (args.data_dir is None or not args.data_dir.is_dir()):
        parser.error("the concrete task needs --data-dir pointing at a UCI split directory")
    jobs = [(t, g, i, s) for t in tasks for g in guides for i in inits for s in range(args.seeds)]
    rows = [run(task, guide, init, seed, args) for task, guide, init, seed in tqdm(jobs, desc="runs")]
    summary = summarize(rows)
    lines = [
        f"# I-BLM vs default vs Xavier init: test MNLL at step 0 and after {args.steps} SVI steps "
        f"(Adam lr {args.lr}, batch {args.batch}), mean ± s.e. over {args.seeds} seeds",
        "",
        "| task | guide | init | MNLL step 0 | MNLL step " + str(args.steps) + " | init time / SVI time |",
        "|---|---|---|---|---|---|",
    ]
    for e in summary:
        lines.append(
            f"| {e['task']} | {e['guide']} | {e['init']} | {e['mnll_start']:.3f} ± {e['mnll_start_se']:.3f} | "
            f"{e['mnll_end']:.3f} ± {e['mnll_end_se']:.3f} | {e['init_over_train']:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    meta = {"config": {k: str(v) for k, v in vars(args).items()}, "environment": environment(), "summary": summary}
    save_tables(args.out, args.stem, meta, rows, text)
    report_saved(args.out, args.stem, plot(summary, args.out / f"{args.stem}.png"))
    print(text)


if __name__ == "__main__":
    main()

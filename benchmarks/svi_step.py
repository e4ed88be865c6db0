"""Time one SVI step of a Bayesian MLP under AutoWHVIGuide and under Pyro's AutoNormal, in one run.

The model is ``pyro_whvi.models.BayesianMLP([D, D, D, 1])`` (two hidden layers of width D) for
D = 2^7 ... 2^12, on one fixed batch (default 128 rows) of float32 inputs, on the CPU. A step is
``svi.step(x, y)`` with Pyro's ``SVI``, ``Trace_ELBO`` and Adam: one ELBO sample, forward, backward
and the parameter update, for

* ``AutoNormal(model)`` in ``SVI(model, guide, ...)``;
* ``AutoWHVIGuide(model)`` with its defaults (diagonal ``q(g)``, local reparameterization), which
  transforms the model in place, in the same ``SVI(model, guide, ...)``.

Each guide (own param-store scope) takes a set-up step and 3 warm-up steps first. Pyro validation is
disabled (``pyro.validation_enabled(False)``) during warm-up and timing. Times are medians of
``torch.utils.benchmark`` blocked runs using all of torch's threads (or ``--threads``), the best of
3 interleaved rounds (2 with ``--quick``), so that both guides see the same machine state. Also
reported: each guide's number of variational parameters, ``sum(p.numel() for p in
guide.parameters())`` after set-up. Results go to ``--out`` as JSON, CSV, a markdown table and a
plot of time vs D. Other processes on the cores slow multi-threaded steps badly; try ``--threads 1``.

    python benchmarks/svi_step.py --quick      # D up to 2^10, well under a minute on an idle CPU
    python benchmarks/svi_step.py              # full sweep
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.optim import PyroOptim
from pyro.params.param_store import StateDict
from torch.utils import benchmark
from tqdm import tqdm

from pyro_whvi import AutoWHVIGuide, ops
from pyro_whvi.models import BayesianMLP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, report_saved, save_figure, save_tables, style_log_axes

GUIDES = ("AutoNormal", "WHVI")
WARMUP_STEPS = 3


def _adam() -> PyroOptim:
    return PyroOptim(torch.optim.Adam, {"lr": 1e-3})  # what pyro.optim.Adam is, without the dynamic attribute


def _setup(name: str, size: int, x: torch.Tensor, y: torch.Tensor) -> tuple[Callable[[], Any], StateDict, int]:
    """A set-up and warmed-up SVI step for one guide, its param-store scope and its parameter count."""
    model = BayesianMLP([size, size, size, 1])
    with pyro.get_param_store().scope() as state:
        guide: AutoNormal | AutoWHVIGuide
        guide = AutoWHVIGuide(model) if name == "WHVI" else AutoNormal(model)
        svi = SVI(model, guide, _adam(), Trace_ELBO())
        loss = svi.step(x, y)  # sets the guide up, with Pyro's validation as configured
        with pyro.validation_enabled(False):
            for _ in range(WARMUP_STEPS):
                loss = svi.step(x, y)
        if not math.isfinite(loss):
            raise RuntimeError(f"{name} at D={size}: non-finite loss {loss} after warm-up")
    return (lambda: svi.step(x, y)), state, sum(p.numel() for p in guide.parameters())


def _time(step: Callable[[], Any], state: StateDict, min_run_time: float) -> float:
    with pyro.get_param_store().scope(state), pyro.validation_enabled(False):
        timer = benchmark.Timer(stmt="fn()", globals={"fn": step}, num_threads=torch.get_num_threads())
        return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def measure(sizes: list[int], batch: int, min_run_time: float, rounds: int, label: str) -> list[dict[str, Any]]:
    """One row per D; each D's guides run in ``rounds`` interleaved rounds and the fastest median is kept."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    with tqdm(total=len(sizes) * rounds * len(GUIDES), desc=f"timing ({label})", unit="case") as progress:
        for size in sizes:
            x = torch.randn(batch, size, generator=generator, dtype=torch.float32)
            y = torch.randn(batch, generator=generator, dtype=torch.float32)
            pyro.set_rng_seed(0)
            cases = {name: _setup(name, size, x, y) for name in GUIDES}
            best = dict.fromkeys(GUIDES, math.inf)
            for _ in range(rounds):
                for name, (step, state, _) in cases.items():
                    best[name] = min(best[name], _time(step, state, min_run_time))
                    progress.update()
            row: dict[str, Any] = {"D": size, "batch": batch}
            row.update(autonormal_params=cases["AutoNormal"][2], whvi_params=cases["WHVI"][2])
            row.update(autonormal_ms_per_step=best["AutoNormal"] * 1e3, whvi_ms_per_step=best["WHVI"] * 1e3)
            rows.append({**row, "whvi_over_autonormal": best["WHVI"] / best["AutoNormal"]})
            del cases
            gc.collect()
    return rows


def markdown(rows: list[dict[str, Any]], batch: int, threads: int) -> str:
    lines = [
        f"\n### One SVI step of BayesianMLP([D, D, D, 1]), batch {batch}, fp32, {threads} threads,"
        " Pyro validation off\n",
        "| D | AutoNormal params | WHVI params | AutoNormal ms/step | WHVI ms/step | WHVI / AutoNormal |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['D']} | {r['autonormal_params']:,} | {r['whvi_params']:,} | {r['autonormal_ms_per_step']:.2f} "
            f"| {r['whvi_ms_per_step']:.2f} | {r['whvi_over_autonormal']:.3g} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], batch: int, threads: int, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4.2))
    sizes = [r["D"] for r in rows]
    for label, key in (("AutoNormal", "autonormal_ms_per_step"), ("AutoWHVIGuide", "whvi_ms_per_step")):
        ax.plot(sizes, [r[key] for r in rows], marker="o", label=label)
    ax.set_ylabel("time per SVI step [ms]")
    style_log_axes(ax, "D (hidden width)", f"BayesianMLP([D, D, D, 1]), batch {batch} (fp32, CPU, {threads} threads)")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter runs and D up to 2^10")
    parser.add_argument("--batch", type=int, default=128, help="rows per step (default 128)")
    parser.add_argument("--max-log2-d", type=int, default=None, help="largest D as a power of two (default 12)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, 2 with --quick)")
    parser.add_argument("--min-run-time", type=float, default=None, help="seconds per timing (default 1, quick 0.2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be positive")
    max_log2 = args.max_log2_d if args.max_log2_d is not None else (10 if args.quick else 12)
    if not 7 <= max_log2 <= 13:
        parser.error("--max-log2-d must be between 7 and 13")
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    min_run_time = args.min_run_time if args.min_run_time is not None else (0.2 if args.quick else 1.0)
    if rounds < 1 or min_run_time <= 0 or (args.threads is not None and args.threads < 1):
        parser.error("--rounds, --min-run-time and --threads must be positive")
    sizes = [2**k for k in range(7, max_log2 + 1)]

    backend = "compiled" if ops.compiled_available() else "reference"  # builds the kernels before timing
    previous_dtype, previous_threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float32)  # the models' parameters and priors
    torch.set_num_threads(args.threads or previous_threads)
    threads = torch.get_num_threads()
    try:
        rows = measure(sizes, args.batch, min_run_time, rounds, "quick" if args.quick else "full")
    finally:
        torch.set_default_dtype(previous_dtype)
        torch.set_num_threads(previous_threads)
    text = markdown(rows, args.batch, threads)
    print(text)

    stem = "svi_step_quick" if args.quick else "svi_step"
    meta = environment(
        pyro=pyro.__version__,
        whvi_backend=backend,
        threads=threads,
        rounds=rounds,
        min_run_time=min_run_time,
        warmup_steps=WARMUP_STEPS,
        validation=False,
    )
    save_tables(args.out, stem, meta, rows, text)
    report_saved(args.out, stem, plot(rows, args.batch, threads, args.out / f"{stem}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Data-parallel SVI: throughput of 1 vs N processes at the same global batch, and the all-reduce cost.

A Bayesian MLP ``[16, D, D, 1]`` (default D = 1024) with ``AutoWHVIGuide`` (the ``whvi`` method) and
``AutoNormal`` (``mfg``) is trained by :func:`pyro_whvi.train.engine.train` on synthetic regression data, with
the same global batch (default 256) in every configuration:

* ``1 process x 1 thread`` and ``1 process x N threads`` (the same cores as N processes);
* ``N processes x 1 thread``, launched by :func:`pyro_whvi.train.distributed.launch` (gloo on loopback):
  each rank computes ``batch / N`` examples and DDP all-reduces the gradient.

A step's time is ``(t(long) - t(short)) / (long - short steps)`` (each the fastest of 5 runs, after one
throw-away run), so set-up (warm-up, DDP's broadcast) is excluded; throughput is global examples per
second. All-reduce times are medians of 50, each after a barrier. In the same N-process run the script times
``dist.all_reduce`` of a float32 vector as long as each guide's parameters, the part of a step that
grows with the number of parameters a guide has: WHVI's are O(D) per layer, AutoNormal's O(D^2).

    python benchmarks/distributed.py             # D = 1024, 2 processes
    python benchmarks/distributed.py --quick     # D = 256
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pyro
import torch
import torch.distributed as dist

from pyro_whvi.experiments.methods import build_method
from pyro_whvi.train import distributed
from pyro_whvi.train.engine import Schedule, train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, report_saved, save_figure, save_tables

METHODS = {"whvi": "AutoWHVIGuide", "mfg": "AutoNormal"}
REPEATS = 5  # the fastest of 5 runs of each length: other processes only ever add time


def _data(num_data: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, features, generator=generator)
    y = torch.sin(x[:, :4].sum(-1)) + 0.1 * torch.randn(num_data, generator=generator)
    return x, y


def _train_seconds(method: str, hidden: int, batch: int, steps: int) -> tuple[float, int]:
    """Wall time of :func:`train` for ``steps`` steps (this rank), and the guide's parameter count."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data(4096, 16)
    model, guide = build_method(method, [16, hidden, hidden, 1])
    schedule = Schedule(steps=steps, fixed_noise_steps=0, batch_size=batch)
    if distributed.world_size() > 1:
        dist.barrier()
    start = time.perf_counter()
    train(model, guide, x, y, schedule, progress=False)
    seconds = time.perf_counter() - start
    return seconds, sum(p.numel() for p in guide.parameters())


def step_times(hidden: int, batch: int, short: int, long: int, sizes: dict[str, int]) -> dict[str, Any]:
    """Per-step seconds of each method in this process group, and all-reduce seconds of ``sizes``."""
    result: dict[str, Any] = {"step": {}, "parameters": {}, "all_reduce": {}}
    for method in METHODS:
        _train_seconds(method, hidden, batch, 2)  # first calls: kernel loading, allocator, DDP's first buckets
        t_short = min(_train_seconds(method, hidden, batch, short)[0] for _ in range(REPEATS))
        t_long, count = min(_train_seconds(method, hidden, batch, long) for _ in range(REPEATS))
        result["step"][method] = (t_long - t_short) / (long - short)
        result["parameters"][method] = count
    if distributed.world_size() > 1:
        for method, count in sizes.items():
            vector = torch.randn(count)
            for _ in range(10):
                dist.all_reduce(vector)
            times = []
            for _ in range(50):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(vector)
                times.append(time.perf_counter() - start)
            result["all_reduce"][method] = sorted(times)[len(times) // 2]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256, help="global batch")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="D = 256, fewer steps")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    hidden = 256 if args.quick else args.hidden
    short, long = (5, 25) if args.quick else (10, 110)
    torch.set_num_threads(1)
    one = step_times(hidden, args.batch, short, long, {})
    torch.set_num_threads(args.nproc)
    threaded = step_times(hidden, args.batch, short, long, {})
    parallel = distributed.launch(step_times, args.nproc, hidden, args.batch, short, long, one["parameters"], threads=1)
    rows = []
    for method, guide in METHODS.items():
        base = one["step"][method]
        for label, times in (
            ("1 process x 1 thread", one),
            (f"1 process x {args.nproc} threads", threaded),
            (f"{args.nproc} processes x 1 thread", parallel),
        ):
            seconds = times["step"][method]
            rows.append(
                {
                    "guide": guide,
                    "configuration": label,
                    "parameters": one["parameters"][method],
                    "step_ms": 1e3 * seconds,
                    "examples_per_s": args.batch / seconds,
                    "speedup": base / seconds,
                    "all_reduce_ms": 1e3 * parallel["all_reduce"][method] if times is parallel else None,
                }
            )
    lines = [
        f"### Data-parallel SVI: [16, {hidden}, {hidden}, 1] Bayesian MLP, global batch {args.batch}, CPU, gloo",
        "",
        "| guide | configuration | variational params | ms/step | examples/s | speedup | all-reduce ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        reduce = f"{row['all_reduce_ms']:.2f}" if row["all_reduce_ms"] is not None else ""
        lines.append(
            f"| {row['guide']} | {row['configuration']} | {row['parameters']:,} | {row['step_ms']:.1f} | "
            f"{row['examples_per_s']:.0f} | {row['speedup']:.2f}x | {reduce} |"
        )
    text = "\n".join(lines)
    print(text)
    stem = "distributed_quick" if args.quick else "distributed"
    save_tables(args.out, stem, environment(hidden=hidden, batch=args.batch, nproc=args.nproc), rows, text)
    report_saved(args.out, stem, _plot(rows, args.out / f"{stem}.png", hidden))


def _plot(rows: list[dict[str, Any]], path: Path, hidden: int) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    configurations = list(dict.fromkeys(row["configuration"] for row in rows))
    width = 0.8 / len(METHODS)
    for k, guide in enumerate(METHODS.values()):
        values = [
            next(r["examples_per_s"] for r in rows if r["guide"] == guide and r["configuration"] == c)
            for c in configurations
        ]
        ax.bar([i + k * width for i in range(len(configurations))], values, width, label=guide)
    ax.set_xticks([i + width / 2 for i in range(len(configurations))], configurations)
    ax.set_ylabel("examples / s")
    ax.set_title(f"SVI throughput, [16, {hidden}, {hidden}, 1], same global batch")
    ax.legend()
    return save_figure(fig, path)


if __name__ == "__main__":
    main()

"""Time the Walsh–Hadamard ops against their baselines, in one run (WHVI paper App. D.5, Fig. 17).

For batch B (default 512) and D = 2^4 ... 2^14, fp32, on the CPU:

* ``fwht``: pyro_whvi compiled, pyro_whvi reference (pure PyTorch), the PyPI package
  ``hadamard-transform`` (pure PyTorch), a dense matmul with the explicit normalized H, and
  ``torch.clone`` (the memory-copy floor);
* ``whvi_matvec``: pyro_whvi compiled and reference against ``x @ W.T`` with W materialized.

Times are medians of ``torch.utils.benchmark`` blocked runs using all of torch's threads, the best
of 3 interleaved rounds (2 with ``--quick``); every ratio is against a baseline measured in the
same process. Results go to ``--out`` as JSON, CSV,
a markdown table and a plot of time vs D.

    python benchmarks/fwht.py --quick          # about a minute
    python benchmarks/fwht.py                  # full sweep
    python benchmarks/fwht.py --device cuda    # the Triton GPU kernels (benchmarks/gpu_kernels.py)
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark
from tqdm import tqdm

from pyro_whvi import ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, report_saved, save_figure, save_tables, style_log_axes

FWHT_METHODS = ("compiled", "reference", "hadamard-transform", "dense matmul", "clone")
MATVEC_METHODS = ("compiled", "reference", "dense matmul")


def _hadamard_transform() -> Callable[[torch.Tensor], torch.Tensor] | None:
    try:
        from hadamard_transform import hadamard_transform
    except ImportError:
        return None
    return hadamard_transform


def _time(fn: Callable[[], Any], min_run_time: float, backend: str) -> float:
    with ops.use_backend(backend):  # set once around the timing, not per call
        fn()  # warm-up
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
        return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def _case(
    op: str,
    method: str,
    t: dict[str, torch.Tensor],
    hadamard_transform: Callable[[torch.Tensor], torch.Tensor] | None,
) -> Callable[[], Any] | None:
    """The call to time for one (op, method) on the inputs ``t``; None if the method is unavailable."""
    if op == "fwht":
        cases: dict[str, Callable[[], Any] | None] = {
            "compiled": lambda: ops.fwht(t["x"]),
            "reference": lambda: ops.fwht(t["x"]),
            "hadamard-transform": (lambda: hadamard_transform(t["x"])) if hadamard_transform else None,
            "dense matmul": lambda: t["x"] @ t["H"],
            "clone": lambda: t["x"].clone(),
        }
    else:
        cases = {
            "compiled": lambda: ops.whvi_matvec(t["x"], t["s1"], t["g"], t["s2"]),
            "reference": lambda: ops.whvi_matvec(t["x"], t["s1"], t["g"], t["s2"]),
            "dense matmul": lambda: t["x"] @ t["W"].T,
        }
    return cases[method]


def measure(sizes: list[int], batch: int, min_run_time: float, rounds: int, label: str) -> list[dict[str, Any]]:
    """Time every case; each D's cases run in ``rounds`` interleaved rounds and the fastest median is kept,
    so that a burst of load from outside the process does not land on one method only."""
    generator = torch.Generator().manual_seed(0)
    hadamard_transform = _hadamard_transform()
    cases = [("fwht", m) for m in FWHT_METHODS] + [("whvi_matvec", m) for m in MATVEC_METHODS]
    best: dict[tuple[str, str, int], float] = {}
    with tqdm(total=len(sizes) * rounds * len(cases), desc=f"timing ({label})", unit="case") as progress:
        for size in sizes:
            x = torch.randn(batch, size, generator=generator)
            s1, g, s2 = torch.randn(3, size, generator=generator).unbind(0)
            hadamard = ops.fwht(torch.eye(size), normalized=True)  # rows of the normalized H
            weight = ops.stacked_whvi_weight(s1[None], g[None], s2[None], size, size)
            inputs = {"x": x, "s1": s1, "g": g, "s2": s2, "H": hadamard, "W": weight}
            for _ in range(rounds):
                for op, method in cases:
                    progress.update()
                    fn = _case(op, method, inputs, hadamard_transform)
                    if fn is None:
                        continue
                    seconds = _time(fn, min_run_time, "reference" if method == "reference" else "compiled")
                    key = (op, method, size)
                    best[key] = min(seconds, best.get(key, math.inf))
    return [
        {"op": op, "method": method, "D": size, "batch": batch, "seconds": seconds}
        for (op, method, size), seconds in best.items()
    ]


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (op, D): every method's time relative to the compiled kernel and to the floor."""
    by_key = {(r["op"], r["D"], r["method"]): r["seconds"] for r in rows}
    table = []
    for (op, size, method), seconds in by_key.items():
        compiled = by_key.get((op, size, "compiled"))
        clone = by_key.get(("fwht", size, "clone"))
        table.append(
            {
                "op": op,
                "D": size,
                "method": method,
                "time_us": seconds * 1e6,
                "x_compiled": seconds / compiled if compiled else math.nan,
                "x_clone": seconds / clone if clone else math.nan,
            }
        )
    return table


def markdown(table: list[dict[str, Any]], batch: int) -> str:
    lines = []
    for op, methods in (("fwht", FWHT_METHODS), ("whvi_matvec", MATVEC_METHODS)):
        lines.append(f"\n### {op}, batch {batch}, fp32, {torch.get_num_threads()} threads: time in µs (× compiled)\n")
        lines.append("| D | " + " | ".join(methods) + (" | compiled / clone |" if op == "fwht" else " |"))
        lines.append("|---" * (len(methods) + 1 + (op == "fwht")) + "|")
        for size in sorted({r["D"] for r in table if r["op"] == op}):
            cells = {r["method"]: r for r in table if r["op"] == op and r["D"] == size}
            row = [str(size)]
            for method in methods:
                cell = cells.get(method)
                row.append("—" if cell is None else f"{cell['time_us']:.1f} ({cell['x_compiled']:.2f}×)")
            if op == "fwht":
                row.append(f"{cells['compiled']['x_clone']:.2f}" if "compiled" in cells else "—")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(table: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (op, methods) in zip(axes, (("fwht", FWHT_METHODS), ("whvi_matvec", MATVEC_METHODS))):
        for method in methods:
            points = sorted((r["D"], r["time_us"]) for r in table if r["op"] == op and r["method"] == method)
            if points:
                ax.plot(*zip(*points), marker="o", label=method)
        style_log_axes(ax, "D", f"{op} (fp32, CPU)")
    axes[0].set_ylabel("time per call [µs]")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter runs and D up to 2^12")
    parser.add_argument("--batch", type=int, default=512, help="rows per call (default 512)")
    parser.add_argument("--max-log2-d", type=int, default=None, help="largest D as a power of two (default 14)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: benchmarks/gpu_kernels.py")
    args = parser.parse_args(argv)
    if args.device == "cuda":  # the GPU kernels have their own script (other baselines: copy, cuBLAS, Dao's)
        import gpu_kernels

        return gpu_kernels.main(["--out", str(args.out), *(["--max-log2-d", "13"] if args.quick else [])])
    if args.batch < 1:
        parser.error("--batch must be positive")
    max_log2 = args.max_log2_d if args.max_log2_d is not None else (12 if args.quick else 14)
    if not 4 <= max_log2 <= 15:
        parser.error("--max-log2-d must be between 4 and 15")
    sizes = [2**k for k in range(4, max_log2 + 1)]
    min_run_time = 0.05 if args.quick else 0.2
    rounds = 2 if args.quick else 3

    ops.load_compiled()
    rows = measure(sizes, args.batch, min_run_time, rounds, "quick" if args.quick else "full")
    table = ratios(rows)
    text = markdown(table, args.batch)
    print(text)

    stem = "fwht_quick" if args.quick else "fwht"
    save_tables(args.out, stem, environment(), table, text)
    report_saved(args.out, stem, plot(table, args.out / f"{stem}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

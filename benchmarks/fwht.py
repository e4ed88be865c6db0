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

The peer table (``fwht_peer.*``, also appended to ``fwht.md``) sets the compiled kernel against the
SIMD package ``fht-cpu`` (PyPI, in the ``bench`` extra; FFHT's kernels) at D = 2^4 ... 2^15 (2^12 with
``--quick``), one thread for both, the same unnormalized transform: out of place (``fwht(x)`` against
``fht(x, inplace=False)``, which copies then transforms) and in place (``fwht_(x)`` against ``fht(x)``).
The four calls are interleaved call by call, in alternating order, with each in-place buffer refreshed
from the input (untimed) before its call. Each time is the median of many calls in this thread's CPU
time (user and system, page faults included: both libraries run on the calling thread with one thread,
and on a shared machine CPU time leaves out the time the thread waited for a core). Each ratio is the
median over the rounds of ours over theirs within the round (calls made back to back see the same load),
in that clock and in wall time. Without ``fht-cpu`` its rows are skipped with a note.

    python benchmarks/fwht.py --quick          # about a minute
    python benchmarks/fwht.py                  # full sweep
    python benchmarks/fwht.py --peer-only      # only the table against fht-cpu
    python benchmarks/fwht.py --device cuda    # the Triton GPU kernels (benchmarks/gpu_kernels.py)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
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


def _fht_cpu() -> Callable[..., Any] | None:
    try:
        from fht_cpu import fht
    except ImportError:
        return None
    return fht


PEER_NOTE = "fht-cpu is not installed (`pip install fht-cpu`, in the `bench` extra): its rows are skipped."


_PeerCase = tuple[str, Callable[[], Any], Callable[[], Any] | None]  # name, timed call, untimed refresh


def _peer_cases(fht: Callable[..., Any], x: torch.Tensor) -> list[_PeerCase]:
    """The four calls on one input, the same unnormalized transform; in-place buffers are refreshed from x."""
    x_np = x.numpy()
    ours_buffer, theirs_buffer = x.clone(), x_np.copy()
    return [
        ("ours out-of-place", lambda: ops.fwht(x, normalized=False), None),
        ("fht-cpu out-of-place", lambda: fht(x_np, inplace=False, num_threads=1), None),
        ("ours in-place", lambda: ops.fwht_(ours_buffer, normalized=False), lambda: ours_buffer.copy_(x)),
        ("fht-cpu in-place", lambda: fht(theirs_buffer, num_threads=1), lambda: np.copyto(theirs_buffer, x_np)),
    ]


def _interleaved_times(cases: list[_PeerCase], budget_s: float) -> dict[str, dict[str, list[float]]]:
    """Seconds per clock (``cpu``: this thread's, ``wall``) and case, one per round, the calls interleaved one
    by one (alternating order)."""
    start = time.perf_counter()
    for _, call, refresh in cases:  # warm-up, and an estimate of one round
        if refresh is not None:
            refresh()
        call()
    repeats = max(15, min(1001, int(budget_s / max(time.perf_counter() - start, 1e-6))))
    seconds: dict[str, dict[str, list[float]]] = {"cpu": {}, "wall": {}}
    for repeat in range(repeats):
        for name, call, refresh in cases if repeat % 2 == 0 else cases[::-1]:
            if refresh is not None:
                refresh()
            wall, cpu = time.perf_counter(), time.thread_time()
            call()
            seconds["cpu"].setdefault(name, []).append(time.thread_time() - cpu)
            seconds["wall"].setdefault(name, []).append(time.perf_counter() - wall)
    return seconds


def peer_measure(sizes: list[int], batch: int, budget_s: float) -> list[dict[str, Any]]:
    """Median wall times of ours and fht-cpu's transforms, out of place and in place, one thread (see the
    module docstring); an empty list without fht-cpu."""
    fht = _fht_cpu()
    if fht is None:
        return []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    rows = []
    try:
        for size in tqdm(sizes, desc="timing against fht-cpu", unit="D"):
            x = torch.randn(batch, size, generator=generator)
            seconds = _interleaved_times(_peer_cases(fht, x), budget_s)
            row: dict[str, Any] = {"D": size, "batch": batch, "repeats": len(seconds["cpu"]["ours in-place"])}
            for clock, by_case in seconds.items():
                row |= {f"{name} {clock} us": statistics.median(values) * 1e6 for name, values in by_case.items()}
                for form in ("out-of-place", "in-place"):
                    # A round whose clock read no time for the peer's call (a tick-based CPU clock on a busy
                    # machine, at microseconds per call) has no ratio; the others do.
                    pairs = zip(by_case[f"ours {form}"], by_case[f"fht-cpu {form}"])
                    ratios = [ours / theirs for ours, theirs in pairs if theirs > 0]
                    row[f"{form} ratio {clock}"] = statistics.median(ratios) if ratios else math.nan
            rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return rows


def peer_markdown(rows: list[dict[str, Any]], batch: int) -> str:
    lines = [
        f"\n### fwht against fht-cpu, batch {batch}, fp32, 1 thread: median CPU time in µs, "
        "ratio ours / fht-cpu (median over rounds) in CPU time (in wall time)\n"
    ]
    if not rows:
        return "\n".join([*lines, PEER_NOTE])
    lines.append("| D | ours out-of-place | fht-cpu out-of-place | ratio | ours in-place | fht-cpu in-place | ratio |")
    lines.append("|---" * 7 + "|")
    for r in rows:
        cells = [str(r["D"])]
        for form in ("out-of-place", "in-place"):
            cells += [f"{r[f'ours {form} cpu us']:.1f}", f"{r[f'fht-cpu {form} cpu us']:.1f}"]
            cells.append(f"{r[f'{form} ratio cpu']:.2f} ({r[f'{form} ratio wall']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    for clock in ("cpu", "wall"):
        worst = max(max(r[f"out-of-place ratio {clock}"], r[f"in-place ratio {clock}"]) for r in rows)
        lines.append(f"\nWorst ratio in {clock} time: {worst:.2f} (target: at most 1.2 at every D, both forms).")
    return "\n".join(lines)


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
    parser.add_argument("--peer-only", action="store_true", help="only the table against fht-cpu")
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
    peer_sizes = [2**k for k in range(4, 13 if args.quick else 16)]
    suffix = "_quick" if args.quick else ""

    ops.load_compiled()
    peer = peer_measure(peer_sizes, args.batch, 0.5 if args.quick else 6.0)
    peer_text = peer_markdown(peer, args.batch)
    print(peer_text)
    if peer:
        save_tables(args.out, f"fwht_peer{suffix}", environment(threads=1, peer="fht-cpu"), peer, peer_text)
        report_saved(args.out, f"fwht_peer{suffix}", False)
    if args.peer_only:
        return 0
    rows = measure(sizes, args.batch, min_run_time, rounds, "quick" if args.quick else "full")
    table = ratios(rows)
    text = markdown(table, args.batch) + "\n" + peer_text
    print(text)

    stem = f"fwht{suffix}"
    save_tables(args.out, stem, environment(), table, text)
    report_saved(args.out, stem, plot(table, args.out / f"{stem}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

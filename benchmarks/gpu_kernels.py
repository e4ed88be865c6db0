"""Time the Triton GPU kernels against the pure-PyTorch reference and a dense matrix product, in one run.

For D = 2^7 ... 2^15 and ``--rows`` rows (default 4096) on one CUDA device:

* ``fwht``: the Triton kernel (``torch.ops.pyro_whvi.fwht``) vs the reference (``log2 D`` batched
  butterfly stages in PyTorch) and, where installed, Dao's ``fast_hadamard_transform`` (CUDA);
* a device-to-device copy of the input (``clone``, the bandwidth floor): the table gives the FWHT's
  achieved GB/s against the copy's;
* ``whvi_matvec`` forward + backward: the fused Triton kernels vs the reference vs a dense
  ``x @ W.T`` with a ``D x D`` weight (the cost WHVI avoids), forward + backward.

Times are medians of ``torch.utils.benchmark`` (CUDA-synchronized), in float32 and bfloat16. Results go
to ``--out`` as JSON, CSV and markdown. Needs a CUDA GPU and Triton; without them it says so and exits
with status 2. Not yet run by this project (no GPU has been available to it).

    python benchmarks/gpu_kernels.py            # on a machine with a CUDA GPU (also: whvi bench fwht --device cuda)
    python benchmarks/gpu_kernels.py --static   # anywhere with Triton: registers, spills, shared memory, byte floors
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils import benchmark

from pyro_whvi import ops
from pyro_whvi.ops import reference, triton_backend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, report_saved, save_tables


def _time(min_run_time: float, fn, *args, **kwargs) -> float:
    """Milliseconds per ``fn(*args, **kwargs)``."""
    fn(*args, **kwargs)  # compile / warm up
    torch.cuda.synchronize()
    timer = benchmark.Timer(stmt="fn(*args, **kwargs)", globals={"fn": fn, "args": args, "kwargs": kwargs})
    return float(timer.blocked_autorange(min_run_time=min_run_time).median) * 1e3


def _forward_backward(op, *inputs) -> None:
    op(*inputs).sum().backward()


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def static_table(sizes: list[int]) -> str:
    """Registers, spills and shared memory of every kernel compiled ahead of time (no GPU needed)."""
    module = triton_backend.kernels()
    if module is None:
        raise RuntimeError("static_table needs Triton: pip install triton.")
    lines = ["| kernel | D | dtype | sm_80 registers / spill B / shared B | sm_90 registers / spill B / shared B |"]
    lines.append("|---|---|---|---|---|")
    for kernel in triton_backend.KERNELS:
        for size in sizes:
            for dtype in (torch.float32, torch.bfloat16, torch.float64):
                fused = module.max_fused_size(kernel, dtype == torch.float64)
                if size > fused:
                    continue
                cells = []
                for arch in (80, 90):
                    usage = triton_backend.resource_usage(kernel, size, dtype, arch)
                    cells.append(f"{usage['registers']} / {usage['spill_bytes']} / {usage['shared_bytes']}")
                name = str(dtype).removeprefix("torch.")
                lines.append(f"| {kernel} | {size} | {name} | {cells[0]} | {cells[1]} |")
                print(lines[-1], flush=True)
    return "\n".join(lines)


def floor_table(sizes: list[int], rows: int, bandwidth: float = 3.0e12) -> str:
    """Bytes each call moves (read once, written once) and the time they take at ``bandwidth`` bytes/s."""
    lines = ["| D | fwht bytes (fp32) | floor at 3 TB/s | whvi_matvec fwd+bwd bytes | floor |", "|---|---|---|---|---|"]
    for size in sizes:
        fwht_bytes = 2 * rows * size * 4  # read x, write y
        matvec_bytes = 10 * rows * size * 4  # forward: x, g, y; backward: grad, x, g, and four products
        lines.append(
            f"| {size} | {fwht_bytes / 1e6:.1f} MB | {fwht_bytes / bandwidth * 1e6:.1f} us | "
            f"{matvec_bytes / 1e6:.1f} MB | {matvec_bytes / bandwidth * 1e6:.1f} us |"
        )
    return "\n".join(lines)


def measure(sizes: list[int], rows: int, dtype: torch.dtype, min_run_time: float) -> list[dict[str, Any]]:
    try:
        from fast_hadamard_transform import hadamard_transform  # Dao's CUDA kernel, if installed
    except ImportError:
        hadamard_transform = None
    results = []
    for size in sizes:
        x = torch.randn(rows, size, device="cuda", dtype=dtype)
        row: dict[str, Any] = {"D": size, "rows": rows, "dtype": str(dtype).removeprefix("torch.")}
        row["copy_ms"] = _time(min_run_time, _copy, x)
        row["fwht_triton_ms"] = _time(min_run_time, ops.fwht, x)
        moved = 2 * x.numel() * x.element_size()
        row["fwht_triton_GBps"] = moved / row["fwht_triton_ms"] / 1e6
        row["copy_GBps"] = moved / row["copy_ms"] / 1e6
        row["fwht_reference_ms"] = _time(min_run_time, reference.fwht, x)
        if hadamard_transform is not None:
            row["fwht_dao_ms"] = _time(min_run_time, hadamard_transform, x, scale=size**-0.5)
        leaves = [torch.randn(n, size, device="cuda", dtype=dtype, requires_grad=True) for n in (rows, 1, rows, 1)]
        xs, s1, g, s2 = leaves[0], leaves[1][0], leaves[2], leaves[3][0]
        row["matvec_triton_ms"] = _time(min_run_time, _forward_backward, ops.whvi_matvec, xs, s1, g, s2)
        row["matvec_reference_ms"] = _time(min_run_time, _forward_backward, reference.whvi_matvec, xs, s1, g, s2)
        weight = torch.randn(size, size, device="cuda", dtype=dtype, requires_grad=True)
        row["dense_ms"] = _time(min_run_time, _forward_backward, torch.nn.functional.linear, xs, weight)
        results.append(row)
        print(row, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--max-log2-d", type=int, default=15)
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--static", action="store_true", help="print the kernels' static resources and byte floors")
    args = parser.parse_args(argv)
    sizes = [2**k for k in range(7, args.max_log2_d + 1)]
    if args.static:
        if not triton_backend.triton_available():
            print("gpu_kernels.py --static: needs Triton (pip install triton).", file=sys.stderr)
            return 2
        print(floor_table(sizes, args.rows))
        print(static_table([2, 16, 64, 128, 1024, 8192]))
        return 0
    if not torch.cuda.is_available():
        print("gpu_kernels.py: needs a CUDA GPU (torch.cuda.is_available() is False).", file=sys.stderr)
        return 2
    if not triton_backend.triton_available():
        print("gpu_kernels.py: needs Triton (pip install triton).", file=sys.stderr)
        return 2
    rows = [r for dtype in (torch.float32, torch.bfloat16) for r in measure(sizes, args.rows, dtype, args.min_run_time)]
    text = "\n".join(
        f"| {r['D']} | {r['dtype']} | {r['copy_ms']:.3f} | {r['fwht_triton_ms']:.3f} "
        f"({r['fwht_triton_GBps']:.0f} GB/s of the copy's {r['copy_GBps']:.0f}) | {r['fwht_reference_ms']:.3f} | "
        f"{r.get('fwht_dao_ms', float('nan')):.3f} | {r['matvec_triton_ms']:.3f} | {r['matvec_reference_ms']:.3f} | "
        f"{r['dense_ms']:.3f} |"
        for r in rows
    )
    header = (
        "| D | dtype | copy | fwht Triton | fwht reference | fwht Dao | matvec fwd+bwd Triton | reference | dense |\n"
    )
    text = header + "|" + "---|" * 9 + "\n" + text
    print(text)
    meta = environment(device=torch.cuda.get_device_name(), rows=args.rows)
    save_tables(args.out, "gpu_kernels", meta, rows, text)
    report_saved(args.out, "gpu_kernels", False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

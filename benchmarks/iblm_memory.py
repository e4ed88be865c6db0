"""How much memory I-BLM takes above the guide it initializes, with glibc's allocator as it comes and pinned.

Each measurement is a fresh process (one thread): a ``BayesianMLP`` of three hidden layers of ``--widths`` units
(the ``deep`` protocol's shape) over 8 inputs with its ``AutoWHVIGuide`` (``build_method("whvi", ...)``), then
:func:`pyro_whvi.iblm_` on ``--rows`` rows of a smooth function with noise. Reported: the resident memory before
I-BLM, its peak during I-BLM (``VmHWM`` after resetting it through ``/proc/self/clear_refs``), the difference, and
the CPU seconds. Each process runs twice, with glibc's defaults and with ``MALLOC_MMAP_THRESHOLD_`` pinned at
1 MiB: glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, so later blocks of up to
that size come from the heap, which grows wherever small blocks kept alive sit between them. With the threshold
pinned every block above 1 MiB is mapped and unmapped on its own, so the pinned run's peak is the working set
and the ratio between the two runs is the heap's growth.

    python benchmarks/iblm_memory.py --out benchmarks/results/iblm_memory

Linux only (``/proc``). Writes ``iblm_memory.json`` / ``.csv`` / ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyro
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, save_tables

from pyro_whvi import iblm_
from pyro_whvi.experiments.methods import build_method

INPUTS = 8
PINNED_THRESHOLD = 1 << 20  #: bytes: every block above it mapped on its own


def _status(field: str) -> float:
    """GB of a ``/proc/self/status`` field (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(width: int, rows: int) -> dict[str, float]:
    """In this process: the memory and CPU seconds of I-BLM on a 3 x ``width`` WHVI network."""
    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    x = torch.rand(rows, INPUTS) * 2 - 1
    y = (torch.sin(3 * x[:, :4]).sum(-1, keepdim=True) + x[:, 4:].pow(2).sum(-1, keepdim=True)) / 2
    y = y + 0.1 * torch.randn_like(y)
    _, guide = build_method("whvi", [INPUTS, width, width, width, 1])
    guide(x[:2], y[:2])
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _status("VmRSS")
    start = time.process_time()
    iblm_(guide, (x, y), progress=False)
    return {"rss_before_gb": before, "peak_gb": _status("VmHWM"), "cpu_s": time.process_time() - start}


def run_child(width: int, rows: int, pinned: bool) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if pinned:
        env["MALLOC_MMAP_THRESHOLD_"] = str(PINNED_THRESHOLD)
    command = [sys.executable, __file__, "--child", str(width), "--rows", str(rows)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement of width {width} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="256,512,1024", help="hidden widths, comma-separated")
    parser.add_argument("--rows", type=int, default=18_000)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/iblm_memory"))
    parser.add_argument("--stem", default="iblm_memory")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not Path("/proc/self/clear_refs").exists():
        parser.error("this benchmark reads /proc/self/status and resets it through /proc/self/clear_refs: Linux only")
    if args.child is not None:
        print(json.dumps(measure(args.child, args.rows)))
        return 0
    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        parser.error(f"--widths expected comma-separated integers, got {args.widths!r}")
    if min(widths) < 1 or args.rows < 2:
        parser.error("--widths expected integers >= 1 and --rows >= 2")
    rows: list[dict[str, Any]] = []
    for width in widths:
        measured = {pinned: run_child(width, args.rows, pinned) for pinned in (False, True)}
        extra = {pinned: m["peak_gb"] - m["rss_before_gb"] for pinned, m in measured.items()}
        for pinned, m in measured.items():
            rows.append(
                {
                    "width": width,
                    "allocator": "mmap threshold pinned at 1 MiB" if pinned else "glibc defaults",
                    **m,
                    "extra_gb": extra[pinned],
                    "extra_over_pinned": extra[pinned] / extra[True],
                }
            )
        print(f"width {width}: {rows[-2]}\n{' ' * 11}{rows[-1]}")
    text = "\n".join(
        [
            f"I-BLM (`iblm_` with its defaults) on a WHVI network of 3 hidden layers over {INPUTS} inputs, "
            f"{args.rows:,} rows, one thread, each a fresh process. GB above the RSS before `iblm_` at its peak:",
            "",
            "| width | allocator | RSS before (GB) | peak (GB) | peak above before (GB) | that over pinned | CPU s |",
            "|---|---|---|---|---|---|---|",
            *(
                f"| {r['width']} | {r['allocator']} | {r['rss_before_gb']:.2f} | {r['peak_gb']:.2f} | "
                f"{r['extra_gb']:.2f} | {r['extra_over_pinned']:.2f}x | {r['cpu_s']:.0f} |"
                for r in rows
            ),
        ]
    )
    save_tables(args.out, args.stem, environment(**vars(args) | {"out": str(args.out)}), rows, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``whvi bench``: the speed benchmarks of the source checkout's ``benchmarks/`` folder, by name.

Each benchmark times our op against a baseline in the same run and writes a table, JSON/CSV and a
plot (see the script's docstring):

=========  ===============================  =================================================
``fwht``   ``benchmarks/fwht.py``           fwht / fused whvi_matvec vs dense matmul and the reference
``svi``    ``benchmarks/svi_step.py``       one SVI step, AutoWHVIGuide vs AutoNormal, widening networks
``vsd``    ``benchmarks/vsd_speed.py``      VSD epoch time (T = 1, 2) vs the deterministic network
``gp``     ``benchmarks/gp_speed.py``       structured vs dense random features; RF-WHVI vs SVGP steps
=========  ===============================  =================================================

The scripts live in the repository, not in the installed package: run from a clone
(``pip install -e .``), or pass ``--benchmarks DIR``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

__all__ = ["BENCHMARKS", "find_benchmarks", "run_benchmark"]

BENCHMARKS = {"fwht": "fwht.py", "svi": "svi_step.py", "vsd": "vsd_speed.py", "gp": "gp_speed.py"}
QUICK_FLAGS = {"fwht": ["--quick"], "svi": ["--quick"], "vsd": ["--repeats", "2"], "gp": ["--quick"]}


def find_benchmarks(directory: Path | None = None) -> Path:
    """The ``benchmarks/`` folder: ``directory``, else the one next to this package in a source checkout.

    :raises FileNotFoundError: naming where it looked and how to get the scripts.
    """
    candidates = [directory] if directory is not None else [Path(__file__).resolve().parents[2] / "benchmarks"]
    for candidate in candidates:
        if candidate is not None and all((candidate / script).is_file() for script in BENCHMARKS.values()):
            return candidate
    raise FileNotFoundError(
        f"no benchmark scripts in {candidates[0]}: whvi bench runs the scripts of a source checkout "
        "(git clone the repository and pip install -e . there, or pass --benchmarks DIR)"
    )


def run_benchmark(
    name: str, directory: Path, quick: bool = False, out: Path | None = None, device: str = "cpu"
) -> None:
    """Run benchmark ``name`` (a key of :data:`BENCHMARKS`) as its script would run from the command line.

    ``device="cuda"`` is for ``fwht`` (the Triton kernels); the others time the CPU.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    if device != "cpu" and name != "fwht":
        raise ValueError(f"benchmark {name!r} runs on the CPU only; --device {device} is for fwht")
    script = directory / BENCHMARKS[name]
    argv = [str(script), *(QUICK_FLAGS[name] if quick else []), *(["--out", str(out)] if out else [])]
    argv += ["--device", device] if device != "cpu" else []
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = argv
    sys.path.insert(0, str(directory))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path

"""Time the planar flow: Pyro's ``Planar`` module against the fused ``pyro_whvi.ops.planar_flow``, in one run.

A call is the map and its log-determinant, forward and backward (``(y.sum() + log_det.sum()).backward()``), on
float64 CPU tensors in one thread, for inputs of ``(D,)`` (a weight site's own draw of ``g``) and ``(128, D)`` (the
per-example draws of a batch of 128):

* ``pyro``: ``flow(x)`` and ``flow.log_abs_det_jacobian(x, y)`` of ``pyro.distributions.transforms.Planar`` (what
  NF-WHVI ran before issue 50), the baseline of the ratios;
* ``fused``: ``ops.planar_flow(x, flow.u, flow.w, flow.bias)`` on the compiled CPU kernel (one op forward, one
  backward);
* ``reference``: the same on the reference backend (differentiable torch ops, the path of other devices).

Each op timing includes one ``backward()`` call, whose start-up alone is some 45 us here. Then one training step of
NF-WHVI (``AutoWHVIGuide(flows=3)``) on the demo's toy network (1-128-128-1, cosine, 128 points, every weight and
bias under WHVI: three flows on six sites and on the per-example draws) through ``JitTrace_ELBO`` and one fused
Adam, its graph recorded with the flows on Pyro's modules (``pyro``) or on the fused op. Times are medians of
``torch.utils.benchmark`` blocked runs, the best of 3 interleaved rounds.

    python benchmarks/planar_flow.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyro
import torch
import torch.utils.benchmark as benchmark
from pyro.distributions.transforms import Planar

from pyro_whvi import ops
from pyro_whvi.data import TOY_NOISE_SCALE, toy_regression_1d
from pyro_whvi.distributions.planar import _OwnCache
from pyro_whvi.experiments.methods import make_guide
from pyro_whvi.infer import JitTrace_ELBO
from pyro_whvi.nn import BayesianMLP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, save_tables


def _time(fn: Callable[[], Any], min_run_time: float) -> float:
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
    return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def _op_cases(shape: tuple[int, ...]) -> dict[str, Callable[[], None]]:
    flow = Planar(shape[-1]).double()
    x = torch.randn(shape, requires_grad=True)

    def pyro_call() -> None:
        flow._cached_x_y = None, None  # the module's one-draw cache would hand back the last call's y
        y = flow(x)
        (y.sum() + flow.log_abs_det_jacobian(x, y).sum()).backward()

    def fused(backend: str) -> Callable[[], None]:
        def call() -> None:
            with ops.use_backend(backend):
                y, log_det = ops.planar_flow(x, flow.u, flow.w, flow.bias)
            (y.sum() + log_det.sum()).backward()

        return call

    return {"pyro": pyro_call, "fused": fused("compiled"), "reference": fused("reference")}


@contextlib.contextmanager
def _pyro_flows() -> Iterator[None]:
    """NF-WHVI's flows through Pyro's ``Planar`` modules, as before issue 50 (for the baseline step)."""

    def call(self: Any, x: torch.Tensor) -> torch.Tensor:
        y = self.flow(x)
        self._log_det = self.flow.log_abs_det_jacobian(x, y)
        return y

    fused = _OwnCache._call
    _OwnCache._call = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        _OwnCache._call = fused  # type: ignore[method-assign]


def _nf_step(flows: str) -> Callable[[], None]:
    """One NF-WHVI step on the toy network; ``flows``: ``"pyro"`` or ``"fused"`` (the graph is traced with them)."""
    x, y = toy_regression_1d(128, seed=0)
    pyro.clear_param_store()
    pyro.set_rng_seed(1)
    model = BayesianMLP([1, 128, 128, 1], activation=torch.cos, noise_scale=TOY_NOISE_SCALE, learn_noise=False)
    guide = make_guide("nf-whvi", model, flows=3, expose="all")
    loss = JitTrace_ELBO()(model, guide)
    with _pyro_flows() if flows == "pyro" else contextlib.nullcontext():
        loss(x, y)  # creates the parameters and records the graph
    adam = torch.optim.Adam(loss.parameters(), lr=1e-3, fused=True)

    def step() -> None:
        with torch.jit.optimized_execution(False):
            adam.zero_grad()
            loss(x, y).backward()
            adam.step()

    return step


def measure(sizes: list[int], min_run_time: float, rounds: int) -> list[dict[str, Any]]:
    cases: dict[str, dict[str, Callable[[], None]]] = {}
    for size in sizes:
        for batch in (None, 128):
            shape = (size,) if batch is None else (batch, size)
            cases[f"planar {tuple(shape)}"] = _op_cases(shape)
    cases["NF-WHVI toy step"] = {"pyro": _nf_step("pyro"), "fused": _nf_step("fused")}
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for label, fns in cases.items():
            for name, fn in fns.items():
                seconds = _time(fn, min_run_time)
                best[label, name] = min(best.get((label, name), float("inf")), seconds)
    rows = []
    for label, fns in cases.items():
        row: dict[str, Any] = {"case": label}
        for name in fns:
            row[f"{name} (us)"] = round(best[label, name] * 1e6, 1)
        row["speed-up of fused"] = round(best[label, "pyro"] / best[label, "fused"], 2)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = ["case", "pyro (us)", "reference (us)", "fused (us)", "speed-up of fused"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(column, "")) for column in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,128,1024", help="comma-separated D (default 16,128,1024)")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds per timed block (default 0.3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, the best kept (default 3)")
    parser.add_argument("--out", type=Path, default=None, help="folder for planar_flow.{json,csv,md}")
    args = parser.parse_args(argv)
    if not ops.compiled_available():
        print("planar_flow: the compiled CPU kernels are unavailable (python -m pyro_whvi.ops.build)", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    rows = measure([int(s) for s in args.sizes.split(",")], args.min_run_time, args.rounds)
    table = markdown(rows)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        save_tables(args.out, "planar_flow", environment(), rows, table)
        print(f"\nsaved {args.out / 'planar_flow'}.{{json,csv,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time one training step of a Bayesian MLP: Pyro SVI with AutoWHVIGuide and AutoNormal, the variational
layers of ``pyro_whvi.nn`` (eager and ``torch.compile``), and plain PyTorch, in one run.

The network is two hidden layers of width D on D inputs with one output, for D = 2^7 ... 2^12, on one
fixed batch (default 64 rows) of float32 inputs, on the CPU or (``--device cuda``) the first CUDA GPU: the
networks, the guides' parameters and the batch live there. A step is one ELBO sample (or loss),
forward, backward and an Adam update (``torch.optim.Adam``, lr 1e-3): ``fused=True`` (one kernel over all the
tensors) in every case but Pyro's default path (``AutoNormal`` / ``WHVI``), which uses ``pyro.optim``'s:

* ``plain``: ``nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)`` with a Gaussian likelihood and a
  learned noise scale: the cost of the network itself, the baseline of every ratio (one fused Adam);
* ``plain compiled``: the same loss through ``torch.compile(fullgraph=True)`` (the backend of every
  ``torch.compile`` case is ``--compile-backend``, default ``inductor``);
* ``layers``: the same ``nn.Sequential`` through ``pyro_whvi.nn.bayesian_(net, "whvi",
  mean_field_last_layer=True)``: WHVI on the two ``D x D``-ish weights, mean-field biases and output
  layer (the posterior family of AutoWHVIGuide's defaults on ``BayesianMLP``), loss
  ``-log p(y | f(x)) + KL``, plain PyTorch;
* ``layers compiled``: that loss through ``torch.compile(fullgraph=True, options={"fallback_random":
  True})`` (eager's random-number generator: Inductor's own draws normals element by element, which
  took 1.8 ms against 0.87 ms per step at D = 128 here);
* ``AutoNormal`` / ``WHVI``: ``svi.step(x, y)`` with Pyro's ``SVI``, ``Trace_ELBO`` and
  ``pyro_whvi.nn.networks.BayesianMLP([D, D, D, 1])`` under ``AutoNormal(model)`` or ``AutoWHVIGuide(model)``
  (defaults), Pyro validation off, ``pyro.optim``'s Adam (one ``torch.optim.Adam`` per parameter tensor, torch's
  defaults: Pyro's default path);
* ``AutoNormal, JIT`` / ``WHVI, JIT``: the fast path (``docs/getting-started.md``): the same ``svi.step`` with
  ``pyro_whvi.infer.JitTrace_ELBO`` (Pyro's, compiled by ``torch.jit.trace``) and ``pyro_whvi.infer.JointOptim``
  (one fused ``torch.optim.Adam`` for all the parameters, which sets their gradients to ``None`` after the step);
* ``AutoNormal, JIT torch.compile`` / ``WHVI, JIT torch.compile``: the same with
  ``JitTrace_ELBO(backend=...)``, the ELBO recorded at the aten level and compiled by ``torch.compile``
  (Inductor: fused kernels, seconds to compile);
* ``WHVI, ELBOModule``: Pyro's module path, ``elbo = JitTrace_ELBO()(model, guide)`` with one
  fused ``torch.optim.Adam(elbo.parameters())``: ``zero_grad``, ``elbo(x, y).backward()``, ``step``.

Each case takes a set-up step and 3 warm-up steps first (compilation happens there; a second table gives their wall
time, which depends on the state of torch.compile's on-disk caches). Times are medians of
``torch.utils.benchmark`` blocked runs using all of torch's threads (or ``--threads``), the best of 3
interleaved rounds (2 with ``--quick``), so that every case sees the same machine state; ``--clock cpu`` times
this process's CPU time instead of the wall clock (on cores shared with other work it leaves out the time the
process waits). Also reported: the number of variational parameters of the two guides and of the layers.
Results go to ``--out`` as JSON, CSV, a markdown table and a plot of time vs D (``svi_step*``; on CUDA
``svi_step_cuda*``; ``--clock cpu`` adds ``_cpu_time``). Other processes on the cores slow multi-threaded steps
badly; try ``--threads 1``. On CUDA the timer synchronizes the device around each timed block, and the SVI steps
include Pyro's own host sync (``svi.step`` returns a float).

    python benchmarks/svi_step.py --quick                  # D up to 2^10
    python benchmarks/svi_step.py                          # full sweep
    python benchmarks/svi_step.py --device cuda            # on the GPU (Triton kernels), D up to 2^12
    python benchmarks/svi_step.py --quick --threads 1 --clock cpu   # CPU time, on a shared machine
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.optim import PyroOptim
from pyro.params.param_store import StateDict
from torch import nn
from torch.utils import benchmark
from tqdm import tqdm

from pyro_whvi import AutoWHVIGuide, ops
from pyro_whvi.experiments.arguments import check_device
from pyro_whvi.infer import JitTrace_ELBO, JointOptim
from pyro_whvi.infer.tracing import INDUCTOR_OPTIONS, check_backend
from pyro_whvi.nn import BayesianMLP, bayesian_, kl_divergence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import environment, report_saved, save_figure, save_tables, style_log_axes

#: Column key and label of every case; ``plain`` is the baseline of the ratios.
CASES = {
    "plain": "plain PyTorch",
    "plain_compiled": "plain PyTorch, compiled",
    "layers": "pyro_whvi.nn layers",
    "layers_compiled": "pyro_whvi.nn layers, compiled",
    "autonormal": "SVI AutoNormal",
    "whvi": "SVI AutoWHVIGuide",
    "autonormal_jit": "SVI AutoNormal, JIT",
    "whvi_jit": "SVI AutoWHVIGuide, JIT",
    "autonormal_jit_compile": "SVI AutoNormal, JIT torch.compile",
    "whvi_jit_compile": "SVI AutoWHVIGuide, JIT torch.compile",
    "whvi_module": "AutoWHVIGuide, JIT ELBOModule",
}
SVI_CASES = (
    *("autonormal", "whvi", "autonormal_jit", "whvi_jit"),
    *("autonormal_jit_compile", "whvi_jit_compile", "whvi_module"),
)
WARMUP_STEPS = 3
#: The Adam of every case but Pyro's default path (``_adam``): one fused kernel over all the tensors.
FUSED_ADAM: dict[str, Any] = {"lr": 1e-3, "fused": True}


def _adam() -> PyroOptim:
    return PyroOptim(torch.optim.Adam, {"lr": 1e-3})  # what pyro.optim.Adam is, without the dynamic attribute


def _network(size: int, device: torch.device) -> nn.Sequential:
    layers = (nn.Linear(size, size), nn.ReLU(), nn.Linear(size, size), nn.ReLU(), nn.Linear(size, 1))
    return nn.Sequential(*layers).to(device)


def _torch_step(
    case: str, size: int, x: torch.Tensor, y: torch.Tensor, compile_backend: str
) -> tuple[Callable[[], Any], int]:
    """A plain-PyTorch training step (``plain*`` or ``layers*``) and its number of parameters."""
    network = _network(size, x.device)
    if case.startswith("layers"):
        bayesian_(network, "whvi", mean_field_last_layer=True)
    log_noise = nn.Parameter(torch.zeros((), device=x.device))
    parameters = [*network.parameters(), log_noise]
    optimizer = torch.optim.Adam(parameters, lr=FUSED_ADAM["lr"], fused=True)
    bayesian = case.startswith("layers")

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        likelihood = torch.distributions.Normal(network(x).squeeze(-1), log_noise.exp(), validate_args=False)
        loss = -likelihood.log_prob(y).sum()
        return loss + kl_divergence(network) if bayesian else loss

    if case.endswith("compiled"):
        options = INDUCTOR_OPTIONS if compile_backend == "inductor" else None
        loss_fn = torch.compile(loss_fn, fullgraph=True, backend=compile_backend, options=options)

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(x, y)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(1 + WARMUP_STEPS):
        loss = step()
    if not math.isfinite(loss.item()):
        raise RuntimeError(f"{case} at D={size}: non-finite loss {loss.item()} after warm-up")
    return step, sum(p.numel() for p in parameters)


def _svi_step(
    case: str, size: int, x: torch.Tensor, y: torch.Tensor, compile_backend: str
) -> tuple[Callable[[], Any], StateDict, int]:
    """A set-up and warmed-up SVI (or ELBOModule) step for one guide, its param-store scope and its parameter count."""
    model = BayesianMLP([size, size, size, 1]).to(x.device)  # its priors follow; the guide's params go there
    with pyro.get_param_store().scope() as state:
        guide: AutoNormal | AutoWHVIGuide
        guide = AutoWHVIGuide(model) if case.startswith("whvi") else AutoNormal(model)
        if case == "whvi_module":
            step = _module_step(JitTrace_ELBO()(model, guide), x, y)
        else:
            jit = "_jit" in case
            backend = compile_backend if case.endswith("_compile") else "torchscript"
            optim = JointOptim(torch.optim.Adam, FUSED_ADAM) if jit else _adam()
            svi = SVI(model, guide, optim, JitTrace_ELBO(backend=backend) if jit else Trace_ELBO())
            step = lambda: svi.step(x, y)  # noqa: E731
        loss = step()  # sets the guide up (and compiles), with Pyro's validation as configured
        with pyro.validation_enabled(False):
            for _ in range(WARMUP_STEPS):
                loss = step()
        if not math.isfinite(float(loss)):
            raise RuntimeError(f"{case} at D={size}: non-finite loss {float(loss)} after warm-up")
    return step, state, sum(p.numel() for p in guide.parameters())


def _module_step(elbo: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], Any]:
    """``ELBOModule`` with one ``torch.optim.Adam`` over its parameters (created by the first call)."""
    optimizer: list[torch.optim.Optimizer] = []

    def step() -> torch.Tensor:
        if optimizer:
            optimizer[0].zero_grad()
        loss = elbo(x, y)
        loss.backward()
        if not optimizer:
            optimizer.append(torch.optim.Adam(elbo.parameters(), lr=FUSED_ADAM["lr"], fused=True))
        optimizer[0].step()
        return loss.detach()

    return step


def _setup(
    case: str, size: int, x: torch.Tensor, y: torch.Tensor, compile_backend: str
) -> tuple[Callable[[], Any], StateDict | None, int]:
    if case in SVI_CASES:
        return _svi_step(case, size, x, y, compile_backend)
    step, count = _torch_step(case, size, x, y, compile_backend)
    return step, None, count


def _time(step: Callable[[], Any], state: StateDict | None, min_run_time: float, clock: str = "wall") -> float:
    timer_fn = time.process_time if clock == "cpu" else time.perf_counter
    with pyro.get_param_store().scope(state), pyro.validation_enabled(False):
        timer = benchmark.Timer(stmt="fn()", globals={"fn": step}, num_threads=torch.get_num_threads(), timer=timer_fn)
        return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def measure(
    sizes: list[int],
    batch: int,
    min_run_time: float,
    rounds: int,
    label: str,
    device: str = "cpu",
    clock: str = "wall",
    compile_backend: str = "inductor",
) -> list[dict[str, Any]]:
    """One row per D; each D's cases run in ``rounds`` interleaved rounds and the fastest median is kept.
    The batch is drawn on the CPU (the same numbers on every device) and moved to ``device``."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    with tqdm(total=len(sizes) * rounds * len(CASES), desc=f"timing ({label})", unit="case") as progress:
        for size in sizes:
            x = torch.randn(batch, size, generator=generator, dtype=torch.float32).to(device)
            y = torch.randn(batch, generator=generator, dtype=torch.float32).to(device)
            pyro.set_rng_seed(0)
            cases, setup_seconds = {}, {}
            for case in CASES:  # wall time: compilers run in other processes too
                start = time.perf_counter()
                cases[case] = _setup(case, size, x, y, compile_backend)
                setup_seconds[case] = time.perf_counter() - start
            best = dict.fromkeys(CASES, math.inf)
            for _ in range(rounds):
                for case, (step, state, _) in cases.items():
                    best[case] = min(best[case], _time(step, state, min_run_time, clock))
                    progress.update()
            row: dict[str, Any] = {"D": size, "batch": batch}
            row.update(autonormal_params=cases["autonormal"][2], whvi_params=cases["whvi"][2])
            row.update(layers_params=cases["layers"][2])
            row.update({f"{case}_ms_per_step": best[case] * 1e3 for case in CASES})
            row.update({f"{case}_setup_s": setup_seconds[case] for case in CASES})
            row.update({f"{case}_over_plain": best[case] / best["plain"] for case in CASES if case != "plain"})
            row["whvi_jit_over_autonormal_jit"] = best["whvi_jit"] / best["autonormal_jit"]
            row["whvi_jit_compile_over_autonormal_jit_compile"] = (
                best["whvi_jit_compile"] / best["autonormal_jit_compile"]
            )
            rows.append({**row, "whvi_over_autonormal": best["whvi"] / best["autonormal"]})
            del cases
            gc.collect()
    return rows


def _where(device: str, threads: int) -> str:
    """The device in words: ``CPU, 2 threads`` or the GPU's name."""
    return f"CPU, {threads} threads" if device == "cpu" else torch.cuda.get_device_name()


def markdown(
    rows: list[dict[str, Any]],
    batch: int,
    threads: int,
    device: str = "cpu",
    clock: str = "wall",
    compile_backend: str = "inductor",
) -> str:
    what = "CPU time of the process" if clock == "cpu" else "wall time"
    lines = [
        f"\n### One training step of a [D, D, D, 1] Bayesian MLP, batch {batch}, fp32, {_where(device, threads)} "
        f"(ms per step, {what}; in brackets: over plain PyTorch). Adam: one fused torch.optim.Adam in every case "
        "but SVI AutoNormal / SVI AutoWHVIGuide (pyro.optim's: one torch.optim.Adam per parameter tensor). JIT: "
        f"JitTrace_ELBO, by torch.jit.trace or, where named, by torch.compile. torch.compile's backend: "
        f"{compile_backend!r}\n",
        "| D | " + " | ".join(CASES.values()) + " | params AutoNormal / AutoWHVIGuide / layers |",
        "|---|" + "---|" * (len(CASES) + 1),
    ]
    for r in rows:
        cells = [f"{r['plain_ms_per_step']:.3f}"]
        cells += [
            f"{r[f'{case}_ms_per_step']:.3f} ({r[f'{case}_over_plain']:.3g}x)" for case in CASES if case != "plain"
        ]
        counts = f"{r['autonormal_params']:,} / {r['whvi_params']:,} / {r['layers_params']:,}"
        lines.append(f"| {r['D']} | " + " | ".join(cells) + f" | {counts} |")
    lines += [
        f"\nSet-up of each case, wall seconds: building it, its first step (where the compiled cases compile) and "
        f"{WARMUP_STEPS} more; torch.compile's caches as this process found them\n",
        "| D | " + " | ".join(CASES.values()) + " |",
        "|---|" + "---|" * len(CASES),
    ]
    for r in rows:
        lines.append(f"| {r['D']} | " + " | ".join(f"{r[f'{case}_setup_s']:.2f}" for case in CASES) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], batch: int, threads: int, path: Path, device: str = "cpu") -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    sizes = [r["D"] for r in rows]
    for case, label in CASES.items():
        ax.plot(sizes, [r[f"{case}_ms_per_step"] for r in rows], marker="o", label=label)
    ax.set_ylabel("time per training step [ms]")
    title = f"[D, D, D, 1] Bayesian MLP, batch {batch} (fp32, {_where(device, threads)})"
    style_log_axes(ax, "D (hidden width)", title)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter runs and D up to 2^10")
    parser.add_argument("--batch", type=int, default=64, help="rows per step (default 64)")
    parser.add_argument("--max-log2-d", type=int, default=None, help="largest D as a power of two (default 12)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, 2 with --quick)")
    parser.add_argument("--min-run-time", type=float, default=None, help="seconds per timing (default 1, quick 0.2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the networks and the batch live (default cpu)"
    )
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="the backend of every torch.compile case: 'compiled' and 'JIT torch.compile' (default inductor)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time (default) or this process's CPU time, steadier where other processes share the cores",
    )
    args = parser.parse_args(argv)
    try:
        check_device(args.device)
        if args.compile_backend == "torchscript":
            raise ValueError("--compile-backend: a torch.compile backend, not torchscript (the 'JIT' cases' own)")
        check_backend(args.compile_backend, "--compile-backend")
    except ValueError as error:
        parser.error(str(error))
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
    # Every size compiles the same loss functions anew (two per size); Dynamo's default limit of 8
    # recompilations per function would end the sweep with a hard error under fullgraph=True.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(sizes))
    try:
        label = "quick" if args.quick else "full"
        rows = measure(sizes, args.batch, min_run_time, rounds, label, args.device, args.clock, args.compile_backend)
    finally:
        torch.set_default_dtype(previous_dtype)
        torch.set_num_threads(previous_threads)
    text = markdown(rows, args.batch, threads, args.device, args.clock, args.compile_backend)
    print(text)

    stem = "svi_step" + ("_cuda" if args.device == "cuda" else "") + ("_cpu_time" if args.clock == "cpu" else "")
    stem += "_quick" if args.quick else ""
    meta = environment(
        device=_where(args.device, threads),
        pyro=pyro.__version__,
        whvi_backend=backend,
        threads=threads,
        clock=args.clock,
        compile_backend=args.compile_backend,
        rounds=rounds,
        min_run_time=min_run_time,
        warmup_steps=WARMUP_STEPS,
        validation=False,
    )
    save_tables(args.out, stem, meta, rows, text)
    report_saved(args.out, stem, plot(rows, args.batch, threads, args.out / f"{stem}.png", args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())

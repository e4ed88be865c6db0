"""The ``whvi`` command line (also ``python -m pyro_whvi``).

    whvi demo [--out DIR] [--methods whvi,nf-whvi,mfg,mcd] [--toy-steps N] [--digits-steps N] [--jobs N]
    whvi uci [--data-dir DIR | --dataset diabetes] [--methods mfg,mcd,whvi] [--splits 0-4] [--steps N] ...
    whvi gp [--quick] [--functions ...] [--methods rf,rf-whvi,svgp-gpytorch,svgp-gpflow] [--out DIR]
    whvi bench [fwht,svi,vsd,gp] [--quick] [--out DIR]
    whvi synthetic [--out DIR] [--functions borehole,...] [--rows N] [--noise F] [--splits K]

Bad arguments and bad data get a one-line error (exit status 2), not a traceback; so do sizes that would not fit
in memory (:mod:`~pyro_whvi.experiments.memory_budget`). Training that diverges stops with one line (exit status
1), and Ctrl-C with one line (exit status 130).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..train.engine import TrainingDiverged
from .arguments import OneLineErrorParser, at_most, positive, samples, steps
from .demo import METHODS, DemoConfig, run_demo
from .synthetic_command import add_synthetic_command, run_synthetic_command
from .uci_command import add_uci_command, run_uci_command

__all__ = ["main"]


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(dict.fromkeys(m for m in text.split(",") if m))
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"unknown methods {unknown}; choose from {','.join(METHODS)}")
    return methods


def _parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="whvi", description="pyro_whvi: structured variational inference.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="1-D toy regression and digits classification with WHVI, NF-WHVI, MFG and MC dropout",
        description=(
            "Fit the WHVI paper's 1-D toy regression and scikit-learn's digits with WHVI, NF-WHVI, mean-field "
            "VI (AutoNormal) and MC dropout; print a table and write predictive bands and reliability diagrams."
        ),
    )
    demo.add_argument("--out", type=Path, default=Path("whvi_demo"), help="output folder (default ./whvi_demo)")
    demo.add_argument("--methods", type=_methods, default=METHODS, help=f"comma-separated, from {','.join(METHODS)}")
    demo.add_argument("--toy-steps", type=steps, default=DemoConfig.toy_steps, help="SVI steps on the toy problem")
    demo.add_argument("--digits-steps", type=steps, default=DemoConfig.digits_steps, help="SVI steps on digits")
    demo.add_argument("--samples", type=samples, default=DemoConfig.samples, help="posterior samples to predict")
    demo.add_argument(
        "--seed", type=at_most(2**32 - 2, "numpy's seeds; the networks use seed + 1", minimum=0), default=0
    )
    demo.add_argument(
        "--jobs", type=positive, default=None, help="worker processes, one thread each (default: one per core)"
    )
    add_uci_command(commands)
    gp = commands.add_parser(
        "gp",
        help="random-feature GPs (RF, RF-WHVI) vs inducing points (SVGP) at matched parameter counts",
        description=(
            "The WHVI paper's GP experiment (App. D.4, Fig. 13) on borehole, hartmann6, rastrigin5, robot and OTL "
            "circuit: test RMSE and MNLL vs the number of variational parameters, as a table and a plot."
        ),
    )
    from .gp import add_arguments

    add_arguments(gp, Path("whvi_gp"))
    gp.set_defaults(subparser=gp)  # finish_arguments reports bad values through the subcommand's parser
    _add_bench(commands)
    add_synthetic_command(commands)
    return parser


def _add_bench(commands) -> None:
    from .bench import BENCHMARKS

    bench = commands.add_parser(
        "bench",
        help="speed benchmarks (fwht, svi, vsd, gp): ratios against a baseline measured in the same run",
        description=(
            "Run the speed benchmarks of the source checkout's benchmarks/ folder: fwht (FWHT and the fused WHVI "
            "product vs dense matmul), svi (SVI step, WHVI vs AutoNormal), vsd (VSD epoch vs the deterministic "
            "network), gp (structured vs dense random features, RF-WHVI vs SVGP steps)."
        ),
    )
    bench.add_argument(
        "names", nargs="?", default="fwht", help=f"comma-separated, from {','.join(BENCHMARKS)} or all (default fwht)"
    )
    bench.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    bench.add_argument("--out", type=Path, help="output folder (default: each script's, benchmarks/results)")
    bench.add_argument("--benchmarks", type=Path, help="the benchmarks/ folder (default: the source checkout's)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the GPU kernels (fwht only)")
    bench.set_defaults(subparser=bench)


def _bench(args: argparse.Namespace) -> int:
    from .bench import BENCHMARKS, find_benchmarks, run_benchmark

    names = list(BENCHMARKS) if args.names == "all" else [n for n in args.names.split(",") if n]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown or not names:
        args.subparser.error(f"unknown benchmarks {unknown}; choose from {','.join(BENCHMARKS)} or all")
    if args.device != "cpu" and names != ["fwht"]:
        args.subparser.error(f"--device {args.device} is for the fwht benchmark only (the others time the CPU)")
    try:
        directory = find_benchmarks(args.benchmarks)
    except FileNotFoundError as error:
        args.subparser.error(str(error))
    for name in names:
        print(f"== whvi bench {name}", flush=True)
        run_benchmark(name, directory, quick=args.quick, out=args.out, device=args.device)
    return 0


def _gp(args: argparse.Namespace) -> int:
    import time

    import torch

    from ..data.synthetic import SYNTHETIC_FUNCTIONS
    from .gp import finish_arguments, run, save
    from .memory_checks import check_gp_memory

    args = finish_arguments(args.subparser, args)
    try:
        dims = [SYNTHETIC_FUNCTIONS[name].dim for name in args.functions]
        num_points = args.num_points or max(SYNTHETIC_FUNCTIONS[name].paper_size for name in args.functions)
        check_gp_memory(num_points, dims, args.blocks, args.covariances, args.batch_size)
    except ValueError as error:
        args.subparser.error(str(error))
    if "svgp-gpflow" in args.methods:
        try:
            from .baselines.gpflow_svgp import _import_gpflow

            _import_gpflow()
        except ImportError as error:
            print(f"whvi gp: {error} (or leave svgp-gpflow out of --methods)", file=sys.stderr)
            return 1
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        start = time.perf_counter()
        rows = run(args)
    finally:
        torch.set_default_dtype(previous)
    config = {k: str(v) for k, v in vars(args).items() if k != "subparser"}
    meta = {"config": config, "seconds": time.perf_counter() - start}
    print("\n" + save(rows, args, meta))
    print(f"\nwrote {args.out / args.stem}.{{json,csv,md,png}}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from ..ops import BackendEnvironmentError, get_backend

    try:
        get_backend()  # a bad $PYRO_WHVI_BACKEND is reported here, in one line, before anything runs
    except BackendEnvironmentError as error:
        print(f"whvi: {error}", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except TrainingDiverged as error:  # one line naming the step and the likely cause
        _say(f"whvi {args.command}: error: {error}")
        return 1
    except KeyboardInterrupt as error:  # Ctrl-C: one line, no traceback (TrainingInterrupted knows the step)
        step = getattr(error, "step", None)
        where = f" at step {step}" if step is not None else ""
        rerun = "resume" if args.command == "uci" else "start again"
        _say(f"whvi {args.command}: interrupted{where}; rerun the same command to {rerun}")
        return 130


def _say(message: str) -> None:
    """``message`` on stderr, on a line of its own below any progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(" ".join(message.splitlines()), file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    if args.command == "gp":
        return _gp(args)
    if args.command == "uci":
        return run_uci_command(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "synthetic":
        return run_synthetic_command(args)
    return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    from .memory_checks import check_demo_memory

    if args.out.exists() and not args.out.is_dir():
        print(f"whvi demo: --out {args.out} exists and is not a folder", file=sys.stderr)
        return 2
    config = DemoConfig(
        methods=args.methods,
        toy_steps=args.toy_steps,
        digits_steps=args.digits_steps,
        samples=max(2, args.samples),
        seed=args.seed,
        jobs=args.jobs or 0,
    )
    runs = len(config.methods) * (1 + len(config.kl_weights))
    try:
        check_demo_memory(
            config.samples, config.toy_steps, config.digits_steps, min(runs, args.jobs or os.cpu_count() or 1)
        )
    except ValueError as error:
        print(f"whvi demo: error: {error}", file=sys.stderr)
        return 2
    try:
        run_demo(args.out, config)
    except ImportError as error:
        print(f"whvi demo: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

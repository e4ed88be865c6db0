"""The ``whvi`` command line (also ``python -m pyro_whvi``).

    whvi demo [--out DIR] [--methods whvi,nf-whvi,mfg,mcd] [--toy-steps N] [--digits-steps N]
    whvi uci [--data-dir DIR | --dataset diabetes] [--methods mfg,mcd,whvi] [--splits 0-4] [--steps N] ...
    whvi gp [--quick] [--functions ...] [--methods rf,rf-whvi,svgp-gpytorch,svgp-gpflow] [--out DIR]
    whvi bench [fwht,svi,vsd,gp] [--quick] [--out DIR]
    whvi synthetic [--out DIR] [--functions borehole,...] [--rows N] [--noise F] [--splits K]

Bad arguments and bad data get a one-line error (exit status 2), not a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

from .demo import METHODS, DemoConfig, run_demo

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``whvi uci: error: ...`` (exit status 2), without the
    usage block (``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.splitlines())}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _methods(text: str) -> tuple[str, ...]:
    methods = tuple(m for m in text.split(",") if m)
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"unknown methods {unknown}; choose from {','.join(METHODS)}")
    return methods


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="whvi", description="pyro_whvi: structured variational inference.")
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
    demo.add_argument("--toy-steps", type=_positive, default=DemoConfig.toy_steps, help="SVI steps on the toy problem")
    demo.add_argument("--digits-steps", type=_positive, default=DemoConfig.digits_steps, help="SVI steps on digits")
    demo.add_argument("--samples", type=_positive, default=DemoConfig.samples, help="posterior samples to predict")
    demo.add_argument("--seed", type=int, default=0)
    _add_uci(commands)
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
    _add_synthetic(commands)
    return parser


def _add_synthetic(commands) -> None:
    from ..data.synthetic import SYNTHETIC_FUNCTIONS

    names = tuple(SYNTHETIC_FUNCTIONS)
    synthetic = commands.add_parser(
        "synthetic",
        help="regression sets with known noise, in the UCI split format: a bench whose best MNLL and RMSE are known",
        description=(
            "Write each closed-form function (WHVI App. D.4) on a Latin hypercube of its domain, plus Gaussian noise "
            "of standard deviation sigma = NOISE x std(f), as OUT/<function>/ in the UCI split format, with sigma in "
            "noise_std.txt. `whvi uci --data-dir OUT/<function>` then reports every method's distance to the floor "
            "(best RMSE sigma, best MNLL 0.5 log(2 pi sigma^2) + 0.5) and its noise estimate over sigma."
        ),
    )
    synthetic.add_argument("--out", type=Path, default=Path("whvi_synthetic"), help="output folder")
    synthetic.add_argument(
        "--functions",
        type=lambda text: _choices(text, names, "--functions"),
        default=names,
        help=f"comma-separated, from {','.join(names)} (default all)",
    )
    synthetic.add_argument("--rows", type=_positive, default=20_000, help="rows per set (default 20000)")
    synthetic.add_argument("--noise", type=_positive_float, default=0.2, help="sigma / std(f) (default 0.2)")
    synthetic.add_argument("--splits", type=_positive, default=5, help="random 90/10 splits (default 5)")
    synthetic.add_argument("--seed", type=_nonnegative, default=0)
    synthetic.set_defaults(subparser=synthetic)


def _choices(text: str, names: tuple[str, ...], flag: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in chosen if name not in names]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"{flag}: choose from {','.join(names)}, got {text!r}")
    return chosen


def _synthetic(args: argparse.Namespace) -> int:
    from .noisy_sets import write_noisy_set
    from .reporting import check_writable

    try:
        check_writable(args.out)
        for name in args.functions:
            sigma = write_noisy_set(
                name, args.out / name, num_points=args.rows, noise=args.noise, splits=args.splits, seed=args.seed
            )
            print(f"wrote {args.out / name} (sigma = {sigma:.4g})")
    except (ValueError, OSError) as error:
        args.subparser.error(str(error))
    print(f"\nnext: whvi uci --data-dir {args.out / args.functions[0]} --methods whvi,mcd --splits 0-{args.splits - 1}")
    return 0


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


def _nonnegative(text: str) -> int:
    return _positive(text) if text != "0" else 0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _uci_methods(text: str) -> tuple[str, ...]:
    from .methods import parse_method

    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    if not methods:
        raise argparse.ArgumentTypeError("expected comma-separated methods, e.g. mfg,mcd,whvi")
    try:
        return tuple(parse_method(m).name for m in methods)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _splits(text: str) -> tuple[int, ...]:
    from .uci import parse_splits

    try:
        return parse_splits(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_uci(commands) -> None:
    from .methods import BASE_METHODS, Schedule
    from .uci import BUNDLED_DATASETS, UCIConfig

    uci = commands.add_parser(
        "uci",
        help="Bayesian MLPs on UCI-format regression splits or bundled scikit-learn sets; resumable",
        description=(
            "Train a Bayesian MLP with each method on each split and report test RMSE/MNLL (regression, original "
            "units) or error/NLL/ECE/entropy (classification), mean ± standard error over splits. Finished splits "
            "are read back from OUT/runs instead of being trained again. Methods: "
            + ", ".join(BASE_METHODS)
            + ", each optionally with +iblm (I-BLM initialization). The defaults are the WHVI paper's set-up "
            "(App. D.1: 2x128 ReLU, batch 64, Adam 1e-3 decayed, noise fixed for 500 steps) with fewer steps."
        ),
    )
    source = uci.add_mutually_exclusive_group()
    source.add_argument("--data-dir", type=Path, help="a dataset directory in the UCI split format")
    source.add_argument("--dataset", choices=BUNDLED_DATASETS, help="a bundled scikit-learn set (default diabetes)")
    defaults, schedule = UCIConfig(), Schedule()
    uci.add_argument(
        "--methods", type=_uci_methods, default=defaults.methods, help="comma-separated (default mfg,mcd,whvi)"
    )
    uci.add_argument("--splits", type=_splits, default=defaults.splits, help="e.g. 0-4 or 0,3,7 (default 0-4)")
    uci.add_argument("--steps", type=_positive, default=schedule.steps, help=f"SVI steps (default {schedule.steps})")
    uci.add_argument(
        "--fixed-noise-steps",
        type=_nonnegative,
        default=schedule.fixed_noise_steps,
        help=f"first steps with the noise scale fixed (default {schedule.fixed_noise_steps})",
    )
    uci.add_argument("--batch-size", type=_positive, default=schedule.batch_size, help="minibatch size (default 64)")
    uci.add_argument("--lr", type=_positive_float, default=schedule.lr, help="Adam's initial learning rate")
    uci.add_argument("--hidden", type=_positive, default=defaults.hidden, help="hidden units per layer (default 128)")
    uci.add_argument("--layers", type=_nonnegative, default=defaults.layers, help="hidden layers (default 2)")
    uci.add_argument("--samples", type=_positive, default=defaults.samples, help="test-time posterior samples")
    uci.add_argument(
        "--dropout", type=_positive_float, default=defaults.dropout, help="MC dropout rate (default 0.005)"
    )
    uci.add_argument("--flows", type=_positive, default=defaults.flows, help="planar flows of nf-whvi (default 3)")
    uci.add_argument("--reflections", type=_nonnegative, default=defaults.reflections, help="VSD's Householder T")
    uci.add_argument("--seed", type=_nonnegative, default=defaults.seed)
    uci.add_argument("--threads", type=_positive, help="torch threads per process (default: torch's choice)")
    uci.add_argument("--out", type=Path, default=Path("whvi_uci"), help="output folder (default ./whvi_uci)")
    parallel = uci.add_argument_group(
        "data-parallel training",
        "--nproc N starts N processes here (gloo on loopback); the batch is split over them. On several machines "
        "or GPUs launch with torchrun instead: torchrun --nnodes M --nproc-per-node N -m pyro_whvi uci ... "
        "(the processes torchrun starts are used, --nproc is not needed).",
    )
    parallel.add_argument("--nproc", type=_positive, default=1, help="processes on this machine (default 1)")
    parallel.add_argument("--master-port", type=_positive, help="their rendezvous port (default: a free one)")
    parallel.add_argument(
        "--timeout", type=_positive_float, default=600.0, help="seconds a process waits for the others (default 600)"
    )
    parallel.add_argument(
        "--checkpoint-every",
        type=_nonnegative,
        default=defaults.checkpoint_every,
        help=f"steps between checkpoints of a split's training, resumed by a rerun (0: none; default "
        f"{defaults.checkpoint_every})",
    )
    uci.set_defaults(subparser=uci)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    from tqdm.auto import tqdm

    tqdm.write(f"whvi uci: warning: {' '.join(str(message).splitlines())}", file=sys.stderr)


def _uci(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch

    from . import distributed
    from .methods import Schedule
    from .reporting import check_writable
    from .uci import UCIConfig, check_source, dataset_name, run_uci

    source = args.data_dir if args.data_dir is not None else (args.dataset or "diabetes")
    timeout = timedelta(seconds=args.timeout)
    try:
        if distributed.init_from_environment(timeout=timeout):  # started by torchrun: its processes
            args.nproc = distributed.world_size()
        elif args.master_port is not None:
            distributed.check_port(args.master_port)
        if args.threads and args.threads > (os.cpu_count() or 1):
            raise ValueError(f"--threads: at most {os.cpu_count()} (the cores here) expected, got {args.threads}")
        if args.dropout >= 1:
            raise ValueError(f"--dropout must be below 1, got {args.dropout}")
        config = UCIConfig(
            methods=args.methods,
            splits=args.splits,
            schedule=Schedule(
                steps=args.steps,
                fixed_noise_steps=args.fixed_noise_steps,
                batch_size=args.batch_size,
                lr=args.lr,
            ),
            hidden=args.hidden,
            layers=args.layers,
            samples=max(2, args.samples),
            dropout=args.dropout,
            flows=args.flows,
            reflections=args.reflections,
            seed=args.seed,
            nproc=args.nproc,
            checkpoint_every=args.checkpoint_every,
        )
        check_source(source, config.splits)
        check_writable(args.out)
    except (ValueError, OSError) as error:
        args.subparser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            _, text = run_uci(source, config, args.out, port=args.master_port, timeout=timeout, threads=args.threads)
        except RuntimeError as error:  # a process failed or died: one line, the others are stopped
            if config.nproc == 1:
                raise
            print(
                f"whvi uci: error: {error}; rerun the same command to resume from the last checkpoint", file=sys.stderr
            )
            return 1
    if distributed.rank() == 0:
        print("\n" + text)
        print(f"\nwrote {args.out}/uci_{dataset_name(source)}.{{json,csv,md}}")
    return 0


def _gp(args: argparse.Namespace) -> int:
    import time

    import torch

    from .gp import finish_arguments, run, save

    args = finish_arguments(args.subparser, args)
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
    if args.command == "gp":
        return _gp(args)
    if args.command == "uci":
        return _uci(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "synthetic":
        return _synthetic(args)
    if args.command == "demo":
        if args.out.exists() and not args.out.is_dir():
            print(f"whvi demo: --out {args.out} exists and is not a folder", file=sys.stderr)
            return 2
        config = DemoConfig(
            methods=args.methods,
            toy_steps=args.toy_steps,
            digits_steps=args.digits_steps,
            samples=max(2, args.samples),
            seed=args.seed,
        )
        try:
            run_demo(args.out, config)
        except ImportError as error:
            print(f"whvi demo: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

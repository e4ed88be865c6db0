"""The ``whvi`` command line (also ``python -m pyro_whvi``).

    whvi demo [--out DIR] [--methods whvi,nf-whvi,mfg,mcd] [--toy-steps N] [--digits-steps N]
    whvi gp [--quick] [--functions ...] [--methods rf,rf-whvi,svgp-gpytorch,svgp-gpflow] [--out DIR]

Bad arguments get a one-line error (exit status 2), not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .demo import METHODS, DemoConfig, run_demo

__all__ = ["main"]


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
    parser = argparse.ArgumentParser(prog="whvi", description="pyro_whvi: structured variational inference.")
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
    gp = commands.add_parser(
        "gp",
        help="random-feature GPs (RF, RF-WHVI) vs inducing points (SVGP) at matched parameter counts",
        description=(
            "The WHVI paper's GP experiment (App. D.4, Fig. 13) on borehole, hartmann6, rastrigin5, robot and OTL "
            "circuit: test RMSE and MNLL vs the number of variational parameters, as a table and a plot."
        ),
    )
    from .gp.experiment import add_arguments

    add_arguments(gp, Path("whvi_gp"))
    gp.set_defaults(subparser=gp)  # finish_arguments reports bad values through the subcommand's parser
    return parser


def _gp(args: argparse.Namespace) -> int:
    import time

    import torch

    from .gp.experiment import finish_arguments, run, save

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
    args = _parser().parse_args(argv)
    if args.command == "gp":
        return _gp(args)
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

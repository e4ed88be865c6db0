"""The ``whvi`` command line (also ``python -m pyro_whvi``).

    whvi demo [--out DIR] [--methods whvi,nf-whvi,mfg,mcd] [--toy-steps N] [--digits-steps N]

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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

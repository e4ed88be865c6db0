"""``whvi synthetic``: its arguments and what runs them (:func:`pyro_whvi.experiments.noisy_sets.write_noisy_set`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import at_most, choices, float_in, nonnegative
from .noisy_sets import MAX_NOISE, MIN_NOISE, MIN_ROWS, NOISE_PROFILES
from .uci_data import MAX_SPLITS

__all__ = ["add_synthetic_command", "run_synthetic_command"]


def _rows(text: str) -> int:
    rows = nonnegative(text)
    if rows < MIN_ROWS:
        raise argparse.ArgumentTypeError(
            f"at least {MIN_ROWS} rows expected (each 90/10 split needs a test row and training rows), got {text!r}"
        )
    return rows


def add_synthetic_command(commands) -> None:
    from ..data.synthetic import ANALOGUE_FUNCTIONS, BENCH_FUNCTIONS, SYNTHETIC_FUNCTIONS

    names, paper = tuple(BENCH_FUNCTIONS), tuple(SYNTHETIC_FUNCTIONS)
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
        type=lambda text: choices(text, names, "--functions"),
        default=paper,
        help=f"comma-separated, from {','.join(names)} (default the paper's {','.join(paper)}; "
        f"{' and '.join(ANALOGUE_FUNCTIONS)} stand in for power and protein, 4 and 10 inputs)",
    )
    synthetic.add_argument(
        "--rows", type=_rows, default=20_000, help=f"rows per set, at least {MIN_ROWS} (default 20000)"
    )
    synthetic.add_argument(
        "--noise",
        type=float_in(
            MIN_NOISE,
            MAX_NOISE,
            "sigma / std(f): beyond it the function or the noise is lost in float32's resolution of the targets, "
            "and near 1e300 the targets overflow",
        ),
        default=0.2,
        help=f"sigma / std(f), from {MIN_NOISE:g} to {MAX_NOISE:g} (default 0.2)",
    )
    synthetic.add_argument(
        "--noise-profile",
        choices=NOISE_PROFILES,
        default=NOISE_PROFILES[0],
        help="constant (the default): one sigma; ramp: sigma(x) = sigma (0.25 + 1.5 u1) along the first input's unit "
        "coordinate u1, from 0.25 to 1.75 sigma, sigma on average: input-dependent noise, one sigma(x) per row in "
        "noise_std.txt, and whvi uci's floor is the test rows' (--likelihood heteroscedastic models it)",
    )
    synthetic.add_argument(
        "--splits",
        type=at_most(MAX_SPLITS, "the most whvi uci --splits takes at once"),
        default=5,
        help="random 90/10 splits (default 5)",
    )
    synthetic.add_argument("--seed", type=at_most(2**32 - 1, "numpy's seeds", minimum=0), default=0)
    synthetic.set_defaults(subparser=synthetic)


def run_synthetic_command(args: argparse.Namespace) -> int:
    from ..data.synthetic import BENCH_FUNCTIONS
    from .memory_checks import check_synthetic_memory
    from .noisy_sets import write_noisy_set
    from .reporting import check_writable

    try:
        check_synthetic_memory(args.rows, [BENCH_FUNCTIONS[name].dim for name in args.functions])
        check_writable(args.out)
        for name in args.functions:
            sigma = write_noisy_set(
                name,
                args.out / name,
                num_points=args.rows,
                noise=args.noise,
                splits=args.splits,
                seed=args.seed,
                profile=args.noise_profile,
            )
            ramp = ", from 0.25 to 1.75 times it along the first input" if args.noise_profile == "ramp" else ""
            print(f"wrote {args.out / name} (sigma = {sigma:.4g}{ramp})")
    except (ValueError, OSError) as error:
        args.subparser.error(str(error))
    print(f"\nnext: whvi uci --data-dir {args.out / args.functions[0]} --methods whvi,mcd --splits 0-{args.splits - 1}")
    return 0

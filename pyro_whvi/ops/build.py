"""Build the compiled kernels ahead of time: ``python -m pyro_whvi.ops.build``.

Exits non-zero with the compiler's reason when the build fails.
"""

from __future__ import annotations

import argparse
import sys

from .backends import load_compiled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyro_whvi.ops.build", description=__doc__)
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands and output")
    args = parser.parse_args(argv)
    try:
        load_compiled(verbose=args.verbose)
    except Exception as error:  # report any build failure in one line
        print(f"pyro_whvi: building the compiled kernels failed: {error}", file=sys.stderr)
        return 1
    print("pyro_whvi: compiled CPU kernels ready.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

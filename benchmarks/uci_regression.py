"""WHVI vs mean-field VI vs MC dropout on UCI regression splits (WHVI paper §3.2, Table 3; App. D.1).

``whvi uci`` as a script, with the same arguments (``whvi uci --help``): a Bayesian MLP (by default 2 x 128 ReLU
below 3,000 training rows and 2 x 1024 from them, ``--protocol auto``), minibatches of 64, Adam with the paper's
decaying learning rate, the noise scale fixed for the first 500 steps, test RMSE and MNLL in the targets' original
units, mean ± standard error over splits.
Finished splits are read back from ``--out``/runs, so an interrupted run resumes.

    python benchmarks/uci_regression.py --data-dir ../shared/datasets/uci/yacht --methods mfg,mcd,whvi \\
        --splits 0-4 --steps 35000 --out benchmarks/results

Writes ``uci_<dataset>.{json,csv,md}`` to ``--out`` (default ``./whvi_uci``).
"""

from __future__ import annotations

import sys

from pyro_whvi.experiments.cli import main as whvi_main


def main(argv: list[str] | None = None) -> int:
    return whvi_main(["uci", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())

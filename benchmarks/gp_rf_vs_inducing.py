"""Random-feature GPs (mean field, full covariance, WHVI) vs inducing points at matched parameter counts.

The WHVI paper's GP experiment (NeurIPS 2020, App. D.4, Fig. 13; workshop paper §3.2). For each
closed-form function (borehole, hartmann6, rastrigin5, robot, otlcircuit; space-filling inputs
rescaled to [0, 1], outputs standardized, random 80/20 split) and each covariance setting
(``diagonal``: mean-field q; ``full``: full covariance), every WHVI size ``D`` fixes a budget:

* ``rf-whvi``: ``N_RF = D^2`` features, ``w`` reshaped to ``D x D`` with a WHVI posterior
  (``4D`` parameters diagonal, ``3D + D(D+1)/2`` full);
* ``rf``: a Gaussian ``q(w)`` with fewer features, as many as the budget allows;
* ``svgp-gpytorch`` / ``svgp-gpflow``: whitened SVGP with the number of inducing points whose
  parameter count (inputs, mean, covariance) reaches the budget, rounded up.

All start from the paper's hyperparameters (lengthscales ``sqrt(d/2)``, variance 1, noise std 0.02)
and train with Adam on minibatches, the noise fixed for the first part. Reported: test RMSE and
MNLL (standardized units) vs the number of variational parameters, and wall time per method.

    python benchmarks/gp_rf_vs_inducing.py --quick            # 10,000 points, 3,000 steps at 4x the lr
    python benchmarks/gp_rf_vs_inducing.py                    # the paper's sizes and 12,000 steps

Writes ``gp_rf_vs_inducing.{json,csv,md,png}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import environment, report_saved

from pyro_whvi.experiments.gp import add_arguments, finish_arguments, run, save


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, Path(__file__).parent / "results")
    args = finish_arguments(parser, parser.parse_args(argv))
    torch.set_default_dtype(torch.float64)
    start = time.perf_counter()
    rows = run(args)
    meta = {
        "config": {k: str(v) for k, v in vars(args).items()},
        "environment": environment(seconds=time.perf_counter() - start),
    }
    print("\n" + save(rows, args, meta))
    report_saved(args.out, args.stem, (args.out / f"{args.stem}.png").is_file())


if __name__ == "__main__":
    main()

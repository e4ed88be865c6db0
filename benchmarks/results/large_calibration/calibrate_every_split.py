"""``whvi`` with ``auto_calibration.SPREAD_SHARE_THRESHOLD`` at minus infinity: under ``--likelihood by-residuals``
with the calibration (the default from 3,000 training rows) every split that keeps one noise scale is calibrated on
held-out rows, so that its row holds the spread share, the test MNLL with the learned noise (``learned_noise_mnll``,
the same draws) and the calibrated one (``spread_share.py`` reads them).

Run from the repository root: ``python benchmarks/results/large_calibration/calibrate_every_split.py uci
--data-dir <set> --methods whvi --splits <split> --threads 1 --out <folder>``.
"""

from __future__ import annotations

import sys

from pyro_whvi.experiments import auto_calibration, cli

if __name__ == "__main__":
    auto_calibration.SPREAD_SHARE_THRESHOLD = float("-inf")
    sys.exit(cli.main(sys.argv[1:]))

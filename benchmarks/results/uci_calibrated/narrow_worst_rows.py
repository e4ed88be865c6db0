"""Which test rows carry ``narrow``'s loss to ``table3`` where it fails (hartmann6, 700 rows, σ 0.05)? From the
probe's kept samples of one split under both protocols (``PROTOCOL=<p> KEEP=FILE.pt python
benchmarks/results/noise_recalibration/calibration_probe.py DATA SPLIT 50500 OUT.json --refit``), each protocol's
calibrated predictive as ``whvi uci --calibrate-noise on`` makes it (the factor chosen on the 80% fit's held-out
rows, the refit's noise times it, a weight ``1 / (n + 2)`` kept on the learned noise), and per test row its NLL
(original units, :func:`~pyro_whvi.metrics.gaussian_row_nll`) and its error over the predictive's standard deviation.

Prints and writes (atomically) each protocol's test MNLL, factor, RMSE, and how much of the MNLL difference the rows
with the largest differences carry, with those rows' errors and standard deviations.

usage: python benchmarks/results/uci_calibrated/narrow_worst_rows.py OUT_JSON NARROW.pt TABLE3.pt
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from pyro_whvi.experiments.noise_calibration import HeldOutFit, calibrated_noise
from pyro_whvi.metrics import gaussian_row_nll, rmse
from pyro_whvi.train.files import write_atomic

TOP = (1, 3, 10)  # the rows with the largest NLL differences, counted


class Predictive(NamedTuple):
    """A protocol's calibrated test predictive: per-row NLL, error and standard deviation (original units)."""

    nll: torch.Tensor
    error: torch.Tensor
    sd: torch.Tensor
    factor: float
    rmse: float


def predictive(path: str) -> Predictive:
    """The predictive from a probe's kept samples, calibrated as ``whvi uci --calibrate-noise on`` does."""
    kept = torch.load(path)
    f, y, scale = kept["f_full"].double(), kept["y_test"].double(), kept["y_scale"]
    calibration = HeldOutFit(kept["f_val"].double(), kept["noise80"], kept["y_val"].double()).calibration(scale)
    noise, weights = calibrated_noise(torch.tensor(kept["noise_full"], dtype=torch.float64), calibration)
    nll = gaussian_row_nll(f, noise, y, weights) + math.log(scale)
    variance = f.var(0, correction=0) + sum(w * float(s) ** 2 for w, s in zip(weights, noise, strict=True))
    error = (f.mean(0) - y) * scale
    return Predictive(nll, error, variance.sqrt() * scale, calibration["noise_factor"], rmse(f, y) * scale)


def main() -> None:
    out, narrow_path, table3_path = sys.argv[1:4]
    both = {"narrow": predictive(narrow_path), "table3": predictive(table3_path)}
    gap = both["narrow"].nll - both["table3"].nll
    order = gap.argsort(descending=True)
    total = float(gap.sum())
    result: dict[str, object] = {"rows": len(gap), "mnll_difference": float(gap.mean())}
    for name, each in both.items():
        result[name] = {"mnll": float(each.nll.mean()), "factor": each.factor, "rmse": each.rmse}
    result["share_of_the_difference"] = {str(k): float(gap[order[:k]].sum()) / total for k in TOP}
    result["worst_rows"] = [
        {"nll_difference": float(gap[i])}
        | {f"{name}_error_over_sd": float(each.error[i] / each.sd[i]) for name, each in both.items()}
        for i in order[: max(TOP)].tolist()
    ]
    print(json.dumps(result, indent=1))
    write_atomic(Path(out), json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

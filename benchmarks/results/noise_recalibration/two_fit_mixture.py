"""A probe (not the library): the calibrated default already trains two fits of a split, the held-out fit on 80% of
its training rows (for the factor ``c``) and the fit on all of them (the predictive). Would the predictive gain by
using both? From the probe's kept samples (``KEEP=FILE.pt`` of ``calibration_probe.py ... --refit``), each split's
test MNLL (original units) of

* ``refit``: the default, the fit on all rows with the noise ``c`` times its own and the weight
  ``eps = 1/(held-out rows + 2)`` on its learned noise (``noise_calibration.calibrated_noise``);
* ``held_out_fit``: the 80% fit, calibrated the same way with its own noise;
* ``both``: the equal mixture of the two predictives;
* ``refit_with_held_out_noise``: the refit's samples of f with the held-out fit's calibrated noise ``c`` times
  ``noise80`` (the factor's scale where it was chosen) instead of ``c`` times the refit's own.

usage: python two_fit_mixture.py OUT_JSON KEPT.pt...  (entries named by each file's stem; others in OUT_JSON kept)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from pyro_whvi.experiments.noise_calibration import keep_weight, noise_factor
from pyro_whvi.metrics import gaussian_row_nll
from pyro_whvi.train.files import write_atomic


def log_density(
    f: torch.Tensor, noises: tuple[float, float], weights: tuple[float, float], y: torch.Tensor
) -> torch.Tensor:
    """Each row's log density under :math:`\\sum_k w_k \\frac1S \\sum_s \\mathcal N(y \\mid f_s, \\sigma_k^2)`."""
    return -gaussian_row_nll(f, torch.tensor(noises, dtype=f.dtype), y, weights)


out = Path(sys.argv[1])
results = json.loads(out.read_text()) if out.exists() else {}
for path in sys.argv[2:]:
    kept = torch.load(path)
    f_held, f_refit, y = kept["f_test"].double(), kept["f_full"].double(), kept["y_test"].double()
    noise80, noise_full = float(kept["noise80"]), float(kept["noise_full"])
    factor, *_ = noise_factor(kept["f_val"].double(), noise80, kept["y_val"].double())
    weights = (1.0 - keep_weight(len(kept["y_val"])), keep_weight(len(kept["y_val"])))
    refit = log_density(f_refit, (factor * noise_full, noise_full), weights, y)
    held_out_fit = log_density(f_held, (factor * noise80, noise80), weights, y)
    both = torch.logsumexp(torch.stack([refit, held_out_fit]), 0) - math.log(2.0)
    wider = log_density(f_refit, (factor * noise80, noise80), weights, y)
    shift = math.log(kept["y_scale"])
    predictives = {"refit": refit, "held_out_fit": held_out_fit, "both": both, "refit_with_held_out_noise": wider}
    entry: dict[str, float] = {name: float(-rows.mean()) + shift for name, rows in predictives.items()}
    entry |= {"factor": factor, "noise80": noise80 * kept["y_scale"], "noise_full": noise_full * kept["y_scale"]}
    results[Path(path).stem] = entry
    print(Path(path).stem, json.dumps({name: round(value, 4) for name, value in entry.items()}), flush=True)
write_atomic(out, json.dumps(dict(sorted(results.items())), indent=1))

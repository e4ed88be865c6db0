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
from typing import Any

import torch

from pyro_whvi.experiments.noise_calibration import HeldOutFit, calibrated_noise
from pyro_whvi.metrics import gaussian_row_nll
from pyro_whvi.train.files import write_atomic


def log_density(f: torch.Tensor, noise: float, calibration: dict[str, Any], y: torch.Tensor) -> torch.Tensor:
    """Each row's log density under the calibrated predictive of samples ``f`` with the learned ``noise``
    (``noise_calibration.calibrated_noise``: the noise times the factor, a weight kept on the learned)."""
    noises, weights = calibrated_noise(torch.tensor(noise, dtype=f.dtype), calibration)
    return -gaussian_row_nll(f, noises, y, weights)


out = Path(sys.argv[1])
results = json.loads(out.read_text()) if out.exists() else {}
for path in sys.argv[2:]:
    kept = torch.load(path)
    f_held, f_refit, y = kept["f_test"].double(), kept["f_full"].double(), kept["y_test"].double()
    noise80, noise_full = float(kept["noise80"]), float(kept["noise_full"])
    calibration = HeldOutFit(kept["f_val"].double(), noise80, kept["y_val"].double()).calibration(kept["y_scale"])
    refit = log_density(f_refit, noise_full, calibration, y)
    held_out_fit = log_density(f_held, noise80, calibration, y)
    both = torch.logsumexp(torch.stack([refit, held_out_fit]), 0) - math.log(2.0)
    wider = log_density(f_refit, noise80, calibration, y)
    shift = math.log(kept["y_scale"])
    predictives = {"refit": refit, "held_out_fit": held_out_fit, "both": both, "refit_with_held_out_noise": wider}
    entry: dict[str, float] = {name: float(-rows.mean()) + shift for name, rows in predictives.items()}
    entry["factor"] = calibration["noise_factor"]
    entry |= {"noise80": noise80 * kept["y_scale"], "noise_full": noise_full * kept["y_scale"]}
    results[Path(path).stem] = entry
    print(Path(path).stem, json.dumps({name: round(value, 4) for name, value in entry.items()}), flush=True)
write_atomic(out, json.dumps(dict(sorted(results.items())), indent=1))

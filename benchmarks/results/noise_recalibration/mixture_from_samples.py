"""The predictive ``whvi uci --calibrate-noise`` makes, recomputed from the probe's kept samples (``KEEP=FILE.pt``
of ``calibration_probe.py``; not committed, about 150 kB a run): the factor ``c`` chosen on the 80% fit's held-out
rows (``noise_factor``), and on the test rows of the fit on all the training rows the MNLL (original units) of

* ``learned``: the learned noise (the default);
* ``alone``: the noise times ``c`` (the flag before it kept a weight on the learned noise);
* ``mixture``: (1 - eps) of that and eps of the learned, eps = 1/(held-out rows + 2) (the flag);
* ``mixture_refit_c``: the same mixture with ``c`` chosen for it on the held-out rows (the choice not shipped).

usage: python mixture_from_samples.py OUT_JSON KEPT.pt...

Each run's entry (named by its file's stem) is added to OUT_JSON or replaces the entry of that name; the
others are kept, so a run probed later joins the table without the samples of the earlier ones.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from pyro_whvi.experiments.noise_calibration import NOISE_FACTORS, calibrated_noise, keep_weight, noise_factor
from pyro_whvi.metrics import gaussian_mnll, gaussian_row_nll, rmse
from pyro_whvi.train.files import write_atomic


def mixture_factor(f: torch.Tensor, noise: float, y: torch.Tensor, keep: float) -> float:
    """The factor that gives the mixture itself the lowest MNLL on the rows (ties: the smallest)."""
    noise_t = torch.tensor(noise, dtype=torch.float64)
    scores = [gaussian_mnll(f, torch.stack([noise_t * c, noise_t]), y, (1 - keep, keep)) for c in NOISE_FACTORS]
    return float(NOISE_FACTORS[int(torch.tensor(scores, dtype=torch.float64).argmin())])


out = Path(sys.argv[1])
results = json.loads(out.read_text()) if out.exists() else {}
for path in sys.argv[2:]:
    kept = torch.load(path)
    f_val, y_val = kept["f_val"].double(), kept["y_val"].double()
    f, y = kept["f_full"].double(), kept["y_test"].double()
    learned = torch.tensor(kept["noise_full"], dtype=torch.float64)
    keep = keep_weight(len(y_val))
    factor, *_ = noise_factor(f_val, kept["noise80"], y_val)
    refit_factor = mixture_factor(f_val, kept["noise80"], y_val, keep)
    shift = math.log(kept["y_scale"])
    predictives = {
        "learned": (torch.stack([learned, learned]), (1.0, 0.0)),
        "alone": (torch.stack([learned * factor, learned]), (1.0, 0.0)),
        "mixture": calibrated_noise(learned, {"noise_factor": factor, "learned_noise_weight": keep}),
        "mixture_refit_c": calibrated_noise(learned, {"noise_factor": refit_factor, "learned_noise_weight": keep}),
    }
    entry: dict[str, object] = {"factor": factor, "refit_factor": refit_factor, "keep": keep}
    for name, (noise, weights) in predictives.items():
        rows = gaussian_row_nll(f, noise, y, weights) + shift
        entry[name] = {"mnll": float(rows.mean()), "worst_row": float(rows.max())}
    entry["rmse"] = rmse(f, y) * kept["y_scale"]
    results[Path(path).stem] = entry
    print(Path(path).stem, json.dumps(entry), flush=True)
write_atomic(out, json.dumps(dict(sorted(results.items())), indent=1))

"""A probe (not part of the library): is WHVI's predictive on small sets too wide by a factor that held-out rows
can measure?

``whvi uci`` learns one noise scale by the ELBO, which fits it to the residuals of *sampled* networks, and the
predictive then adds ``q``'s spread of ``f`` on top: on yacht the learned noise (1.10) is 2.4 times the test RMSE
(0.46). Here one split is trained as ``whvi uci --protocol table3`` does but on the fit part of its training rows
(``validation_part``, 80%), and two one-parameter corrections are chosen on the held-out 20% by their MNLL (a grid
of 241 factors from 0.05 to 4, log-spaced):

* ``noise``: the learned noise times ``c``; ``q``'s samples of ``f`` as they are;
* ``scale``: every sample's deviation from the predictive mean and the noise both times ``s`` (the whole predictive
  widened or narrowed about its mean).

Each is scored on the test rows (and, for reference only, the factor the test rows would choose). With
``--refit`` the split is also trained on all its training rows, as the default does, and the factors chosen on the
80% fit are applied to that fit. Per-row test NLLs are kept (their largest) so that a correction that gains the mean
by losing a few rows shows it.

usage: [METHOD=mcd] [SEED=k] [PROTOCOL=narrow] python calibration_probe.py DATA_DIR SPLIT STEPS OUT_JSON [--refit]
(METHOD: whvi unless set; SEED: ``UCIConfig.seed``, 0 unless set; PROTOCOL: ``whvi uci --protocol``'s network and
learning rate, table3 unless set, STEPS replacing its steps)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from pyro_whvi.experiments.methods import parse_method
from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.experiments.uci_data import load_dataset_split
from pyro_whvi.experiments.uci_train import predict_split, train_split, validation_part
from pyro_whvi.metrics import gaussian_row_nll, rmse
from pyro_whvi.train.files import write_atomic

data_dir, split, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
refit = "--refit" in sys.argv[5:]
torch.set_num_threads(1)
method = os.environ.get("METHOD", "whvi")
spec = parse_method(method)
seed = int(os.environ.get("SEED", "0"))
protocol = os.environ.get("PROTOCOL", "table3")
config = UCIConfig.from_protocol(protocol, data_dir, steps=steps, methods=(method,), seed=seed, progress=False)
data = load_dataset_split(data_dir, split, standardize_targets=config.standardize_targets)
part = validation_part(data, config.val_fraction, config.seed + split)
factors = torch.logspace(math.log10(0.05), math.log10(4.0), 241, dtype=torch.float64)
log_scale = math.log(data.y_scale)


def row_nll(f: torch.Tensor, noise: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's negative log predictive density of the mixture of ``N(f_s, noise^2)``, original units."""
    return gaussian_row_nll(f, noise, y) + log_scale


def corrected(f: torch.Tensor, noise: float, kind: str, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "noise":
        return f, torch.tensor(noise * factor, dtype=f.dtype)
    mean = f.mean(0, keepdim=True)
    return mean + factor * (f - mean), torch.tensor(noise * factor, dtype=f.dtype)


def mnll_curve(f: torch.Tensor, noise: float, y: torch.Tensor, kind: str) -> torch.Tensor:
    return torch.stack([row_nll(*corrected(f, noise, kind, float(c)), y).mean() for c in factors])


def scores(f: torch.Tensor, noise: float, y: torch.Tensor, kind: str, factor: float) -> dict[str, object]:
    nll = row_nll(*corrected(f, noise, kind, factor), y)
    top = nll.sort(descending=True).values[:3]
    return {
        "factor": factor,
        "mnll": float(nll.mean()),
        "worst_rows": [round(float(v), 3) for v in top],
    }


results: dict[str, object] = {"method": method, "data": data_dir, "split": split, "steps": steps, "seed": seed}
results["protocol"] = protocol
start = time.process_time()
fit = train_split(data_dir, spec, split, config, data=part, validation=True)
results["fit_seconds"] = time.process_time() - start
noise80 = float(fit.model.noise_scale.detach())
f_val, _ = predict_split(fit, part.x_test, config)
f_test, _ = predict_split(fit, data.x_test, config)
f_val, f_test = f_val.double(), f_test.double()
y_val, y_test = part.y_test.double(), data.y_test.double()
results["noise80"] = noise80 * data.y_scale
results["rmse80"] = rmse(f_test, y_test) * data.y_scale
results["val_rmse80"] = rmse(f_val, y_val) * data.y_scale
chosen: dict[str, float] = {}
for kind in ("noise", "scale"):
    val_curve = mnll_curve(f_val, noise80, y_val, kind)
    test_curve = mnll_curve(f_test, noise80, y_test, kind)
    chosen[kind] = float(factors[int(val_curve.argmin())])
    results[f"80_{kind}"] = {
        "learned": scores(f_test, noise80, y_test, kind, 1.0),
        "val_chosen": scores(f_test, noise80, y_test, kind, chosen[kind]),
        "val_mnll_learned": float(val_curve[int((factors - 1).abs().argmin())]),
        "val_mnll_chosen": float(val_curve.min()),
        "test_oracle": scores(f_test, noise80, y_test, kind, float(factors[int(test_curve.argmin())])),
    }
print(json.dumps(results, indent=1), flush=True)

if refit:
    start = time.process_time()
    full = train_split(data_dir, spec, split, config, data=data)
    results["full_seconds"] = time.process_time() - start
    noise_full = float(full.model.noise_scale.detach())
    f_full, _ = predict_split(full, data.x_test, config)
    f_full = f_full.double()
    results["noise_full"] = noise_full * data.y_scale
    results["rmse_full"] = rmse(f_full, y_test) * data.y_scale
    for kind in ("noise", "scale"):
        results[f"full_{kind}"] = {
            "learned": scores(f_full, noise_full, y_test, kind, 1.0),
            "val_chosen": scores(f_full, noise_full, y_test, kind, chosen[kind]),
        }
    print(json.dumps({k: v for k, v in results.items() if k.startswith("full")}, indent=1), flush=True)
if os.environ.get("KEEP"):  # the predictive samples, for analysis without training again
    kept = {"f_val": f_val, "f_test": f_test, "y_val": y_val, "y_test": y_test, "noise80": noise80}
    if refit:
        kept.update(f_full=f_full, noise_full=noise_full)
    torch.save({**kept, "y_scale": data.y_scale}, os.environ["KEEP"])
write_atomic(Path(out), json.dumps(results, indent=1))

"""A probe (not part of the library): does a mean-variance head started from the one-noise-scale fit keep that fit's
RMSE and gain the head's MNLL?

On yacht the head trained from scratch lowers WHVI's test MNLL (0.662 against 1.228) but more than doubles its
RMSE (1.46 against 0.64): rows it calls noisy early on are never fitted closely (Seitzer et al., ICLR 2022). Here
one split is trained as ``whvi uci --protocol table3`` does (one noise scale, ``STEPS`` steps), then a network with
the head is started from that fit -- every WHVI layer's ``q(g)`` and the last layer's mean column as fitted, the
variance column's weights at mean 0 and its bias at the learned noise's variance -- and trained ``STEPS2`` steps
more under the same schedule. Both fits' test metrics go to ``OUT_JSON``, with a third, one noise scale trained
``STEPS2`` steps more from the same start, so that the head's effect is told apart from that of the added steps.

usage: python probe.py DATA_DIR SPLIT STEPS STEPS2 OUT_JSON
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pyro
import torch

from pyro_whvi.experiments.methods import build_method, parse_method
from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.experiments.uci_data import load_dataset_split
from pyro_whvi.experiments.uci_report import evaluate
from pyro_whvi.experiments.uci_train import TrainedSplit, predict_split, train_split
from pyro_whvi.nn.networks import VARIANCE_FLOOR
from pyro_whvi.train.engine import train
from pyro_whvi.train.files import write_atomic

data_dir, split, steps, steps2, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(1)
spec = parse_method("whvi")
config = UCIConfig.from_protocol("table3", data_dir, steps=steps, methods=("whvi",), progress=False)
data = load_dataset_split(data_dir, split, standardize_targets=config.standardize_targets)
results: dict[str, dict] = {}


def scored(name: str, trained: TrainedSplit, seconds: float) -> None:
    f, noise = predict_split(trained, data.x_test, config)
    results[name] = {**evaluate(data, f, noise), "seconds": seconds}
    print(name, results[name], flush=True)


start = time.process_time()
first = train_split(data_dir, spec, split, config, data=data)
first_seconds = time.process_time() - start
fitted = {name: value.detach().clone() for name, value in first.guide.named_parameters()}
noise = float(first.model.noise_scale.detach())
scored("one_scale", first, first_seconds)

widths = [data.x_train.shape[1], *[config.hidden] * config.layers, 1]
schedule = replace(config.schedule, steps=steps2, fixed_noise_steps=0)


def continued(likelihood: str) -> None:
    pyro.set_rng_seed(config.seed + split + 1)
    pyro.clear_param_store()
    model, guide = build_method(spec, widths, likelihood=likelihood, noise_scale=noise)

    def initialize() -> None:
        with torch.no_grad():
            guide(data.x_train[:2], data.y_train[:2])  # makes the guide's parameters
            for name, parameter in guide.named_parameters():
                source = fitted[name]
                if parameter.shape == source.shape:
                    parameter.copy_(source)
                    continue
                # the last layer: the mean column as fitted; the variance column predicts the fitted noise
                parameter[:1].copy_(source)
                if name.startswith("locs."):
                    raw = torch.tensor(noise**2 - VARIANCE_FLOOR).expm1().log()  # softplus^-1
                    parameter[1:] = raw if name.endswith("bias_unconstrained") else 0.0

    begin = time.process_time()
    losses = train(
        model,
        guide,
        data.x_train,
        data.y_train,
        schedule,
        seed=config.seed + split + 1,
        initialize=initialize,
        progress=False,
        jit=config.jit,
    )
    trained = TrainedSplit(data, model, guide, losses, 0.0, "probe")
    scored(f"{likelihood}_continued", trained, first_seconds + time.process_time() - begin)


continued("heteroscedastic")
continued("gaussian")
write_atomic(
    Path(out), json.dumps({"data": data_dir, "split": split, "steps": steps, "steps2": steps2, **results}, indent=1)
)

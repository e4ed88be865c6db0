"""A probe (not part of the library): one long ``whvi uci --methods whvi`` split, its test MNLL, RMSE, learned noise
and training loss at every ``EVERY`` steps along the way, as ``OUT_JSON``.

Without a cool-down the learning rate depends on the step only, so the state at step ``t`` is that of a run of ``t``
steps; the evaluations draw with the random state saved and restored, so the run goes on as it would have (checked:
the last point equals ``whvi uci --steps STEPS``'s row to the last digit). Extra ``whvi uci`` options (``--lr 3e-3``)
go in ``$EXTRA``; with ``$ROWS`` set, each point also holds every test row's target, sample mean and std of
f, and NLL (standardized units).

usage: python trajectory.py DATA_DIR SPLIT STEPS EVERY OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from pyro.util import get_rng_state, set_rng_state

import pyro_whvi.experiments.methods as methods
import pyro_whvi.experiments.uci as uci
from pyro_whvi.experiments.cli import main
from pyro_whvi.experiments.uci_data import load_dataset_split
from pyro_whvi.experiments.uci_report import evaluate
from pyro_whvi.experiments.uci_train import TrainedSplit, predict_split, train_split
from pyro_whvi.metrics import gaussian_mnll
from pyro_whvi.train.files import write_atomic

data_dir, split, steps, every, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
data = load_dataset_split(data_dir, split, standardize_targets=True)
points: list[dict[str, Any]] = []
held: dict[str, Any] = {}
engine_train = methods.train


def train_with_milestones(model, guide, x, y, schedule, **options):
    def milestone(step: int) -> None:
        if step % every and step != schedule.steps:
            return
        state = get_rng_state()
        with torch.no_grad():
            f, noise = predict_split(TrainedSplit(data, model, guide, [0.0], 0.0, "probe"), data.x_test, held["config"])
            metrics = evaluate(data, f, noise)
        set_rng_state(state)
        points.append({"step": step, **metrics, "noise_standardized": float(model.noise_scale.detach())})
        if os.environ.get("ROWS"):
            points[-1]["rows"] = test_rows(f, noise)
        print(points[-1], flush=True)

    held["losses"] = engine_train(model, guide, x, y, schedule, callback=milestone, **options)
    return held["losses"]


def test_rows(f: torch.Tensor, noise: torch.Tensor | None) -> dict[str, list[float]]:
    """Per test row (standardized units): the target, the mean and std of the samples of f, and the row's NLL."""
    if noise is None:
        raise ValueError("$ROWS keeps a regression's test rows; this data set is a classification")
    f = f.reshape(f.shape[0], -1)
    y = data.y_test.reshape(-1)
    rows = range(len(y))
    nll = [gaussian_mnll(f[:, [i]], noise if noise.dim() < 2 else noise[:, [i]], y[[i]]) for i in rows]
    return {"y": y.tolist(), "f_mean": f.mean(0).tolist(), "f_std": f.std(0).tolist(), "nll": nll}


def train_split_keeping_config(source, spec, split_, config, *args, **kwargs):
    held["config"] = config.for_method(spec.name)
    return train_split(source, spec, split_, config, *args, **kwargs)


methods.train = train_with_milestones  # type: ignore[assignment]
uci.train_split = train_split_keeping_config  # type: ignore[assignment]
start = time.process_time()
argv = ["uci", "--data-dir", data_dir, "--methods", "whvi", "--steps", str(steps), "--splits", str(split)]
main([*argv, "--threads", "1", "--out", tempfile.mkdtemp(), *os.environ.get("EXTRA", "").split()])
losses = held["losses"]
for point in points:
    window = losses[max(0, point["step"] - 5000) : point["step"]]
    point["loss_mean_last5k"] = sum(window) / len(window)
result = {"data": data_dir, "split": split, "extra": os.environ.get("EXTRA", ""), "points": points}
write_atomic(Path(out), json.dumps({**result, "cpu_seconds": time.process_time() - start}, indent=1))

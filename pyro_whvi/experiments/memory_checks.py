"""The memory checks of the ``whvi`` commands: each command's sizes entered into one estimate
(:mod:`~pyro_whvi.experiments.memory_budget` holds the estimate's pieces and :func:`check_memory`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .memory_budget import (
    ACTIVATION_VALUES,
    DEFAULT_TRAINING_VALUES,
    PREDICTION_COPIES,
    PROCESS_BYTES,
    check_memory,
    mlp_bytes,
    mlp_weights,
)

if TYPE_CHECKING:
    from .uci_config import UCIConfig
    from .uci_data import SplitSizes

__all__ = ["check_demo_memory", "check_gp_memory", "check_synthetic_memory", "check_uci_memory"]


def check_uci_memory(config: UCIConfig, sizes: SplitSizes, available: int | None = None) -> None:
    """:func:`check_memory` for ``whvi uci``: the costliest method of ``config`` on the largest split ``sizes``
    (:func:`~pyro_whvi.experiments.uci_data.check_source`), in the default dtype; a deep ensemble (``ensemble``)
    holds :data:`~pyro_whvi.experiments.memory_budget.ENSEMBLE_SIZE` networks, one training at a time. With
    ``config.protocols``, every candidate network and schedule is checked, and with ``config.method_protocols`` each
    method's."""
    if config.protocols or config.method_protocols:
        settings = [candidate for method in config.methods for _, candidate in config.for_method(method).candidates()]
    else:
        settings = [config]
    for each in settings:
        _check_uci_memory(each, sizes, available, validation_rows=config.holding_out, val_fraction=config.val_fraction)


def _check_uci_memory(
    config: UCIConfig, sizes: SplitSizes, available: int | None, *, validation_rows: bool, val_fraction: float
) -> None:
    import torch

    flags = {
        "--hidden": config.hidden,
        "--layers": config.layers,
        "--samples": config.samples,
        "--batch-size": min(config.schedule.batch_size or sizes.train, sizes.train),
        "--steps": config.schedule.steps,
        "--nproc": config.nproc,
    }
    bases = {method.split("+")[0] for method in config.methods}
    if "nf-whvi" in bases:
        flags["--flows"] = config.flows
    if "vsd" in bases:
        flags["--reflections"] = config.reflections
    rows = max(sizes.test, math.ceil(val_fraction * sizes.train) if validation_rows else 0)
    heads = 2 if "ensemble" in bases else 1  # a member's mean-variance head: two outputs a target (an upper bound)

    def estimate(values: Mapping[str, int]) -> float:
        hidden, layers, processes = values["--hidden"], values["--layers"], values["--nproc"]
        per_layer = values.get("--flows", 0) * 4 * hidden + values.get("--reflections", 0) * 2 * hidden
        started = processes * PROCESS_BYTES if processes > 1 else 0  # the ranks launched here
        return started + mlp_bytes(
            config.methods,
            mlp_weights(sizes.features, hidden, layers, heads * sizes.outputs) + per_layer * (layers + 1),
            sizes.features + hidden * layers + heads * sizes.outputs,
            batch=values["--batch-size"],
            samples=values["--samples"],
            test_rows=rows,
            outputs=sizes.outputs,
            steps=values["--steps"],
            itemsize=torch.empty((), dtype=torch.get_default_dtype()).element_size(),
            processes=processes,
        )

    check_memory(estimate, flags, "training and predicting", available)


def check_demo_memory(samples: int, toy_steps: int, digits_steps: int, workers: int) -> None:
    """:func:`check_memory` for ``whvi demo``: its two networks (toy 1-128-128-1 on 128 + 201 rows, digits
    64-128-10 on at most its 1,797 rows) in each of ``workers`` processes at once."""
    import torch

    itemsize = torch.empty((), dtype=torch.get_default_dtype()).element_size()
    flags = {"--samples": samples, "--toy-steps": toy_steps, "--digits-steps": digits_steps, "--jobs": workers}

    def estimate(values: Mapping[str, int]) -> float:
        toy = mlp_bytes(
            ("nf-whvi",), mlp_weights(1, 128, 2, 1) + 3 * 4 * 128 * 3, 258, batch=128, samples=values["--samples"],
            test_rows=329, outputs=1, steps=values["--toy-steps"], itemsize=itemsize,
        )  # fmt: skip
        digits = mlp_bytes(
            ("nf-whvi",), mlp_weights(64, 128, 1, 10) + 3 * 4 * 128 * 2, 202, batch=128, samples=values["--samples"],
            test_rows=1797, outputs=10, steps=values["--digits-steps"], itemsize=itemsize,
        )  # fmt: skip
        return values["--jobs"] * max(toy, digits)

    check_memory(estimate, flags, "running the demo", None)


def check_gp_memory(num_points: int, dims: list[int], blocks: list[int], covariances: list[str], batch: int) -> None:
    """:func:`check_memory` for ``whvi gp``: the data set (``num_points`` rows of the widest function, ``dims``)
    and the largest model: a budget of the largest WHVI block's parameters, its random features (``block^2``)
    and the inducing points matched to it, in float64."""
    from .baselines import inducing_points_for_parameters
    from .gp import whvi_budget

    flags = {"--num-points": num_points, "--blocks": max(blocks), "--batch-size": min(batch, num_points)}
    dim = max(dims)

    def estimate(values: Mapping[str, int]) -> float:
        rows, block, batch_ = values["--num-points"], values["--blocks"], values["--batch-size"]
        budget = max(whvi_budget(block, covariance) for covariance in covariances)
        inducing = max(inducing_points_for_parameters(budget, dim, covariance) for covariance in covariances)
        features = max(block * block, budget, inducing)
        model = DEFAULT_TRAINING_VALUES * (budget + features * dim + inducing**2)
        activations = ACTIVATION_VALUES * (batch_ + inducing) * features
        data = 4 * rows * (dim + 1) + PREDICTION_COPIES * math.ceil(0.2 * rows) * features
        return 8 * (model + activations + data)

    check_memory(estimate, flags, "the largest GP run", None)


def check_synthetic_memory(rows: int, dims: list[int]) -> None:
    """:func:`check_memory` for ``whvi synthetic``: ``rows`` of the widest function (``dims``) as float64
    arrays and as the text of ``data.txt`` (about 25 characters a value, built and encoded)."""
    width = max(dims) + 1
    check_memory(lambda values: values["--rows"] * width * (4 * 8 + 3 * 25), {"--rows": rows}, "writing a set", None)

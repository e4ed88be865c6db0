r"""Choosing a regression likelihood per split from the training residuals: ``whvi uci``'s
``--likelihood by-residuals``, which ``--likelihood auto`` gives WHVI from :data:`AUTO_WIDE_FROM_ROWS` rows.

The split is trained with one noise scale first. A log-quadratic variance model,
:math:`\log v(x) = \beta_0 + \sum_i \beta_i x_i + \gamma_i x_i^2`, is then fitted by maximum likelihood to its
residuals on the training rows, :math:`r_n = y_n - \mathbb{E}[f(x_n)]`, and :func:`noise_variation_gain` is the
log-likelihood per row it gains over one variance, less the :math:`(k - 1) / 2N` that :math:`k - 1` free
coefficients gain on residuals of one variance (Wilks: twice the gain is :math:`\chi^2_{k-1}`), i.e. in nats per row
what modelling the noise's dependence on the inputs is worth on these data. For a known variance function it is
the Jensen gap :math:`\tfrac12(\log \overline{v} - \overline{\log v})`, the test MNLL a constant noise loses.
Where it reaches :data:`NOISE_GAIN_THRESHOLD` the split is trained again with the mean-variance head, else the
one-noise-scale fit is kept: one training where the noise is one level, two where it varies.

The same pass measures :func:`spread_share`, q's variance of f on the training rows as a share of the learned noise
variance. The ELBO's noise holds that spread as well as the residuals, and the predictive adds it again, so where
the share is large (near-noiseless data, or a few thousand rows) the one noise scale kept is too wide; where the
method's noise is calibrated (``whvi uci --calibrate-noise``) a split that keeps one noise scale with a share of
:data:`~.auto_calibration.SPREAD_SHARE_THRESHOLD` or more has it calibrated on held-out rows
(:mod:`~pyro_whvi.experiments.noise_calibration`), and one below it costs no held-out fit.

References:
    T. S. Breusch, A. R. Pagan. *A simple test for heteroscedasticity and random coefficient variation*.
    Econometrica 47(5), 1979 (the auxiliary regression of squared residuals on the inputs).
    A. C. Harvey. *Estimating regression models with multiplicative heteroscedasticity*. Econometrica 44(3), 1976
    (the log-linear variance model and its scoring iterations).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyro
import pyro.util
import torch
import torch.distributed as dist

from ..train import distributed
from ..train.engine import Checkpoint
from . import auto_calibration
from .reporting import write_atomic
from .uci_data import data_key
from .uci_train import TrainedSplit, predict_split, read_saved, train_split

if TYPE_CHECKING:
    from .methods import MethodSpec
    from .uci_config import UCIConfig
    from .uci_data import UCIData

__all__ = [
    "NOISE_GAIN_THRESHOLD",
    "check_store",
    "noise_features",
    "noise_variation_gain",
    "read_check",
    "residual_check",
    "spread_share",
    "store_check",
    "train_choosing_likelihood",
]

#: Nats per training row a variance model must gain (:func:`noise_variation_gain`) for ``by-residuals`` to train the
#: mean-variance head: above the test MNLL the head was measured to cost WHVI where the noise is one level (0.002 to
#: 0.013 over five splits of each of four functions of the synthetic bench at 18,000 training rows,
#: ``benchmarks/results/heteroscedastic/``), ten times below the 0.2 it gains where the noise grows along an input.
NOISE_GAIN_THRESHOLD = 0.02
#: The fields of a split's check (:func:`residual_check`), kept in its store and its row.
CHECK_FIELDS = ("noise_gain", "spread_share")


def noise_features(x: torch.Tensor) -> torch.Tensor:
    """The variance model's features of inputs ``x`` ``(N, D)``: ``[1, x, x²]`` ``(N, 1 + 2D)`` in float64."""
    x = x.double()
    return torch.cat([torch.ones_like(x[:, :1]), x, x * x], dim=1)


def noise_variation_gain(x: torch.Tensor, residuals: torch.Tensor, iterations: int = 100) -> float:
    r"""Nats per row a log-quadratic variance model of the inputs ``x`` ``(N, D)`` gains over one variance on
    ``residuals`` ``(N,)``, corrected for its free coefficients (see the module): about 0 where the residuals' spread
    does not depend on ``x``, the Jensen gap of their variance function where it does.

    The coefficients maximize :math:`-\tfrac12 \sum_n [\log v(x_n) + r_n^2 / v(x_n)]` by Fisher scoring (the
    information :math:`\tfrac12 \Phi^\top \Phi` does not depend on them), halving a step that lowers it; features
    that repeat others (a binary input's square) are counted once, by the rank of :math:`\Phi`.

    :raises ValueError: ``x`` and ``residuals`` of different lengths, fewer rows than coefficients, or residuals
        that are not finite or all zero.
    """
    if x.dim() != 2 or residuals.shape != (x.shape[0],):
        raise ValueError(
            f"noise_variation_gain: x (N, D) and residuals (N,) expected, got {tuple(x.shape)} and "
            f"{tuple(residuals.shape)}"
        )
    features = noise_features(x)
    rows, columns = features.shape
    if rows <= columns:
        raise ValueError(
            f"noise_variation_gain: {rows} rows for {columns} coefficients (1 + 2 x {x.shape[1]} inputs); more rows "
            "than coefficients expected"
        )
    rank = int(torch.linalg.matrix_rank(features))
    squared = residuals.double() ** 2
    if not torch.isfinite(squared).all() or not squared.gt(0).any():
        raise ValueError("noise_variation_gain: finite residuals, not all zero, expected")
    squared = squared.clamp_min(squared.mean() * 1e-12)  # an exact fit of one row: a finite log-likelihood

    def log_likelihood(beta: torch.Tensor) -> torch.Tensor:
        log_variance = features @ beta
        return -0.5 * (log_variance + squared * torch.exp(-log_variance)).mean()

    solve = torch.linalg.pinv(features.T @ features) @ features.T
    beta = torch.zeros(features.shape[1], dtype=torch.float64)
    beta[0] = squared.mean().log()  # the one variance's maximum: where the scoring starts
    one_variance = current = log_likelihood(beta)
    for _ in range(iterations):
        step = solve @ (squared * torch.exp(-(features @ beta)) - 1.0)
        for _ in range(30):
            trial = log_likelihood(beta + step)
            if trial >= current:
                break
            step = step / 2
        else:
            break
        beta, previous, current = beta + step, current, trial
        if current - previous < 1e-12:
            break
    return float(current - one_variance) - (rank - 1) / (2 * rows)


def check_store(selection_store: Path) -> Path:
    """Where a split's check is kept: beside its choice of settings (``selection_store``), ``*.likelihood.json``."""
    return selection_store.with_suffix(".likelihood.json")


def read_check(path: Path | None, fingerprint: str) -> tuple[dict[str, float], float] | None:
    """The check (:func:`residual_check`) and the first training's seconds that :func:`store_check` kept in ``path``
    for a run with ``fingerprint``, or ``None`` (no file, another fingerprint, or a check of older code without the
    spread's share; an unreadable one is named in a notice)."""
    saved = read_saved(path, "check") if path is not None else {}
    if saved.get("fingerprint") != fingerprint or set(saved["check"]) != {*CHECK_FIELDS, "seconds"}:
        return None
    return {key: float(saved["check"][key]) for key in CHECK_FIELDS}, float(saved["check"]["seconds"])


def store_check(path: Path | None, fingerprint: str, check: dict[str, float], seconds: float) -> None:
    """Keep the check and the one-noise-scale training's seconds in ``path`` (atomically), so that a rerun that
    trains the head does not train the one noise scale again."""
    if path is not None:
        write_atomic(path, json.dumps({"fingerprint": fingerprint, "check": {**check, "seconds": seconds}}))


def spread_share(f: torch.Tensor, noise: torch.Tensor | float) -> float:
    r"""The share of one noise variance :math:`\sigma^2` that is q's spread of f on the rows: samples ``f``
    ``(S, N)``, :math:`\frac1N \sum_n \mathrm{Var}_q[f(x_n)] / \sigma^2`.

    At the ELBO's optimum :math:`\sigma^2 = \frac1N \sum_n \mathbb{E}_q[(y_n - f(x_n))^2]`, the residuals' mean
    square plus this spread, so the share is also :math:`1 - \overline{r^2} / \sigma^2` and the predictive
    :math:`\sigma^2 + \mathrm{Var}_q[f]`, which counts the spread twice, is about :math:`(1 + s) / (1 - s)` times
    the residuals' mean square for a share :math:`s` (:mod:`~pyro_whvi.experiments.noise_calibration`). Away from
    that optimum, e.g. after a short training whose noise is still near its fixed start, it can exceed 1."""
    variance = torch.as_tensor(noise, dtype=torch.float64) ** 2
    return float(f.double().var(dim=0).mean() / variance)


def residual_check(trained: TrainedSplit, config: UCIConfig) -> dict[str, float]:
    """A one-noise-scale fit's ``noise_gain`` (:func:`noise_variation_gain` of its residuals on its training rows,
    the predictive mean from ``config.samples`` draws, in the targets' training units: the gain does not depend on
    their scale) and ``spread_share`` (:func:`spread_share` on the same rows and draws). The random state is left as
    it was found, so that the test rows' draws are those of ``--likelihood gaussian``."""
    data = trained.data
    state = pyro.util.get_rng_state()  # the kept fit then predicts the test rows as --likelihood gaussian's does
    try:
        f, noise = predict_split(trained, data.x_train, config)
    finally:
        pyro.util.set_rng_state(state)
    assert noise is not None  # one noise scale
    gain = noise_variation_gain(data.x_train, data.y_train - f.mean(0))
    return {"noise_gain": gain, "spread_share": spread_share(f, noise)}


def train_choosing_likelihood(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    settings: UCIConfig,
    checkpoint: Checkpoint | None,
    data: UCIData,
    candidate: str = "",
    store: Path | None = None,
    calibrate: Callable[[UCIConfig], object] | None = None,
) -> tuple[TrainedSplit, dict[str, Any]]:
    """Train ``spec`` on split ``split`` with one noise scale, check its residuals (:func:`residual_check`), and
    where the gain reaches :data:`NOISE_GAIN_THRESHOLD` train it again with the mean-variance head (see the module).

    :param store: a JSON file that keeps the check and the first training's seconds (:func:`store_check`), so that a
        rerun of a split that chose the head resumes the head's training instead of repeating the first.
    :param calibrate: ``whvi uci --calibrate-noise``'s calibration of the noise kept, called with that likelihood's
        settings: where the split chooses the head, before the head's training (which seeds itself); where it keeps
        one noise scale, after that training if its :func:`spread_share` reaches
        :data:`~.auto_calibration.SPREAD_SHARE_THRESHOLD` (the random state and the param store restored after it,
        so that the test rows' draws are those of the fit alone).
    :returns: the training kept, and the row's ``likelihood`` (the one chosen), ``noise_gain`` and ``spread_share``;
        its seconds include the check's, and the first training's where the head was trained.
    """
    fingerprint = settings.fingerprint(spec.name, data_key(source, split))
    shared: list[tuple[dict[str, float], float] | None] = [
        read_check(store, fingerprint) if distributed.rank() == 0 else None
    ]
    if distributed.world_size() > 1:
        dist.broadcast_object_list(shared, src=0)  # every rank trains the same, or none
    checked = shared[0]
    if checked is None or checked[0]["noise_gain"] < NOISE_GAIN_THRESHOLD:
        # A split that kept one noise scale and lost its row trains it again: the same seeded fit.
        trained = train_split(source, spec, split, settings, checkpoint, data=data, candidate=candidate)
        if checked is None:
            start = time.perf_counter()
            check: list[dict[str, float]] = [residual_check(trained, settings) if distributed.rank() == 0 else {}]
            if distributed.world_size() > 1:
                dist.broadcast_object_list(check, src=0)
            checked = (check[0], trained.seconds + time.perf_counter() - start)
            trained.seconds = checked[1]  # the check is part of the split's cost
            if distributed.rank() == 0:
                store_check(store, fingerprint, *checked)
        if checked[0]["noise_gain"] < NOISE_GAIN_THRESHOLD:
            if calibrate is not None and checked[0]["spread_share"] >= auto_calibration.SPREAD_SHARE_THRESHOLD:
                # The held-out fit's training clears the param store, which PyroModules read their parameters from.
                state, params = pyro.util.get_rng_state(), pyro.get_param_store().get_state()
                try:
                    calibrate(replace(settings.for_method(spec.name), likelihood="gaussian"))
                finally:
                    pyro.util.set_rng_state(state)
                    pyro.clear_param_store()
                    pyro.get_param_store().set_state(params)
            return trained, {"likelihood": "gaussian", **checked[0]}
    head = replace(settings.for_method(spec.name), likelihood="heteroscedastic")
    if calibrate is not None:
        calibrate(head)
    if checkpoint is not None:  # the one noise scale's state is not resumed as the head's
        checkpoint = replace(checkpoint, key=f"{checkpoint.key}:heteroscedastic")
    trained = train_split(source, spec, split, head, checkpoint, data=data, candidate=candidate)
    trained.seconds += checked[1]
    return trained, {"likelihood": "heteroscedastic", **checked[0]}

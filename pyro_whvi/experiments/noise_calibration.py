r"""Calibrating a regression predictive's noise on held-out rows: ``whvi uci --calibrate-noise``.

With one learned noise scale the ELBO's optimum noise variance is the training rows' mean of
:math:`\mathbb{E}_q[(y_n - f(x_n))^2]`, the squared residual of the predictive mean *plus* q's variance of
:math:`f(x_n)`; the predictive :math:`\frac1S \sum_s \mathcal{N}(y \mid f_s(x), \sigma^2)` then adds that variance
a second time. Where q's spread of f is large against the residuals (a few hundred rows, a broad posterior) the
noise swamps the spread q gives each row: on yacht (277 training rows) the learned noise is 1.37, the held-out rows'
best 0.16, and the test MNLL falls from 1.21 to 0.42 on split 0 (``benchmarks/results/noise_recalibration/``).

Here the split's training rows are parted as the choice of candidates parts them
(:func:`~pyro_whvi.experiments.uci_train.validation_part`: ``val_fraction`` held out, seeded with ``seed + split``)
and the method is trained on the rest. The split is then trained on all its training rows as without the flag, and
its predictive becomes

.. math:: (1 - \epsilon)\, \frac1S \sum_s \mathcal{N}(y \mid f_s(x), (c\sigma)^2)
    + \epsilon\, \frac1S \sum_s \mathcal{N}(y \mid f_s(x), \sigma^2),

with :math:`\sigma` its noise (the learned scale, or a head's per row), :math:`c` the factor of
:data:`NOISE_FACTORS` that gives the held-out rows the lowest MNLL with the noise :math:`c\sigma` alone
(:func:`noise_factor`, q's samples of f as they are), and :math:`\epsilon = 1/(n + 2)` for :math:`n` held-out rows
(:func:`keep_weight`). One scalar chosen on held-out rows, as MC dropout's published numbers choose their noise
precision :math:`\tau` (Gal and Ghahramani's grid search), at the cost of the held-out fit: about 1.8 times the
split's training, and nothing more where the run chooses settings on the same held-out rows (MC dropout's rates,
``--kl-weight a,b``): the chosen candidate's fit is that fit (:class:`HeldOutFit`).

Under the likelihood ``"by-residuals"`` (WHVI's default from 3,000 training rows,
:mod:`~pyro_whvi.experiments.likelihood_choice`) the noise is calibrated where the split chooses the mean-variance
head, on a held-out fit of the head trained after the one-noise-scale fit and before the head's own training
(``train_choosing_likelihood``'s ``calibrate``), and where it keeps one noise scale whose spread share
(:func:`~.likelihood_choice.spread_share`: q's variance of f on the training rows over the noise variance) reaches
:data:`~.auto_calibration.SPREAD_SHARE_THRESHOLD`, on a held-out fit of one scale trained after the split's own. A
head trained by the ELBO learns each row's :math:`\mathbb{E}_q[(y_n - f(x_n))^2]` and so counts q's spread of f
twice in the same way, most where the noise is low and the wider networks spread most. One noise scale at those
sizes had its factor near 1 where the share was under a fifth (the bench at 18,000 training rows) and well below 1
where it was a third or more (near-noiseless sets, a few thousand rows: ``benchmarks/results/large_calibration/``).

The weight :math:`\epsilon` on the learned noise is there because a held-out part of a few hundred rows cannot show
a rare region that the test rows reach: on hartmann6 at 700 rows (a deep well, ``whvi synthetic``) the noise scaled
alone (the flag before it kept :math:`\epsilon`) narrowed the predictive where one test row lay far from the mean,
and that row's NLL went from 32 to 87 nats. With :math:`\epsilon`, no row loses more than :math:`\log(1/\epsilon)`
(about 5 nats) against the learned predictive, while at a given :math:`c` no row loses more than
:math:`-\log(1 - \epsilon)` (under 0.02 nats) against the noise scaled alone. Laplace's rule of succession gives
:math:`\epsilon`: the chance that the next row is one where the calibrated noise fails when none of :math:`n` was.
:math:`c` is chosen without :math:`\epsilon`: the weight insures against rows the held-out part does not show, and
a factor chosen with it counted spends that insurance on the rows it does show (narrower where their outliers are
covered by :math:`\epsilon`), which lost 0.07-0.14 nats against this choice on yacht's and energy's split 4.
Measured gains and losses are in ``benchmarks/results/noise_recalibration/``.

References:
    Y. Gal, Z. Ghahramani. *Dropout as a Bayesian Approximation*. ICML 2016, §5.1 and the updated table of
    `DropoutUncertaintyExps` (:math:`\tau` chosen on validation rows).
    V. Kuleshov, N. Fenner, S. Ermon. *Accurate Uncertainties for Deep Learning Using Calibrated Regression*.
    ICML 2018 (recalibrating a regression predictive on held-out rows).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..metrics import gaussian_mnll
from ..train.engine import Checkpoint
from .ensemble import remove_checkpoints
from .reporting import write_atomic
from .uci_data import data_key
from .uci_protocols import BY_RESIDUALS, REGRESSION_LIKELIHOODS
from .uci_train import predict_split, read_saved, train_split, validation_part

if TYPE_CHECKING:
    from .methods import MethodSpec
    from .uci_config import UCIConfig
    from .uci_data import UCIData

__all__ = [
    "NOISE_FACTORS",
    "HeldOutFit",
    "calibrate_noise",
    "calibrated_noise",
    "calibration_store",
    "keep_weight",
    "noise_factor",
]

#: The factors :func:`noise_factor` chooses from: 601, log-spaced from 0.01 to 10 (1.2% apart).
NOISE_FACTORS = torch.logspace(-2.0, 1.0, 601, dtype=torch.float64)


def noise_factor(f: torch.Tensor, noise: torch.Tensor | float, y: torch.Tensor) -> tuple[float, float, float]:
    r"""The factor of :data:`NOISE_FACTORS` by which ``noise`` gives the mixture of :math:`\mathcal{N}(f_s, (c
    \sigma)^2)` the lowest MNLL on the rows ``y`` (ties: the smallest), its MNLL there and at :math:`c = 1`.

    :param f: samples of f on the rows, ``(S, N)``.
    :param noise: the noise's standard deviation: one, or one per sample and row (a head's, ``(S, N)``)."""
    f, y = f.double(), y.double()
    noise = torch.as_tensor(noise, dtype=torch.float64)
    scores = torch.tensor([gaussian_mnll(f, noise * factor, y) for factor in NOISE_FACTORS.tolist()])
    best = int(scores.argmin())
    return float(NOISE_FACTORS[best]), float(scores[best]), gaussian_mnll(f, noise, y)


def keep_weight(held_out_rows: int) -> float:
    r""":math:`\epsilon = 1 / (n + 2)` for :math:`n` held-out rows: Laplace's rule of succession, the chance that
    the next row is one the calibrated noise fails when none of :math:`n` was."""
    return 1.0 / (held_out_rows + 2)


def calibrated_noise(noise: torch.Tensor, calibration: dict[str, Any]) -> tuple[torch.Tensor, tuple[float, float]]:
    """The predictive's noise as :func:`~pyro_whvi.metrics.gaussian_mnll` takes a scale mixture, from a split's
    ``noise`` (one, or one per sample and row) and its row's ``calibration``: the calibrated noise and the learned,
    and their weights."""
    keep = calibration["learned_noise_weight"]
    return torch.stack([noise * calibration["noise_factor"], noise]), (1.0 - keep, keep)


@dataclass(frozen=True)
class HeldOutFit:
    """A regression fit's predictive on the held-out rows of its split: samples of f ``(S, N)``, the noise (one, or
    one per sample and row), the rows' targets (standardized) and the seconds the fit trained (0 where they are
    counted elsewhere)."""

    f: torch.Tensor
    noise: torch.Tensor | float | None
    y: torch.Tensor
    seconds: float = 0.0

    def calibration(self, y_scale: float) -> dict[str, Any]:
        """:func:`calibrate_noise`'s result for this fit, the MNLL shifted to targets scaled by ``y_scale``."""
        assert self.noise is not None  # regression
        factor, _, learned = noise_factor(self.f, self.noise, self.y)
        result: dict[str, Any] = {"noise_factor": factor, "learned_noise_weight": keep_weight(len(self.y))}
        mixture, weights = calibrated_noise(torch.as_tensor(self.noise, dtype=torch.float64), result)
        calibrated = gaussian_mnll(self.f.double(), mixture, self.y.double(), weights)
        shift = math.log(y_scale)  # the MNLL in the targets' original units, as the rows report it
        result.update(calibration_mnll=[learned + shift, calibrated + shift], calibration_seconds=self.seconds)
        return result


def calibration_store(selection_store: Path) -> Path:
    """Where a split's calibration is kept: beside its choice of settings (``selection_store``),
    ``*.calibration.json``."""
    return selection_store.with_suffix(".calibration.json")


def calibrate_noise(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    config: UCIConfig,
    data: UCIData,
    candidate: str = "",
    store: Path | None = None,
    fitted: HeldOutFit | None = None,
) -> dict[str, Any]:
    """Train ``spec`` with ``config`` (one candidate's settings) on the fit part of split ``split``'s training rows
    and choose the factor of its noise on the held-out part (see the module). Regression only, in one process.

    :param store: a JSON file that keeps the result (and, while the fit trains, a checkpoint next to it), so that a
        rerun with the same settings does not train again.
    :param fitted: that fit's predictive on the held-out rows where the caller has it: the chosen candidate's, when
        :func:`~.uci_train.choose_settings` chose ``config`` on the same rows (:func:`~.uci.run_split` keeps each
        candidate's). It is used instead of training the fit again, and its seconds, counted in the choice's, are
        not counted here (``calibration_seconds`` 0).
    :returns: the row's ``noise_factor``, ``learned_noise_weight`` (:func:`keep_weight` of the held-out rows),
        ``calibration_mnll`` (the held-out rows' MNLL with the learned noise and with the calibrated predictive,
        original units) and ``calibration_seconds`` (the fit's training).
    """
    if data.task != "regression":
        raise ValueError("calibrate_noise: the noise of a regression likelihood expected, got a classification set")
    if config.likelihood_of(spec.name) == BY_RESIDUALS:
        raise ValueError(
            f"calibrate_noise: the likelihood chosen ({', '.join(REGRESSION_LIKELIHOODS)}) expected, got "
            f"{BY_RESIDUALS!r}: run_split calibrates the head where the split chooses it"
        )
    fingerprint = config.fingerprint(spec.name, data_key(source, split))
    saved = read_saved(store, "calibration") if store is not None else {}
    if saved.get("fingerprint") == fingerprint:
        return dict(saved["calibration"])
    checkpoint = None
    if fitted is None:
        part = validation_part(data, config.val_fraction, config.seed + split)
        if store is not None and config.checkpoint_every:
            checkpoint = Checkpoint(store.with_suffix(".ckpt"), config.checkpoint_every, fingerprint)
        label = f"calibration {candidate}".strip()
        trained = train_split(source, spec, split, config, checkpoint, data=part, validation=True, candidate=label)
        f, noise = predict_split(trained, part.x_test, config)
        fitted = HeldOutFit(f, noise, part.y_test, trained.seconds)
    result = fitted.calibration(data.y_scale)
    if store is not None:
        write_atomic(store, json.dumps({"fingerprint": fingerprint, "calibration": result}))
        if checkpoint is not None:
            remove_checkpoints(checkpoint.path)  # and an ensemble's members'
    return result

r"""Predictive metrics as plain functions of Monte-Carlo predictive samples.

Shape letters: ``S`` posterior samples, ``N`` test points, ``C`` classes.
Regression: :func:`rmse`, :func:`gaussian_mnll` and its points' :func:`gaussian_row_nll`; classification: the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "categorical_nll",
    "error_rate",
    "expected_calibration_error",
    "gaussian_mnll",
    "gaussian_row_nll",
    "mean_and_standard_error",
    "predictive_entropy",
    "predictive_probs",
    "reliability_diagram",
    "rmse",
]


def _check(logits: Tensor, labels: Tensor) -> None:
    if logits.dim() != 3 or labels.shape != logits.shape[1:2]:
        raise ValueError(
            f"logits must be (S, N, C) Monte-Carlo samples and labels (N,); got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}."
        )


def predictive_probs(logits: Tensor) -> Tensor:
    """The predictive class probabilities ``(N, C)``: the mean over samples of ``softmax(logits)``, ``(S, N, C)``."""
    return logits.softmax(-1).mean(0)


def categorical_nll(logits: Tensor, labels: Tensor) -> Tensor:
    r"""Mean test negative log predictive probability, :math:`-\frac1N \sum_n \log \frac1S \sum_s p(y_n \mid f_s)`."""
    _check(logits, labels)
    log_probs = logits.log_softmax(-1).gather(-1, labels.reshape(1, -1, 1).expand(logits.shape[0], -1, 1))[..., 0]
    return -(torch.logsumexp(log_probs, 0) - math.log(logits.shape[0])).mean()


def error_rate(logits: Tensor, labels: Tensor) -> Tensor:
    """Fraction of test points whose most probable class under the predictive is wrong."""
    _check(logits, labels)
    return (predictive_probs(logits).argmax(-1) != labels).to(logits.dtype).mean()


def reliability_diagram(logits: Tensor, labels: Tensor, num_bins: int = 15) -> tuple[Tensor, Tensor, Tensor]:
    """Per confidence bin (``num_bins`` equal widths on ``[0, 1]``): mean confidence, accuracy, and count.

    Empty bins have confidence and accuracy ``nan`` and count 0.
    """
    _check(logits, labels)
    probs = predictive_probs(logits)
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).to(probs.dtype)
    bins = torch.clamp((confidence * num_bins).long(), max=num_bins - 1)
    count = torch.bincount(bins, minlength=num_bins).to(probs.dtype)
    mean_confidence = torch.bincount(bins, weights=confidence, minlength=num_bins) / count
    accuracy = torch.bincount(bins, weights=correct, minlength=num_bins) / count
    return mean_confidence, accuracy, count


def expected_calibration_error(logits: Tensor, labels: Tensor, num_bins: int = 15) -> Tensor:
    """ECE (Naeini et al., 2015): confidence-binned mean ``|accuracy - confidence|``, weighted by bin size."""
    confidence, accuracy, count = reliability_diagram(logits, labels, num_bins)
    gaps = torch.where(count > 0, (accuracy - confidence).abs(), torch.zeros_like(count))
    return (count * gaps).sum() / count.sum()


def predictive_entropy(logits: Tensor) -> Tensor:
    """Entropy of the predictive distribution per test point, ``(N,)``."""
    probs = predictive_probs(logits)
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def mean_and_standard_error(values) -> tuple[float, float]:
    """Mean and standard error (sample standard deviation / sqrt(n)) of per-split results; 0 for one value."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_and_standard_error: no values.")
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def rmse(f_samples: Tensor, y: Tensor) -> float:
    """Root mean squared error of the predictive mean; ``f_samples`` is ``(S, N)``."""
    return float((f_samples.mean(0) - y).pow(2).mean().sqrt())


def gaussian_row_nll(
    f_samples: Tensor, noise_scale: Tensor | float, y: Tensor, noise_weights: Sequence[float] | None = None
) -> Tensor:
    r"""Each point's negative log predictive density, :math:`-\log \frac1S \sum_s \mathcal{N}(y_i \mid f_s(x_i),
    \sigma^2)`, shape ``(N,)``, for ``f_samples`` of shape ``(S, N)``; ``noise_scale`` is one :math:`\sigma` or one
    per sample and point (``(S, N)``).

    With ``noise_weights`` :math:`w_1, \dots, w_K` (non-negative, summing to 1) the noise is a scale mixture:
    ``noise_scale`` has a leading axis of :math:`K` components, each as above, and the density is
    :math:`\sum_k w_k \frac1S \sum_s \mathcal{N}(y_i \mid f_s(x_i), \sigma_k^2)`. :func:`gaussian_mnll` is the
    mean; the points themselves show which rows a predictive pays for."""
    noise = torch.as_tensor(noise_scale, dtype=f_samples.dtype)
    samples = math.log(f_samples.shape[0])
    if noise_weights is None:
        log_density = torch.distributions.Normal(f_samples, noise).log_prob(y)
        return -(torch.logsumexp(log_density, 0) - samples)
    weights = torch.as_tensor(noise_weights, dtype=f_samples.dtype)
    if weights.dim() != 1 or noise.dim() < 1 or len(weights) != len(noise):
        raise ValueError(
            f"noise_weights needs one weight per noise component (noise_scale's leading axis); got "
            f"{tuple(weights.shape)} weights and noise_scale of shape {tuple(noise.shape)}."
        )
    if (weights < 0).any() or abs(float(weights.sum()) - 1.0) > 1e-9:
        raise ValueError(f"noise_weights must be non-negative and sum to 1, got {weights.tolist()}.")
    noise = noise.reshape(len(noise), *noise.shape[1:], *(1,) * (3 - noise.dim()))  # (K, S or 1, N or 1)
    log_density = torch.distributions.Normal(f_samples, noise).log_prob(y) + weights.log().view(-1, 1, 1)
    return -(torch.logsumexp(log_density.flatten(0, 1), 0) - samples)


def gaussian_mnll(
    f_samples: Tensor, noise_scale: Tensor | float, y: Tensor, noise_weights: Sequence[float] | None = None
) -> float:
    r"""Mean negative log predictive density, :math:`-\frac1N \sum_i \log \frac1S \sum_s
    \mathcal{N}(y_i \mid f_s(x_i), \sigma^2)`: the mean of :func:`gaussian_row_nll`, which takes the same
    arguments (a scale mixture's ``noise_weights`` included)."""
    return float(gaussian_row_nll(f_samples, noise_scale, y, noise_weights).mean())

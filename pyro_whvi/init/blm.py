r"""Bayesian linear regression, batched over independent problems (I-BLM paper App. B–D).

Problem ``j`` regresses targets :math:`y_j \in \mathbb{R}^n` on inputs :math:`X_j \in \mathbb{R}^{n \times d}`:

.. math::
    y_j = X_j w_j + \varepsilon_j, \quad \varepsilon_j \sim \mathcal{N}(0, \operatorname{diag}(\sigma_j^2)),
    \quad w_j \sim \mathcal{N}(m_j, \operatorname{diag}(\lambda_j)),

with posterior precision :math:`P_j = \Lambda_j^{-1} + X_j^\top \operatorname{diag}(\sigma_j^{-2}) X_j` and mean
:math:`\mu_j = P_j^{-1}(\Lambda_j^{-1} m_j + X_j^\top \operatorname{diag}(\sigma_j^{-2}) y_j)`. A scalar
:math:`\sigma^2` is the homoscedastic model of App. B, a per-point one the heteroscedastic model of App. C.
Every problem is solved at once through one batched Cholesky factorization of the ``d x d`` precisions.

Shape letters: ``J`` problems, ``n`` points per problem, ``d`` inputs, ``k`` classes.

References:
    S. Rossi, P. Michiardi, M. Filippone. *Good Initializations of Variational Bayes for Deep Models*.
    ICML 2019: §4.1–4.3, App. B (BLM), App. C (heteroscedastic BLM, marginal likelihood), App. D (mean-field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..distributions.qg_family import cholesky_with_jitter

__all__ = [
    "BLMPosterior",
    "blm_log_marginal",
    "blm_posterior",
    "dirichlet_label_transform",
    "evidence_hyperparameters",
]


@dataclass
class BLMPosterior:
    """The Gaussian posteriors of ``J`` Bayesian linear regressions."""

    mean: Tensor  #: ``(J, d)``
    precision: Tensor  #: ``(J, d, d)``
    precision_cholesky: Tensor  #: ``(J, d, d)``, lower, of ``precision`` (plus any jitter it needed)

    @property
    def covariance(self) -> Tensor:
        """``(J, d, d)``: :math:`P^{-1}`."""
        return torch.cholesky_inverse(self.precision_cholesky)

    @property
    def mean_field_variance(self) -> Tensor:
        r"""``(J, d)``: :math:`1 / P_{ii}`, the variances of the mean-field ``q`` closest in ``KL(q || p)`` (App. D)."""
        return 1.0 / self.precision.diagonal(dim1=-2, dim2=-1)


def _broadcast_noise(noise_variance: Tensor | float, targets: Tensor) -> Tensor:
    noise = torch.as_tensor(noise_variance, dtype=targets.dtype, device=targets.device)
    if (noise <= 0).any():
        raise ValueError("blm_posterior: noise_variance must be > 0.")
    return noise.expand_as(targets) if noise.dim() == 0 else noise.expand(targets.shape)


@dataclass
class _Statistics:
    r"""What the data of ``J`` regressions enter through: :math:`X^\top L^{-1} X`, :math:`X^\top L^{-1} y`,
    :math:`y^\top L^{-1} y` and :math:`\log|L|` (``L`` the noise covariance, or ``I`` when not given)."""

    gram: Tensor  #: ``(J, d, d)``
    projected: Tensor  #: ``(J, d)``
    square: Tensor  #: ``(J,)``
    log_det_noise: Tensor  #: ``(J,)``

    @classmethod
    def of(cls, inputs: Tensor, targets: Tensor, noise_variance: Tensor | float | None) -> _Statistics:
        if noise_variance is None:
            weighted, log_det = inputs, targets.new_zeros(targets.shape[:-1])
            weighted_targets = targets
        else:
            noise = _broadcast_noise(noise_variance, targets)
            weighted, log_det = inputs / noise.unsqueeze(-1), noise.log().sum(-1)
            weighted_targets = targets / noise
        return cls(
            weighted.transpose(-1, -2) @ inputs,
            (weighted.transpose(-1, -2) @ targets.unsqueeze(-1)).squeeze(-1),
            (weighted_targets * targets).sum(-1),
            log_det,
        )

    def log_marginal(self, num: int, prior_variance: Tensor, noise_scale: Tensor | float = 1.0) -> Tensor:
        """``(J,)`` log evidence with noise covariance ``noise_scale * L`` and prior ``N(0, diag(prior_variance))``."""
        precision = self.gram / noise_scale + torch.diag_embed(1.0 / prior_variance)
        chol = cholesky_with_jitter(precision, "blm_log_marginal")
        half = torch.linalg.solve_triangular(chol, (self.projected / noise_scale).unsqueeze(-1), upper=False)
        log_det = (
            self.log_det_noise
            + num * math.log(float(noise_scale))
            + prior_variance.log().sum(-1)
            + 2.0 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        )
        quadratic = self.square / noise_scale - half.squeeze(-1).pow(2).sum(-1)
        return -0.5 * (log_det + quadratic + num * math.log(2 * math.pi))


def blm_posterior(
    inputs: Tensor,
    targets: Tensor,
    noise_variance: Tensor | float,
    prior_variance: Tensor | float = 1.0,
    prior_mean: Tensor | float = 0.0,
) -> BLMPosterior:
    r"""Posterior of ``J`` Bayesian linear regressions (App. B; heteroscedastic App. C).

    :param inputs: ``(J, n, d)`` (or ``(n, d)`` shared by every problem).
    :param targets: ``(J, n)``.
    :param noise_variance: :math:`\sigma^2`: a scalar, ``(J, 1)``, or ``(J, n)`` per point (heteroscedastic).
    :param prior_variance: :math:`\Lambda`'s diagonal: a scalar, ``(d,)`` or ``(J, d)``.
    :param prior_mean: a scalar, ``(d,)`` or ``(J, d)``.
    """
    if inputs.dim() == 2:
        inputs = inputs.expand(targets.shape[0], -1, -1)
    if inputs.dim() != 3 or targets.shape != inputs.shape[:2]:
        raise ValueError(
            f"blm_posterior: inputs must be (J, n, d) and targets (J, n), got {tuple(inputs.shape)} and "
            f"{tuple(targets.shape)}."
        )
    num_problems, _, dim = inputs.shape
    stats = _Statistics.of(inputs, targets, noise_variance)
    prior_var = torch.as_tensor(prior_variance, dtype=inputs.dtype, device=inputs.device).expand(num_problems, dim)
    prior_loc = torch.as_tensor(prior_mean, dtype=inputs.dtype, device=inputs.device).expand(num_problems, dim)
    precision = stats.gram + torch.diag_embed(1.0 / prior_var)
    chol = cholesky_with_jitter(precision, "blm_posterior")
    rhs = stats.projected + prior_loc / prior_var
    mean = torch.cholesky_solve(rhs.unsqueeze(-1), chol).squeeze(-1)
    return BLMPosterior(mean, precision, chol)


def blm_log_marginal(
    inputs: Tensor,
    targets: Tensor,
    noise_variance: Tensor | float,
    prior_variance: Tensor | float = 1.0,
) -> Tensor:
    r"""``(J,)``: :math:`\log \mathcal{N}(y_j \mid 0, \operatorname{diag}(\sigma^2) + X \Lambda X^\top)` in
    :math:`O(n d^2)`, through the Woodbury identities of App. C (never an ``n x n`` matrix):

    .. math::
        -\tfrac12\Big(\textstyle\sum_i \log \sigma_i^2 + \log|\Lambda| + \log|P|
        + \tilde y^\top y - \tilde y^\top X P^{-1} X^\top \tilde y + n \log 2\pi\Big),
        \quad \tilde y = \operatorname{diag}(\sigma^{-2}) y.
    """
    if inputs.dim() == 2:
        inputs = inputs.expand(targets.shape[0], -1, -1)
    prior = torch.as_tensor(prior_variance, dtype=targets.dtype, device=targets.device)
    prior = prior.expand(targets.shape[0], inputs.shape[-1])
    return _Statistics.of(inputs, targets, noise_variance).log_marginal(targets.shape[-1], prior)


def evidence_hyperparameters(
    inputs: Tensor,
    targets: Tensor,
    prior_variance: Tensor | float,
    noise_variance: Tensor | float | None = None,
    prior_factors: Tensor | None = None,
    noise_grid_size: int = 13,
) -> tuple[Tensor, Tensor]:
    r"""Type-II maximum likelihood on a grid: ``(noise_variance, prior_factor)`` maximizing the summed
    log marginal likelihood of the ``J`` problems.

    The data enter only through :math:`X^\top L^{-1} X`, :math:`X^\top L^{-1} y` and :math:`y^\top L^{-1} y`
    (App. C's Woodbury form), computed once, so each grid point costs one ``d x d`` Cholesky per problem.

    :param noise_variance: fixed (e.g. the heteroscedastic variances of the label transform), or
        ``None`` to search a homoscedastic :math:`\sigma^2` on a log grid from :math:`10^{-3}` to
        :math:`10` times the targets' mean square.
    :param prior_factors: factors ``c`` for the prior variance ``c * prior_variance`` to search, or
        ``None`` to keep ``c = 1``.
    """
    if inputs.dim() == 2:
        inputs = inputs.expand(targets.shape[0], -1, -1)
    num, dim = inputs.shape[-2:]
    stats = _Statistics.of(inputs, targets, noise_variance)
    prior = torch.as_tensor(prior_variance, dtype=targets.dtype, device=targets.device).expand(targets.shape[0], dim)
    factors = prior_factors.to(targets) if prior_factors is not None else targets.new_ones(1)
    if noise_variance is None:
        scale = targets.pow(2).mean().clamp_min(1e-12)
        noises = scale * torch.logspace(-3, 1, noise_grid_size, dtype=targets.dtype, device=targets.device)
    else:
        noises = targets.new_ones(1)  # the statistics already hold the fixed variances
    best, best_value = (noises[0], factors[0]), -math.inf
    for noise in noises:
        for factor in factors:
            value = float(stats.log_marginal(num, factor * prior, noise).sum())
            if value > best_value:
                best, best_value = (noise, factor), value
    given = torch.as_tensor(noise_variance, device=targets.device) if noise_variance is not None else None
    return (best[0] if given is None else given), best[1]


def dirichlet_label_transform(labels: Tensor, num_classes: int, alpha: float = 0.01) -> tuple[Tensor, Tensor]:
    r"""Regression targets and per-point noise variances for class labels (I-BLM §4.3, Milios et al. 2018).

    One-hot labels ``y`` are read as the parameters of a Dirichlet, regularized by :math:`\alpha`; its
    Gamma components are moment-matched by log-normals:

    .. math:: \sigma^2 = \log\big(1 / (y + \alpha) + 1\big), \qquad \tilde y = \log(y + \alpha) - \sigma^2 / 2.

    ``softmax`` of the log-normals' means, :math:`\exp(\tilde y + \sigma^2/2)` normalized, gives back
    :math:`(y + \alpha) / (1 + k \alpha)`, the label probabilities the transform encodes.

    :param labels: ``(N,)`` integer classes, or ``(N, k)`` one-hot/probability rows.
    :returns: ``(targets, noise_variance)``, both ``(N, k)``.
    """
    if not alpha > 0:
        raise ValueError(f"dirichlet_label_transform: alpha must be > 0, got {alpha!r}.")
    if labels.dim() == 1:
        if labels.is_floating_point() and not torch.equal(labels, labels.round()):
            raise ValueError("dirichlet_label_transform: 1-D labels must be integer class indices.")
        labels = labels.long()
        if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"dirichlet_label_transform: labels must lie in [0, {num_classes}).")
        one_hot = F.one_hot(labels, num_classes).to(torch.get_default_dtype())
    else:
        one_hot = labels
    variance = torch.log1p(1.0 / (one_hot + alpha))
    return torch.log(one_hot + alpha) - variance / 2, variance

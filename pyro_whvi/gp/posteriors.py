r"""Variational posteriors over the weights ``w`` of a linearized GP ``f = Phi(x) w``.

Shape letters: ``N`` inputs, ``F`` features (``N_RF``), ``L`` latent dimension of ``q`` (``F`` for a
Gaussian over ``w``, ``D`` for WHVI), ``R`` columns of the covariance root, ``...`` batch.

Every posterior is linear-Gaussian in its latent ``z ~ N(mu, C C^T)``: ``f = Psi(x) z`` for a design
``Psi`` computed from the features. :meth:`WeightPosterior.design` is the one hook a posterior
implements; the predictive mean ``Psi mu``, the covariance root ``Psi C`` (``N x R``, never ``N x N``),
the closed-form KL and the conjugate optimum are shared.

* :class:`GaussianWeightPosterior`: ``z = w``, ``Psi = Phi``, prior ``N(0, I)``.
* :class:`WHVIWeightPosterior`: ``w`` reshaped into a ``D x D`` matrix ``W = S1 H diag(g) H S2`` with
  ``D^2 >= F`` (WHVI paper §2.5), ``z = g``, and ``Psi(x)_k = [H (S1 R(x) S2) H]_kk`` with
  ``R(x)`` the features reshaped the same way (:func:`pyro_whvi.ops.whvi_design`, one pass over the
  features and one length-``D`` FWHT per input); ``O(sqrt F)`` parameters.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, §2.2–2.5, App. D.4 and Table 10.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import gpytorch
import torch
import torch.nn.functional as F
from torch import Tensor

from ..distributions.layout import WHVILayout
from ..nn.base import softplus_inverse
from ..ops import fwht, whvi_design

__all__ = ["COVARIANCES", "GaussianWeightPosterior", "WHVIWeightPosterior", "WeightPosterior"]

COVARIANCES = ("diagonal", "full")


class WeightPosterior(gpytorch.Module, ABC):
    r"""``q(z) = N(mu, C C^T)`` with ``C`` diagonal or lower-triangular, prior ``N(0, lambda I)``.

    :param latent_dim: ``L``.
    :param covariance: ``"diagonal"`` (mean-field) or ``"full"`` (Cholesky factor).
    :param prior_variance: ``lambda``.
    :param init_scale: initial standard deviations of ``q`` (default: a tenth of the prior's). Starting
        at the prior's makes Adam spend its first thousands of steps shrinking them: on a 4-D test
        problem (1,600 points, 1,500 steps) the test RMSE of WHVI was 0.34 from the prior's scale and
        0.08 from a tenth of it; mean-field 0.12 and 0.09.
    """

    def __init__(self, latent_dim: int, covariance: str, prior_variance: float, init_scale: float | None = None):
        super().__init__()
        if covariance not in COVARIANCES:
            raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}.")
        if not prior_variance > 0:
            raise ValueError(f"prior_variance must be positive, got {prior_variance!r}.")
        self.latent_dim = latent_dim
        self.covariance = covariance
        self.prior_variance = float(prior_variance)
        scale = torch.full((latent_dim,), init_scale if init_scale is not None else 0.1 * math.sqrt(prior_variance))
        self.loc = torch.nn.Parameter(torch.zeros(latent_dim))
        self.raw_scale = torch.nn.Parameter(softplus_inverse(scale))
        if covariance == "full":
            self.scale_tril_offdiag = torch.nn.Parameter(torch.zeros(latent_dim, latent_dim))

    @abstractmethod
    def design(self, features: Tensor) -> Tensor:
        """``Psi``: ``(..., N, F)`` features to the ``(..., N, L)`` design with ``f = Psi z``."""

    @property
    @abstractmethod
    def num_variational_parameters(self) -> int:
        """Free variational parameters (a full Cholesky factor counts ``L(L+1)/2``)."""

    def _covariance_parameters(self) -> int:
        return self.latent_dim * (self.latent_dim + 1) // 2 if self.covariance == "full" else self.latent_dim

    @property
    def scale(self) -> Tensor:
        """Standard deviations (diagonal) or the diagonal of the Cholesky factor."""
        return F.softplus(self.raw_scale)

    @property
    def scale_tril(self) -> Tensor:
        """``C``, ``(L, L)`` lower triangular."""
        if self.covariance == "diagonal":
            return torch.diag_embed(self.scale)
        return torch.tril(self.scale_tril_offdiag, -1) + torch.diag_embed(self.scale)

    def mean_and_root(self, features: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive mean ``(..., N)`` and covariance root ``(..., N, L)`` of ``f`` at these features."""
        return self.mean_and_root_of_design(self.design(features))

    def mean_and_root_of_design(self, design: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`mean_and_root` from the design ``Psi`` ``(..., N, L)``."""
        mean = design @ self.loc
        if self.covariance == "diagonal":
            return mean, design * self.scale
        return mean, design @ self.scale_tril

    def kl_divergence(self) -> Tensor:
        r""":math:`\mathrm{KL}(q(z) \,\|\, \mathcal N(0, \lambda I))` in closed form."""
        scale_tril = self.scale_tril
        trace = scale_tril.pow(2).sum() / self.prior_variance
        mahalanobis = self.loc.pow(2).sum() / self.prior_variance
        log_det_ratio = self.latent_dim * math.log(self.prior_variance) - 2 * self.scale.log().sum()
        return 0.5 * (trace + mahalanobis - self.latent_dim + log_det_ratio)

    @torch.no_grad()
    def set_conjugate_(self, design: Tensor, y: Tensor, noise_variance: Tensor | float) -> None:
        r"""Set ``q`` to the ELBO's maximizer under ``y ~ N(Psi z, noise I)`` with this design.

        Full covariance: the exact posterior. Diagonal: the mean-field optimum, posterior mean and
        variances :math:`1 / \Lambda_{ii}` from the precision :math:`\Lambda` (I-BLM paper App. D).
        """
        precision = design.mT @ design / noise_variance
        eye = torch.eye(self.latent_dim, dtype=design.dtype, device=design.device)
        precision = precision + eye / self.prior_variance
        cholesky = torch.linalg.cholesky(precision)
        self.loc.copy_(torch.cholesky_solve((design.mT @ y / noise_variance)[:, None], cholesky)[:, 0])
        if self.covariance == "diagonal":
            self.raw_scale.copy_(softplus_inverse(precision.diagonal().rsqrt()))
            return
        covariance = torch.cholesky_inverse(cholesky)
        scale_tril = torch.linalg.cholesky(covariance)
        self.raw_scale.copy_(softplus_inverse(scale_tril.diagonal()))
        self.scale_tril_offdiag.copy_(scale_tril)


class GaussianWeightPosterior(WeightPosterior):
    """``q(w) = N(mu, C C^T)`` directly over the ``F`` weights, prior ``N(0, I)`` (mean-field or full)."""

    def __init__(self, num_features: int, covariance: str = "diagonal"):
        super().__init__(num_features, covariance, prior_variance=1.0)

    def design(self, features: Tensor) -> Tensor:
        return features

    @property
    def num_variational_parameters(self) -> int:
        return self.latent_dim + self._covariance_parameters()


class WHVIWeightPosterior(WeightPosterior):
    r"""WHVI over ``w`` reshaped into ``W = S1 H diag(g) H S2`` (``D x D``, ``D^2 >= F``), ``q(g) = N(mu, C C^T)``.

    ``S1``, ``S2`` are point estimates (initialized to 1); the prior is on ``g``,
    :math:`\mathcal N(0, \lambda I)`. The default :math:`\lambda = D` gives each entry of ``W`` unit prior
    variance when ``S1 = S2 = I``, the scale of the GP prior ``w ~ N(0, I)``.

    :param num_features: ``F``.
    :param covariance: ``"diagonal"`` (``4D`` parameters) or ``"full"`` (``3D + D(D+1)/2``).
    :param prior_variance: ``lambda`` (default ``D``).
    """

    def __init__(self, num_features: int, covariance: str = "diagonal", prior_variance: float | None = None):
        layout = WHVILayout.for_shape((num_features,), site="RandomFeatureGP weights")
        block = layout.block_size
        super().__init__(block, covariance, prior_variance=float(block) if prior_variance is None else prior_variance)
        self.num_features = num_features
        self.s1 = torch.nn.Parameter(torch.ones(block))
        self.s2 = torch.nn.Parameter(torch.ones(block))

    def design(self, features: Tensor) -> Tensor:
        block = self.latent_dim
        if features.shape[-1] < block * block:
            features = F.pad(features, (0, block * block - features.shape[-1]))
        return whvi_design(features.unflatten(-1, (block, block)), self.s1, self.s2)

    def weight_mean(self) -> Tensor:
        """``E_q[w]``, ``(F,)``: the first ``F`` entries of ``S1 H diag(mu) H S2`` read row by row."""
        eye = torch.eye(self.latent_dim, dtype=self.loc.dtype, device=self.loc.device)
        matrix = self.s1[:, None] * fwht(fwht(eye * self.loc).mT).mT * self.s2
        return matrix.flatten()[: self.num_features]

    @property
    def num_variational_parameters(self) -> int:
        return 3 * self.latent_dim + self._covariance_parameters()

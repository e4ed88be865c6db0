r"""Variational posteriors over the weights ``w`` of a linearized GP ``f = Phi(x) w``.

Shape letters: ``N`` inputs, ``F`` features (``N_RF``), ``L`` latent dimension of ``q`` (``F`` for a
Gaussian over ``w``, ``D`` for WHVI), ``R`` columns of the covariance root, ``...`` batch.

Every posterior is a pure ``q(z) = N(mu, C C^T)`` over the latent ``z`` with ``f = Psi(x) z``; the design
``Psi`` (and WHVI's ``S1``, ``S2``) belongs to the variational strategy
(:mod:`~pyro_whvi.gp.variational_strategy`), as GPyTorch's strategies own the map from inducing values to
``f``. The closed-form KL and the conjugate optimum given a design are those of the one ``q(g)`` family,
:class:`~pyro_whvi.distributions.qg_family.GaussianQG` (this module only stores its values, with
softplus-parameterized scales). Each posterior is GPyTorch's variational distribution over these
"inducing" weights (:class:`gpytorch.variational._VariationalDistribution`); the strategy that maps it
to ``q(f)`` is :class:`~pyro_whvi.gp.variational_strategy.RandomFeatureVariationalStrategy`.

* :class:`GaussianWeightPosterior`: ``z = w``, prior ``N(0, I)`` (the strategy's design is ``Psi = Phi``).
* :class:`WHVIWeightPosterior`: ``z = g`` of ``w`` reshaped into a ``D x D`` matrix ``W = S1 H diag(g) H S2``
  with ``D^2 >= F`` (WHVI paper §2.5), prior ``N(0, D I)``; the strategy
  (:class:`~pyro_whvi.gp.variational_strategy.WHVIVariationalStrategy`) holds ``S1``, ``S2`` and the design
  ``Psi(x)_k = [H (S1 R(x) S2) H]_kk``; ``O(sqrt F)`` parameters in all.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, §2.2–2.5, App. D.4 and Table 10.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from gpytorch.distributions import MultivariateNormal
from gpytorch.variational import _VariationalDistribution
from linear_operator.operators import CholLinearOperator, DiagLinearOperator, TriangularLinearOperator
from torch import Tensor

from ..distributions.layout import WHVILayout
from ..distributions.qg_family import GP_CONVENTION, GaussianQG, check_covariance
from ..nn.base import softplus_inverse

__all__ = ["COVARIANCES", "GaussianWeightPosterior", "WHVIWeightPosterior", "WeightPosterior"]

COVARIANCES = ("diagonal", "full")


class WeightPosterior(_VariationalDistribution, ABC):
    r"""``q(z) = N(mu, C C^T)`` with ``C`` diagonal or lower-triangular, prior ``N(0, lambda I)``.

    GPyTorch's variational distribution over the ``L`` inducing variables ``z`` (:meth:`forward` is
    ``q(z)``); the strategy's predictive
    (:meth:`~pyro_whvi.gp.variational_strategy.RandomFeatureVariationalStrategy.mean_and_root`) reads
    its mean ``loc`` and its root ``C`` (:attr:`scale` or :attr:`scale_tril`) instead, without building
    the ``L x L`` covariance.

    :param latent_dim: ``L``.
    :param covariance: ``"diagonal"`` (mean-field) or ``"full"`` (Cholesky factor).
    :param prior_variance: ``lambda``.
    :param init_scale: initial standard deviations of ``q`` (default: a tenth of the prior's). Starting
        at the prior's makes Adam spend its first thousands of steps shrinking them: on a 4-D test
        problem (1,600 points, 1,500 steps) the test RMSE of WHVI was 0.34 from the prior's scale and
        0.08 from a tenth of it; mean-field 0.12 and 0.09.
    """

    def __init__(self, latent_dim: int, covariance: str, prior_variance: float, init_scale: float | None = None):
        super().__init__(latent_dim)
        check_covariance(covariance, COVARIANCES, "WeightPosterior")
        if not prior_variance > 0:
            raise ValueError(f"prior_variance must be positive, got {prior_variance!r}.")
        self.latent_dim = latent_dim
        self.covariance = covariance
        self.prior_variance = float(prior_variance)
        sigma = init_scale if init_scale is not None else 0.1 * math.sqrt(prior_variance)
        self.init_scale = sigma
        initial = GaussianQG.isotropic(covariance, torch.zeros(latent_dim), sigma)
        self.loc = torch.nn.Parameter(initial.loc)
        self.raw_scale = torch.nn.Parameter(softplus_inverse(_root_diagonal(initial)))
        if initial.scale_tril is not None:
            self.scale_tril_offdiag = torch.nn.Parameter(torch.tril(initial.scale_tril, -1))

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

    def forward(self) -> MultivariateNormal:
        """``q(z)`` as GPyTorch's :class:`~gpytorch.distributions.MultivariateNormal` (covariance ``C C^T`` lazily)."""
        if self.covariance == "diagonal":
            return MultivariateNormal(self.loc, DiagLinearOperator(self.scale.pow(2)))
        return MultivariateNormal(self.loc, CholLinearOperator(TriangularLinearOperator(self.scale_tril)))

    @torch.no_grad()
    def initialize_variational_distribution(self, prior_dist: MultivariateNormal) -> None:
        """Reset ``q`` to its initial state: the prior's mean and :attr:`init_scale` standard deviations.

        The strategy never calls it (``q`` is initialized when built); it is GPyTorch's hook for a reset.
        """
        self.loc.copy_(prior_dist.mean)
        self.raw_scale.copy_(softplus_inverse(torch.full_like(self.raw_scale, self.init_scale)))
        if self.covariance == "full":
            self.scale_tril_offdiag.zero_()

    def qg(self) -> GaussianQG:
        """``q(z)`` as the family's :class:`GaussianQG` (differentiable in this module's parameters)."""
        if self.covariance == "diagonal":
            return GaussianQG("diagonal", self.loc, scale=self.scale)
        return GaussianQG("full", self.loc, scale=self.scale, scale_tril=self.scale_tril)

    def kl_divergence(self) -> Tensor:
        r""":math:`\mathrm{KL}(q(z) \,\|\, \mathcal N(0, \lambda I))` in closed form (:meth:`GaussianQG.kl_divergence`).

        Both kinds are handed to it as a dense triangular root (``diag(sigma)`` for the diagonal one)
        with the diagonal ``sigma`` alongside for the log-determinant: the same arithmetic, and the
        same autograd graph, as this module had, so seeded fits reproduce bitwise. Summing ``sigma^2``
        directly (O(L) instead of O(L^2)) changes the KL's last bit.
        """
        return GaussianQG("full", self.loc, scale=self.scale, scale_tril=self.scale_tril).kl_divergence(
            self.prior_variance
        )

    @torch.no_grad()
    def set_conjugate_(self, design: Tensor, y: Tensor, noise_variance: Tensor | float) -> None:
        r"""Set ``q`` to the ELBO's maximizer under ``y ~ N(Psi z, noise I)`` with this design.

        Full covariance: the exact posterior. Diagonal: the mean-field optimum, posterior mean and
        variances :math:`1 / \Lambda_{ii}` from the precision :math:`\Lambda` (I-BLM paper App. D).
        """
        precision = design.mT @ design / noise_variance
        eye = torch.eye(self.latent_dim, dtype=design.dtype, device=design.device)
        precision = precision + eye / self.prior_variance
        qg = GaussianQG.from_precision(self.covariance, precision, design.mT @ y / noise_variance)
        self.loc.copy_(qg.loc)
        self.raw_scale.copy_(softplus_inverse(_root_diagonal(qg)))
        if qg.scale_tril is not None:
            self.scale_tril_offdiag.copy_(qg.scale_tril)


def _root_diagonal(qg: GaussianQG) -> Tensor:
    """The diagonal of ``q``'s root: what ``raw_scale`` stores (through softplus) for either kind."""
    return qg.scale_tril.diagonal(dim1=-2, dim2=-1) if qg.scale_tril is not None else qg.scale  # type: ignore[return-value]


class GaussianWeightPosterior(WeightPosterior):
    """``q(w) = N(mu, C C^T)`` directly over the ``F`` weights, prior ``N(0, I)`` (mean-field or full)."""

    def __init__(self, num_features: int, covariance: str = "diagonal"):
        super().__init__(num_features, covariance, prior_variance=1.0)

    @property
    def num_variational_parameters(self) -> int:
        return self.latent_dim + self._covariance_parameters()


class WHVIWeightPosterior(WeightPosterior):
    r"""WHVI's ``q(g) = N(mu, C C^T)`` over the ``D`` latents of ``w`` reshaped into ``W = S1 H diag(g) H S2``
    (``D x D``, ``D^2 >= F``), prior :math:`\mathcal N(0, \lambda I)`.

    ``S1``, ``S2`` are point estimates of the design, held by
    :class:`~pyro_whvi.gp.variational_strategy.WHVIVariationalStrategy`. The default :math:`\lambda = D`
    gives each entry of ``W`` unit prior variance when ``S1 = S2 = I``, the scale of the GP prior
    ``w ~ N(0, I)``: the :data:`~pyro_whvi.distributions.conventions.GP_CONVENTION` (networks use
    ``NETWORK_CONVENTION``, weight variance ``1/D``; see :mod:`~pyro_whvi.distributions.qg_family`).

    :param num_features: ``F``.
    :param covariance: ``"diagonal"`` or ``"full"``.
    :param prior_variance: ``lambda`` (default ``D``).
    """

    def __init__(self, num_features: int, covariance: str = "diagonal", prior_variance: float | None = None):
        layout = WHVILayout.for_shape((num_features,), site="RandomFeatureGP weights")
        prior_variance = GP_CONVENTION.resolve_prior_variance(layout.block_size, prior_variance)
        super().__init__(layout.block_size, covariance, prior_variance=prior_variance)
        self.layout, self.num_features = layout, num_features

    @property
    def num_variational_parameters(self) -> int:
        """The free parameters of WHVI's ``q(w)``: ``q(g)``'s and the ``2D`` of ``S1``, ``S2`` (which the
        strategy holds): ``4D`` (diagonal) or ``3D + D(D+1)/2`` (full)."""
        return 3 * self.latent_dim + self._covariance_parameters()

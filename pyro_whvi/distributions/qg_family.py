r"""The one family of WHVI posteriors ``q(g)``, and the WHVI conventions that fix the prior's scale.

``g`` is a batch of blocks ``(..., D)`` (``(K, D)`` in a network guide, ``(D,)`` in the GP) and
``q(g) = N(mu, Sigma)`` independently per block, with :math:`\Sigma` of one of three kinds:

* ``"diagonal"``: :math:`\Sigma = \operatorname{diag}(\sigma^2)` (the paper's G-WHVI), fields ``scale``;
* ``"full"``: :math:`\Sigma = C C^\top` with ``C`` lower triangular, field ``scale_tril``;
* ``"lowrank"``: :math:`\Sigma = \operatorname{diag}(\sigma^2) + U U^\top`, fields ``scale``, ``cov_factor``.

A diagonal ``q(g)`` may also be pushed through planar flows (NF-WHVI, :class:`PlanarFlowNormal`).
:class:`GaussianQG` holds the *constrained* values; how a holder stores them (a guide's ``PyroParam``
s, the GP's softplus-parameterized ``nn.Parameter`` s) is the holder's business and its names stay
its own. Everything else about ``q(g)`` is written here once: the initial / isotropic values, the
best Gaussian of a kind given a posterior precision (I-BLM App. D), the torch distribution, and the
closed-form :math:`\mathrm{KL}(q \,\|\, \mathcal N(0, \lambda I))`.

**Conventions.** With :math:`p(g) = \mathcal N(0, \lambda I)` and :math:`S_1 = S_2 = s I`,
:math:`\operatorname{Var} W_{ij} = s^4 \lambda / D`. The model only sees :math:`s^4 \lambda`: the map
:math:`g \to c g`, :math:`\lambda \to c^2 \lambda`, :math:`s \to s / \sqrt c` leaves ``W`` and the KL
unchanged, but not Adam's steps (absolute in parameter units). :class:`WHVIConvention` names where the
scale sits: :data:`NETWORK_CONVENTION` (``lambda = 1``, ``s = lambda^{-1/4}``, random signs on ``S2``:
weight variance ``1/D``, LeCun-style) and :data:`GP_CONVENTION` (``lambda = D``, ``s = 1``: weight
variance ``1``, the GP prior ``w ~ N(0, I)``). They differ in the prior variance of the weights, so
no choice of ``lambda`` under one gives the other.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020: §2.2–2.5 (q(g), eq. 4), App. C (NF-WHVI), App. D.1 and D.4.
    S. Rossi, P. Michiardi, M. Filippone. *Good Initializations of Variational Bayes for Deep
    Models*. ICML 2019: §4, App. D (the mean-field optimum given a precision).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from torch import Tensor

from .conventions import GP_CONVENTION, NETWORK_CONVENTION, WHVIConvention
from .planar import PlanarFlowNormal

__all__ = [
    "COVARIANCES",
    "GP_CONVENTION",
    "NETWORK_CONVENTION",
    "QG_CONSTRAINTS",
    "QG_FIELDS",
    "GaussianQG",
    "WHVIConvention",
    "cholesky_with_jitter",
    "diagonal_normal_kl",
]

COVARIANCES = ("diagonal", "full", "lowrank")

#: The fields of each kind besides ``loc``, in the order holders declare and read them.
QG_FIELDS: dict[str, tuple[str, ...]] = {
    "diagonal": ("scale",),
    "full": ("scale_tril",),
    "lowrank": ("scale", "cov_factor"),
}

#: The constraint of each field, for holders that store them as Pyro parameters.
QG_CONSTRAINTS: dict[str, constraints.Constraint] = {
    "loc": constraints.real,
    "scale": constraints.softplus_positive,
    "scale_tril": constraints.lower_cholesky,
    "cov_factor": constraints.real,
}


def check_covariance(kind: str, allowed: Sequence[str] = COVARIANCES, what: str = "q(g)") -> None:
    if kind not in allowed:
        raise ValueError(f"{what}: covariance must be one of {tuple(allowed)}, got {kind!r}.")


@dataclass(frozen=True)
class GaussianQG:
    r"""``q(g) = N(loc, Sigma)`` over blocks ``(..., D)``, :math:`\Sigma` of kind ``kind`` (see the module).

    :param kind: ``"diagonal"``, ``"full"`` or ``"lowrank"``.
    :param loc: ``(..., D)``.
    :param scale: ``(..., D)``: the standard deviations (``"diagonal"``), the square root of the diagonal
        part (``"lowrank"``), or, optionally for ``"full"``, the diagonal of ``scale_tril`` as the holder
        stores it (the log-determinant then reads it, so its gradient takes the holder's path).
    :param scale_tril: ``(..., D, D)`` lower-triangular root (``"full"``).
    :param cov_factor: ``(..., D, R)`` (``"lowrank"``).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2–2.5; I-BLM paper (Rossi et al., ICML 2019), App. D.
    """

    kind: str
    loc: Tensor
    scale: Tensor | None = None
    scale_tril: Tensor | None = None
    cov_factor: Tensor | None = None

    def __post_init__(self) -> None:
        check_covariance(self.kind)
        missing = [f for f in QG_FIELDS[self.kind] if getattr(self, f) is None]
        if missing:
            raise ValueError(f"GaussianQG({self.kind!r}): missing {', '.join(missing)}.")

    # -- constructors ------------------------------------------------------------------------------

    @classmethod
    def isotropic(
        cls, kind: str, loc: Tensor, sigma: float | Tensor, *, rank: int | None = None, factor_scale: float = 0.0
    ) -> GaussianQG:
        """``Sigma = sigma^2 I`` (the low-rank factor zero, or ``factor_scale * sigma * N(0, 1)`` entries
        to start training: ``U = 0`` is a stationary point of the ELBO's expectation in ``U``)."""
        check_covariance(kind)
        block_size = loc.shape[-1]
        if kind == "full":
            eye = torch.eye(block_size, dtype=loc.dtype, device=loc.device)
            return cls(kind, loc, scale_tril=(float(sigma) * eye).expand(*loc.shape, block_size).clone())
        scale = torch.full_like(loc, float(sigma))
        if kind == "diagonal":
            return cls(kind, loc, scale=scale)
        if rank is None or rank < 1:
            raise ValueError(f"GaussianQG.isotropic: 'lowrank' needs a rank >= 1, got {rank!r}.")
        shape = (*loc.shape, rank)
        if factor_scale:
            factor = factor_scale * float(sigma) * torch.randn(shape, dtype=loc.dtype, device=loc.device)
        else:
            factor = loc.new_zeros(shape)
        return cls(kind, loc, scale=scale, cov_factor=factor)

    @classmethod
    def from_precision(
        cls, kind: str, precision: Tensor, rhs: Tensor, *, cholesky: Tensor | None = None, rank: int | None = None
    ) -> GaussianQG:
        r"""The best ``q`` of this kind for the Gaussian with ``precision`` ``(..., D, D)`` and mean
        ``precision^{-1} rhs``.

        ``"diagonal"``: mean and variances :math:`1 / P_{ii}`, the minimizer of ``KL(q || p)`` (I-BLM
        App. D); ``"full"``: the Gaussian itself; ``"lowrank"``: its ``rank`` leading eigen-directions
        (a probabilistic-PCA split) plus the rest of the variances on the diagonal.

        :param cholesky: the lower Cholesky factor of ``precision``, when the caller has it (e.g. with jitter).
        """
        check_covariance(kind)
        chol = torch.linalg.cholesky(precision) if cholesky is None else cholesky
        loc = torch.cholesky_solve(rhs.unsqueeze(-1), chol).squeeze(-1)
        if kind == "diagonal":
            return cls(kind, loc, scale=precision.diagonal(dim1=-2, dim2=-1).rsqrt())
        covariance = torch.cholesky_inverse(chol)
        if kind == "full":
            return cls(kind, loc, scale_tril=torch.linalg.cholesky(covariance))
        block_size = loc.shape[-1]
        if rank is None or rank < 1:
            raise ValueError(f"GaussianQG.from_precision: 'lowrank' needs a rank >= 1, got {rank!r}.")
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
        rest = eigenvalues[..., : block_size - rank]
        residual = rest.mean(-1, keepdim=True) if rank < block_size else torch.zeros_like(eigenvalues[..., :1])
        top = (eigenvalues[..., -rank:] - residual).clamp_min(0.0)
        factor = eigenvectors[..., -rank:] * top.sqrt().unsqueeze(-2)
        diag = (covariance.diagonal(dim1=-2, dim2=-1) - factor.pow(2).sum(-1)).clamp_min(1e-12)
        return cls(kind, loc, scale=diag.sqrt(), cov_factor=factor)

    # -- views ------------------------------------------------------------------------------------

    def fields(self) -> dict[str, Tensor]:
        """``{"loc": ..., <the kind's fields>}``, constrained values, in declaration order."""
        return {"loc": self.loc, **{name: getattr(self, name) for name in QG_FIELDS[self.kind]}}

    @property
    def rank(self) -> int | None:
        return None if self.cov_factor is None else self.cov_factor.shape[-1]

    def covariance_matrix(self) -> Tensor:
        """The dense per-block covariance ``(..., D, D)``."""
        if self.kind == "full":
            assert self.scale_tril is not None
            return self.scale_tril @ self.scale_tril.mT
        assert self.scale is not None
        diagonal = torch.diag_embed(self.scale.pow(2))
        if self.kind == "diagonal":
            return diagonal
        assert self.cov_factor is not None
        return diagonal + self.cov_factor @ self.cov_factor.mT

    def distribution(self, flows: Sequence | None = None) -> dist.TorchDistribution:
        """The Pyro distribution, event shape ``loc.shape``, batch shape ``()``.

        :param flows: Pyro ``Planar`` transforms over the flattened ``loc`` (``"diagonal"`` only): NF-WHVI.
        """
        event_dims = self.loc.dim()
        if self.kind == "full":
            return dist.MultivariateNormal(self.loc, scale_tril=self.scale_tril).to_event(event_dims - 1)
        assert self.scale is not None
        if self.kind == "lowrank":
            assert self.cov_factor is not None
            return dist.LowRankMultivariateNormal(self.loc, self.cov_factor, self.scale**2).to_event(event_dims - 1)
        if flows:
            return PlanarFlowNormal(self.loc, self.scale, list(flows))
        return dist.Normal(self.loc, self.scale).to_event(event_dims)

    def kl_divergence(self, prior_variance: float) -> Tensor:
        r""":math:`\mathrm{KL}(q \,\|\, \mathcal N(0, \lambda I))`, summed over every block, in closed form:
        :math:`\tfrac12 (\operatorname{tr}\Sigma / \lambda + \lVert\mu\rVert^2 / \lambda - L + L \log\lambda
        - \log\lvert\Sigma\rvert)`, ``L = loc.numel()``; for ``"diagonal"`` the same sum taken entry by entry
        (:func:`diagonal_normal_kl`).

        This is the package's one closed form of the q(g) KL: the network layers, the GP posteriors and
        the tests all come here.
        """
        if self.kind == "diagonal":
            assert self.scale is not None
            return diagonal_normal_kl(self.loc, self.scale, math.sqrt(prior_variance))
        latent = self.loc.numel()
        trace = self._trace() / prior_variance
        mahalanobis = self.loc.pow(2).sum() / prior_variance
        log_det_ratio = latent * math.log(prior_variance) - self._log_det()
        return 0.5 * (trace + mahalanobis - latent + log_det_ratio)

    def _trace(self) -> Tensor:
        if self.kind == "full":
            assert self.scale_tril is not None
            return self.scale_tril.pow(2).sum()
        assert self.scale is not None
        trace = self.scale.pow(2).sum()
        if self.kind == "lowrank":
            assert self.cov_factor is not None
            trace = trace + self.cov_factor.pow(2).sum()
        return trace

    def _log_det(self) -> Tensor:
        if self.kind == "full" and self.scale is None:
            assert self.scale_tril is not None
            return 2 * self.scale_tril.diagonal(dim1=-2, dim2=-1).log().sum()
        assert self.scale is not None
        log_det = 2 * self.scale.log().sum()
        if self.kind == "lowrank":  # matrix determinant lemma: |D + U U^T| = |D| |I + U^T D^{-1} U|
            assert self.cov_factor is not None
            scaled = self.cov_factor / self.scale.unsqueeze(-1)
            capacitance = scaled.mT @ scaled + torch.eye(scaled.shape[-1], dtype=scaled.dtype, device=scaled.device)
            log_det = log_det + 2 * torch.linalg.cholesky(capacitance).diagonal(dim1=-2, dim2=-1).log().sum()
        return log_det


def diagonal_normal_kl(loc: Tensor, scale: Tensor, prior_scale: float | Tensor) -> Tensor:
    r""":math:`\sum_i \mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2) \,\|\, \mathcal N(0, \sigma_p^2))`
    :math:`= \tfrac12 \sum_i (r_i + \mu_i^2 / \sigma_p^2 - 1 - \log r_i)`, :math:`r_i = \sigma_i^2 / \sigma_p^2`.

    The diagonal kind's KL (:meth:`GaussianQG.kl_divergence`), and that of every mean-field Normal in the
    package (the layers' biases and mean-field weights). Written with the operations of
    ``torch.distributions.kl_divergence(Normal, Normal)``, so seeded fits that used it reproduce bitwise.
    """
    prior_scale = torch.as_tensor(prior_scale, dtype=loc.dtype, device=loc.device)
    variance_ratio = (scale / prior_scale).pow(2)
    mahalanobis = (loc / prior_scale).pow(2)
    return (0.5 * (variance_ratio + mahalanobis - 1 - variance_ratio.log())).sum()


def cholesky_with_jitter(matrix: Tensor, what: str) -> Tensor:
    """Lower Cholesky factor, adding jitter (up to 1e-2 of the mean diagonal) when ``matrix`` is singular."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if not info.any():
        return factor
    scale = matrix.diagonal(dim1=-2, dim2=-1).abs().mean(-1, keepdim=True).clamp_min(1e-12)
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    for exponent in range(-10, -1):
        factor, info = torch.linalg.cholesky_ex(matrix + (10.0**exponent * scale).unsqueeze(-1) * eye)
        if not info.any():
            return factor
    raise ValueError(f"{what}: the matrix is not positive definite even with jitter (NaN or Inf in the inputs?).")

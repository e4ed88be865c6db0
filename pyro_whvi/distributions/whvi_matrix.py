r"""The matrix-variate distribution WHVI induces on a weight (WHVI paper §2.2, App. A).

.. math:: W = S_1 H \operatorname{diag}(g) H S_2, \qquad g \sim q(g),

stacked over ``K`` blocks and cut to the weight's shape (:class:`~pyro_whvi.distributions.WHVILayout`).
``vect(W) = A g`` (eq. 4) is linear in ``g``, so every Gaussian ``q(g) = N(mu, Sigma)`` gives a Gaussian
``q(W)`` with mean :math:`S_1 H \operatorname{diag}(\mu) H S_2` and covariance :math:`A \Sigma A^\top`,
of rank at most ``K D``: it has no density on the space of matrices.

Shape letters: ``K`` blocks, ``D`` block size, ``...`` sample dims; the event shape is the weight's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from pyro.distributions import TorchDistribution, constraints
from torch import Tensor
from torch.distributions import Distribution, Independent, LowRankMultivariateNormal, MultivariateNormal, Normal

from ..ops import fwht, fwht_
from ..ops.shapes import stacked_whvi_matvec, stacked_whvi_weight
from .layout import WHVILayout

__all__ = ["WHVIMatrix", "WHVINormal", "base_distribution", "gaussian_blocks", "has_real_support", "whvi_weight"]


def whvi_weight(s1: Tensor, g: Tensor, s2: Tensor, layout: WHVILayout) -> Tensor:
    r"""The dense weight :math:`S_1 H \operatorname{diag}(g) H S_2` for draws ``g`` of shape ``(..., K, D)``.

    Costs :math:`O(K D^2 \log D)` per draw; the product with inputs never needs it
    (:meth:`WHVIMatrix.matvec`).

    :returns: ``(..., *layout.shape)``.
    """
    batch_shape = g.shape[:-2]
    if layout.kind == "vector":
        block = stacked_whvi_weight(s1, g, s2, layout.block_size, layout.block_size)
        flat = block.reshape(*batch_shape, -1)[..., : layout.out_features]
        return flat.reshape(*batch_shape, *layout.shape)
    matrix = stacked_whvi_weight(s1, g, s2, layout.out_features, layout.in_features)
    return matrix.reshape(*batch_shape, *layout.shape)


def base_distribution(fn: Distribution) -> Distribution:
    """``fn`` without the ``Independent`` / ``expand`` / ``mask`` wrappers Pyro puts around a distribution."""
    while isinstance(fn, Independent) or type(fn).__name__ in ("ExpandedDistribution", "MaskedDistribution"):
        fn = fn.base_dist  # type: ignore[attr-defined]
    return fn


def has_real_support(fn: Distribution) -> bool:
    """Whether every entry of ``fn``'s support is the whole real line."""
    support = fn.support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


def gaussian_blocks(g_dist: Distribution) -> tuple[Tensor, Tensor]:
    """Mean ``(K, D)`` and per-block covariance ``(K, D, D)`` of a Gaussian ``q(g)``.

    Accepts ``Normal`` (diagonal), ``MultivariateNormal`` and ``LowRankMultivariateNormal`` (one per
    block), wrapped in ``Independent``/``expand`` as Pyro builds them.

    :raises TypeError: for any other distribution.
    """
    base = base_distribution(g_dist)
    if isinstance(base, Normal):
        return base.mean.expand(g_dist.event_shape), torch.diag_embed(base.variance.expand(g_dist.event_shape))
    if isinstance(base, (MultivariateNormal, LowRankMultivariateNormal)):
        return base.mean, base.covariance_matrix
    raise TypeError(
        "expected a Gaussian q(g) (Normal, MultivariateNormal or LowRankMultivariateNormal), "
        f"got {type(base).__name__}."
    )


class WHVIMatrix(TorchDistribution):
    r"""Distribution of :math:`W = S_1 H \operatorname{diag}(g) H S_2` for any ``q(g)`` (flows included).

    :param s1: left diagonals, ``(K, D)``.
    :param s2: right diagonals, ``(K, D)``.
    :param g_dist: ``q(g)``, event shape ``(K, D)``, batch shape ``()``.
    :param shape: the weight's shape; ``(K, D)`` must be :meth:`WHVILayout.for_shape` of it.

    ``log_prob`` raises: ``q(W)`` lives on a ``K D``-dimensional subspace of the weight space and
    has no density there; the density that enters the ELBO is that of ``g``.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2 (eq. 2–4), §2.3 (eq. 6), §2.5.
    """

    arg_constraints: ClassVar[dict] = {}
    has_rsample = True

    def __init__(self, s1: Tensor, s2: Tensor, g_dist: Distribution, shape, validate_args=None):
        self.layout = WHVILayout.for_shape(shape)
        block_shape = self.layout.block_shape
        if tuple(s1.shape) != tuple(block_shape) or tuple(s2.shape) != tuple(block_shape):
            raise ValueError(
                f"{type(self).__name__}: a weight of shape {tuple(self.layout.shape)} needs s1 and s2 of shape "
                f"{tuple(block_shape)}, got {tuple(s1.shape)} and {tuple(s2.shape)}."
            )
        if tuple(g_dist.event_shape) != tuple(block_shape) or g_dist.batch_shape != torch.Size():
            raise ValueError(
                f"{type(self).__name__}: q(g) must have batch shape () and event shape {tuple(block_shape)}, got "
                f"batch {tuple(g_dist.batch_shape)}, event {tuple(g_dist.event_shape)}."
            )
        self.s1, self.s2, self.g_dist = s1, s2, g_dist
        super().__init__(torch.Size(), self.layout.shape, validate_args=validate_args)

    @constraints.dependent_property
    def support(self):
        return constraints.independent(constraints.real, len(self.layout.shape))

    def weight(self, g: Tensor) -> Tensor:
        """The weight for given draws ``g`` of shape ``(..., K, D)``."""
        return whvi_weight(self.s1, g, self.s2, self.layout)

    def rsample(self, sample_shape: Sequence[int] = ()) -> Tensor:
        return self.weight(self.g_dist.rsample(torch.Size(sample_shape)))

    @property
    def mean(self) -> Tensor:
        """:math:`S_1 H \\operatorname{diag}(E[g]) H S_2`, exact by linearity (needs ``q(g).mean``)."""
        return self.weight(self.g_dist.mean)

    def matvec(self, x: Tensor, g: Tensor | None = None) -> Tensor:
        r"""``W x`` row by row in :math:`O(K D \log D)`, without forming ``W``.

        :param x: ``(..., D_in)`` for a matrix weight.
        :param g: draws ``(K, D)`` shared by every row or ``(..., K, D)`` one per row; by default an
            independent draw from ``q(g)`` for every row (local reparameterization, eq. 6).
        :returns: ``(..., D_out)``.
        """
        if self.layout.kind != "matrix":
            raise ValueError("WHVIMatrix.matvec: only matrix-shaped weights have a fast product; use rsample().")
        if x.shape[-1] != self.layout.in_features:
            raise ValueError(
                f"WHVIMatrix.matvec: x has {x.shape[-1]} features, the weight takes {self.layout.in_features}."
            )
        if g is None:
            g = self.g_dist.rsample(x.shape[:-1])
        return stacked_whvi_matvec(x, self.s1, g, self.s2, self.layout.out_features)

    def log_prob(self, value):
        raise ValueError(
            f"{type(self).__name__}.log_prob: q(W) is degenerate: W = S1 H diag(g) H S2 spans a "
            f"{self.layout.num_latent}-dimensional subspace of the {self.layout.shape.numel()} entries of W, "
            "so it has no density over W. Evaluate the density of g instead (the '<site>_whvi_g' sample site, "
            "or g_dist.log_prob)."
        )


class WHVINormal(WHVIMatrix):
    r"""The Gaussian matrix-variate ``q(W)`` of WHVI with a Gaussian ``q(g) = N(mu, Sigma)``.

    Block ``k`` of the weight has entries :math:`W_{ij} = s_{1i} s_{2j} \sum_a H_{ia} H_{aj} g_a`, so
    with the Walsh identity :math:`H_{ia} H_{ib} = H_{i, a \oplus b} / \sqrt{D}`

    .. math:: \operatorname{Var}(W_{ij}) = \frac{s_{1i}^2 s_{2j}^2}{D} (H \operatorname{diag}(r) H)_{ij},
       \qquad r_c = \sum_a \Sigma_{a, a \oplus c},

    computed in :math:`O(D^2 \log D)` per block. The matrix-normal factors of App. A are the row and
    column second moments :math:`U = E[(W - M)(W - M)^\top]`,
    :math:`V = E[(W - M)^\top (W - M)] / \operatorname{Tr} U`.

    :param g_dist: a Gaussian ``q(g)`` (see :func:`gaussian_blocks`).

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2 (eq. 3–5), App. A (eq. 8–11).
    """

    def __init__(self, s1: Tensor, s2: Tensor, g_dist: Distribution, shape, validate_args=None):
        self.g_mean, self.g_covariance = gaussian_blocks(g_dist)
        super().__init__(s1, s2, g_dist, shape, validate_args=validate_args)

    @property
    def mean(self) -> Tensor:
        return self.weight(self.g_mean)

    @property
    def variance(self) -> Tensor:
        """Elementwise variance of ``W``, the diagonal of :math:`A \\Sigma A^\\top`."""
        block_size = self.layout.block_size
        index = torch.arange(block_size, device=self.s1.device)
        xor = index.unsqueeze(-1) ^ index  # (a, c) -> a xor c
        r = self.g_covariance.gather(-1, xor.expand_as(self.g_covariance)).sum(-2)  # (K, D)
        ones = torch.ones_like(r)
        h_r_h = stacked_whvi_weight(ones, r, ones, r.numel(), block_size).reshape(*r.shape, block_size)  # H diag(r) H
        block_variance = (self.s1**2).unsqueeze(-1) * (self.s2**2).unsqueeze(-2) * h_r_h / block_size
        return self._cut(block_variance.reshape(self.layout.num_latent, block_size))

    @property
    def stddev(self) -> Tensor:
        return self.variance.sqrt()

    def _cut(self, matrix: Tensor) -> Tensor:
        layout = self.layout
        if layout.kind == "vector":
            return matrix.reshape(-1)[: layout.out_features].reshape(layout.shape)
        return matrix[: layout.out_features, : layout.in_features].reshape(layout.shape)

    def vec_covariance(self) -> Tensor:
        """``Cov(W.reshape(-1))`` = :math:`A \\Sigma A^\\top` (eq. 4), row-major. Dense: small weights only."""
        num_latent = self.layout.num_latent
        basis = torch.eye(num_latent, dtype=self.s1.dtype, device=self.s1.device).reshape(
            num_latent, *self.layout.block_shape
        )
        a_matrix = self.weight(basis).reshape(num_latent, -1).mT  # column a is vec W(e_a)
        blocks = torch.block_diag(*self.g_covariance.unbind(0))
        return a_matrix @ blocks @ a_matrix.mT

    def matrix_normal_factors(self) -> tuple[Tensor, Tensor, Tensor]:
        r"""``(M, U, V)`` of App. A for the matrix view of the weight, with :math:`\operatorname{Tr} V = 1`.

        ``U`` (``D_out x D_out``) and ``V`` (``D_in x D_in``) are the row and column covariances that
        a matrix-normal :math:`\mathcal{MN}(M, U, V)` with the same second moments would have.
        """
        layout = self.layout
        if layout.kind != "matrix":
            raise ValueError("matrix_normal_factors: defined for matrix-shaped weights, not reshaped vectors.")
        num_blocks, block_size = layout.block_shape
        s1, s2, sigma = self.s1, self.s2, self.g_covariance
        column_mask = (torch.arange(block_size, device=s1.device) < layout.in_features).to(s1.dtype)
        row_mask = (torch.arange(layout.num_latent, device=s1.device) < layout.out_features).to(s1.dtype)
        row_mask = row_mask.reshape(num_blocks, block_size)

        # The first transform of each runs in place on the product just made (the second reads a transposed view).
        def sandwich(diagonal: Tensor) -> Tensor:  # H diag(d) H for each block, (K, D, D)
            return fwht(fwht_(torch.diag_embed(diagonal)).mT)

        def hadamard_conj(x: Tensor) -> Tensor:  # H X H, x a fresh product
            return fwht(fwht_(x).mT).mT

        rows = s1.unsqueeze(-1) * hadamard_conj(sandwich(s2**2 * column_mask) * sigma) * s1.unsqueeze(-2)
        row_cov = torch.block_diag(*rows.unbind(0))[: layout.out_features, : layout.out_features]
        cols = s2.unsqueeze(-1) * hadamard_conj(sandwich(s1**2 * row_mask) * sigma) * s2.unsqueeze(-2)
        col_cov = cols.sum(0)[: layout.in_features, : layout.in_features]
        mean = self.mean.reshape(layout.out_features, layout.in_features)
        return mean, row_cov, col_cov / row_cov.diagonal().sum()

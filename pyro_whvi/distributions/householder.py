r"""VSD's structured multiplicative noise :math:`\xi \sim \mathcal{N}(1, U \operatorname{diag}(\alpha) U^\top)`.

:math:`U = H_T \cdots H_1` is a product of Householder reflections
:math:`H_t = I - 2 v_t v_t^\top / \lVert v_t \rVert^2`, so the covariance has the free eigenvalues
:math:`\alpha` and eigenvectors the columns of :math:`U` (VSD paper §3.1). Sampling pushes
:math:`\eta \sim \mathcal{N}(0, \operatorname{diag}(\alpha))` through Pyro's own
:class:`~pyro.distributions.transforms.ConditionedHouseholder` (``O(T K)`` per draw) and adds one;
reflections preserve volume, so ``log_prob`` is exact. ``T = 0`` gives ``U = I``: Gaussian dropout.

Shape letters: ``K`` noise entries (rows of the paper's ``W``), ``T`` reflections.

References:
    S. Nguyen, D. Nguyen, K. Nguyen, K. Than, H. Bui, N. Ho. *Structured Dropout Variational
    Inference for Bayesian Neural Networks*. NeurIPS 2021: §3.1 and App. D.
"""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions.transforms import AffineTransform
from pyro.distributions.transforms.householder import ConditionedHouseholder
from torch import Tensor
from torch.distributions import constraints

__all__ = ["StructuredDropoutNoise", "fit_vsd_alpha", "householder_product", "householder_variance"]


def householder_product(vectors: Tensor) -> Tensor:
    r""":math:`U = H_T \cdots H_1` as a dense ``(K, K)`` matrix, from ``vectors`` ``(T, K)`` (row ``t-1``: :math:`v_t`).

    ``T = 0`` gives the identity. ``O(T K^2)``: for tests and inspection; sampling and the KL term
    (:func:`householder_variance`) never form it.
    """
    if vectors.dim() != 2:
        raise ValueError(f"householder_product: vectors must have shape (T, K), got {tuple(vectors.shape)}.")
    size = vectors.shape[-1]
    identity = torch.eye(size, dtype=vectors.dtype, device=vectors.device)
    # Transforming the rows of I gives I U^T (the transform acts on row vectors), hence the .mT.
    return ConditionedHouseholder(vectors)(identity).mT


def householder_variance(alpha: Tensor, vectors: Tensor) -> Tensor:
    r""":math:`s = \operatorname{diag}(U \operatorname{diag}(\alpha) U^\top)` in :math:`O(K T^2)`, never forming ``U``.

    The compact WY form (Schreiber & Van Loan, 1989) writes :math:`U = I - Y M Y^\top` with ``Y``
    the unit vectors :math:`n_t = v_t / \lVert v_t \rVert` as columns and ``M`` lower triangular,
    :math:`M_t = \begin{pmatrix} M_{t-1} & 0 \\ -2 n_t^\top Y_{t-1} M_{t-1} & 2 \end{pmatrix}`. With
    :math:`A = Y M` and :math:`G = Y^\top \operatorname{diag}(\alpha) Y`,
    :math:`s_i = \alpha_i - 2 \alpha_i (A Y^\top)_{ii} + (A G A^\top)_{ii}`. This is the quantity
    in VSD's KL (eq. 6), needed every step; forming ``U`` costs :math:`O(T K^2)`.
    """
    if vectors.shape[0] == 0:
        return alpha
    units = vectors / torch.linalg.vector_norm(vectors, dim=-1, keepdim=True)  # (T, K)
    basis = units.mT  # Y: (K, T)
    factor = units.new_full((1, 1), 2.0)
    for t in range(1, units.shape[0]):
        row = -2.0 * (units[t] @ basis[:, :t]) @ factor  # (t,)
        factor = torch.cat(
            [torch.cat([factor, factor.new_zeros(t, 1)], dim=1), torch.cat([row, row.new_full((1,), 2.0)])[None]]
        )
    product = basis @ factor  # A = Y M: (K, T)
    gram = (basis * alpha[:, None]).mT @ basis  # G = Y^T diag(alpha) Y: (T, T)
    return alpha - 2 * alpha * (product * basis).sum(-1) + ((product @ gram) * product).sum(-1)


class StructuredDropoutNoise(dist.TransformedDistribution):
    r"""The noise :math:`\xi = 1 + U \eta`, :math:`\eta \sim \mathcal{N}(0, \operatorname{diag}(\alpha))`.

    :param alpha: the eigenvalues :math:`\alpha > 0` of the noise covariance (dropout rates), ``(K,)``.
    :param vectors: Householder vectors ``(T, K)``, row ``t-1`` is :math:`v_t`; ``T = 0`` means ``U = I``.

    Event shape ``(K,)``. ``mean`` is one, ``covariance_matrix`` is :math:`U \operatorname{diag}(\alpha) U^\top`
    and ``variance`` its diagonal :math:`s_i = \sum_j \alpha_j U_{ij}^2`, the quantity in VSD's KL (eq. 6).

    References:
        VSD paper (Nguyen et al., NeurIPS 2021), §3.1.
    """

    arg_constraints = {"alpha": constraints.positive}  # noqa: RUF012
    support = constraints.real_vector

    def __init__(self, alpha: Tensor, vectors: Tensor, validate_args: bool | None = None):
        if alpha.dim() != 1:
            raise ValueError(f"StructuredDropoutNoise: alpha must have shape (K,), got {tuple(alpha.shape)}.")
        if vectors.dim() != 2 or vectors.shape[-1] != alpha.shape[-1]:
            raise ValueError(
                f"StructuredDropoutNoise: vectors must have shape (T, {alpha.shape[-1]}), got {tuple(vectors.shape)}."
            )
        self.alpha, self.vectors = alpha, vectors
        base = dist.Normal(torch.zeros_like(alpha), alpha.sqrt(), validate_args=validate_args).to_event(1)
        transforms = [ConditionedHouseholder(vectors), AffineTransform(torch.ones_like(alpha), 1.0, event_dim=1)]
        super().__init__(base, transforms, validate_args=validate_args)

    @property
    def householder_matrix(self) -> Tensor:
        r""":math:`U`, ``(K, K)``."""
        return householder_product(self.vectors)

    @property
    def mean(self) -> Tensor:
        return torch.ones_like(self.alpha)

    @property
    def covariance_matrix(self) -> Tensor:
        orthogonal = self.householder_matrix
        return (orthogonal * self.alpha) @ orthogonal.mT

    @property
    def variance(self) -> Tensor:
        return householder_variance(self.alpha, self.vectors)

    def expand(self, batch_shape, _instance=None):
        raise NotImplementedError(
            "StructuredDropoutNoise has no batch dimensions; draw several with sample((N,)) instead."
        )


def _nonnegative_solve(matrix: Tensor, target: Tensor, iterations: int = 500) -> Tensor:
    """``x >= 0`` minimizing ``|matrix x - target|`` for a non-negative ``matrix`` (multiplicative updates)."""
    x = target.clone()
    gram, rhs = matrix.T @ matrix, matrix.T @ target
    for _ in range(iterations):
        x = x * rhs / (gram @ x).clamp_min(1e-30)
    return x.clamp_min(1e-12 * target.max())


def fit_vsd_alpha(site, mean: Tensor, precision: Tensor, householder_matrix: Tensor) -> Tensor:
    r""":math:`\alpha` of a VSD site (a :class:`~pyro_whvi.infer.vsd_reparam.VSDSite`) whose :math:`\Theta` is ``mean``,
    for a Gaussian with the diagonal precision ``precision``; ``householder_matrix`` is the site's ``U``. See the module
    docstring."""
    grouped = (precision * mean.pow(2)).movedim(site.noise_dim, 0).reshape(site.num_noise, -1)
    target = site.num_columns / grouped.sum(-1).clamp_min(1e-30)
    target = target.clamp(1e-6, 1e2)
    return _nonnegative_solve(householder_matrix.detach().pow(2), target)

r"""Setting a guide's ``q`` for one layer from a Gaussian over the layer's weights (I-BLM §4.2).

The layer's Gaussian has independent output rows (the BLM posterior of each output unit), given as
means, the diagonal of each row's posterior precision (entries of the weight and of the bias), and
the likelihood part :math:`X^\top \operatorname{diag}(\sigma^{-2}) X` of each row's precision (the prior
part is the model's). :func:`assign_layer` hands each site's part to the guide's ``set_site_gaussian_``
(:mod:`~pyro_whvi.init.guide_protocol`), and each guide takes its best approximation; the structured
guides' fits are here (:func:`fit_whvi_site`, :func:`fit_vsd_alpha`):

* **mean-field** (``AutoNormal``, and the other sites of our guides): mean = posterior mean, variance
  :math:`1 / P_{ii}`, the minimizer of ``KL(q || p)`` (I-BLM App. D);
* **WHVI** (:class:`~pyro_whvi.AutoWHVIGuide`): ``s1`` and ``s2`` from the Frobenius projection of
  the mean onto the WHVI form (WHVI App. B, eq. 14). Given them, ``W = A g`` is linear in ``g``, so the
  layer's regression *in the WHVI model* (its likelihood seen through ``vect(W) = A g``, the prior
  :math:`\mathcal{N}(0, \lambda I)` on ``g``) has an exact Gaussian posterior, with precision
  :math:`A^\top X^\top L^{-1} X A + \lambda^{-1} I`; ``q(g)`` is that posterior: its mean (not eq. 14's
  ``g``, which weighs every weight entry alike where the data do not), and its inverse diagonal for a
  diagonal ``q(g)`` (also the base of planar flows, which keep their initialization), the whole
  covariance for ``"full"``, or its leading eigen-directions (a probabilistic-PCA split) plus the rest
  on the diagonal for ``"lowrank"``;
* **VSD** (:class:`~pyro_whvi.AutoVSDGuide`): :math:`\Theta` = the mean; the noise variances
  :math:`s = \operatorname{diag}(U \operatorname{diag}(\alpha) U^\top)` minimize
  ``KL(q || p_mean-field)`` given :math:`\Theta`, where :math:`W_e \sim \mathcal{N}(\Theta_e, \Theta_e^2 s_{k(e)})`:
  :math:`s_k = Q / \sum_{e \in k} P_{ee} \Theta_e^2` (the "relative variances" of the BLM); then
  :math:`\alpha \ge 0` solves :math:`(U \odot U)\alpha = s` (non-negative least squares; exact when
  ``U = I``). Householder vectors are kept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..distributions.qg_family import GaussianQG
from .blm import cholesky_with_jitter
from .guide_protocol import SiteInitializer
from .whvi_projection import fit_whvi_mean, whvi_precision, whvi_rhs

__all__ = ["LayerGaussian", "assign_layer", "fit_vsd_alpha", "fit_whvi_site", "project_onto_whvi"]

#: Above this block size the WHVI precision uses the diagonal of each row's BLM precision (memory K D^3).
FULL_ROW_PRECISION_MAX_BLOCK = 256


@dataclass
class LayerGaussian:
    """A Gaussian over one layer's weight (rows independent) and bias; ``R`` output rows, ``F`` fan-in."""

    weight_mean: Tensor  #: the weight's shape, ``(R, ...)``
    weight_precision: Tensor  #: the weight's shape: diagonal of the posterior precision
    row_data_precision: Tensor  #: ``(R, F, F)``: the likelihood part of each row's precision over its weights
    row_data_rhs: Tensor  #: ``(R, F)``: the likelihood's linear term for each row's weights, bias at its mean
    bias_mean: Tensor | None = None  #: ``(R,)``
    bias_precision: Tensor | None = None  #: ``(R,)``
    bias_data_precision: Tensor | None = None  #: ``(R,)``: the likelihood part of ``bias_precision``


def assign_layer(guide: SiteInitializer, weight_site: str, bias_site: str | None, layer: LayerGaussian) -> None:
    """Set ``guide``'s ``q`` for a layer's weight (and bias) from ``layer``; see the module docstring.

    :param guide: a guide with ``set_site_gaussian_`` (:func:`~pyro_whvi.init.guide_protocol.site_initializer`).
    """
    guide.set_site_gaussian_(
        weight_site,
        layer.weight_mean,
        layer.weight_precision,
        data_precision=layer.row_data_precision,
        data_rhs=layer.row_data_rhs,
    )
    if bias_site is None or layer.bias_mean is None or layer.bias_precision is None:
        return
    data_precision = layer.bias_data_precision
    data_rhs = None if data_precision is None else data_precision * layer.bias_mean
    guide.set_site_gaussian_(
        bias_site, layer.bias_mean, layer.bias_precision, data_precision=data_precision, data_rhs=data_rhs
    )


def _padded_rows(values: Tensor, rows: int, cols: int) -> Tensor:
    """Zero-pad a ``(r, c, ...)`` tensor to ``(rows, cols, ...)``."""
    out = values.new_zeros((rows, cols, *values.shape[2:]))
    out[: values.shape[0], : values.shape[1]] = values
    return out


def _block_view(values: Tensor, layout, rows: int, cols: int) -> Tensor:
    """A site's values (its shape, or ``(R, F, ...)`` per row) placed on the ``(K D, D, ...)`` block grid."""
    if layout.kind == "vector":
        return _padded_rows(values.reshape(1, -1), 1, rows * cols).reshape(rows, cols)
    per_entry = values.numel() == layout.out_features * layout.in_features
    trailing = () if per_entry else (layout.in_features,)  # (R, F, F) row precisions keep their last dim
    return _padded_rows(values.reshape(layout.out_features, layout.in_features, *trailing), rows, cols)


def project_onto_whvi(
    weight: Tensor, layout, s1: Tensor, s2: Tensor, prior_variance: float
) -> tuple[Tensor, Tensor | None, Tensor]:
    """``(s1, g, s2)`` whose WHVI weight is closest to ``weight`` (:func:`fit_whvi_mean` on the block grid).

    ``s1``, ``s2`` are the starting point; an all-zero ``weight`` returns them unchanged and ``g = None``.
    """
    num_blocks, block_size = layout.block_shape
    rows, cols, blocks = num_blocks * block_size, block_size, (num_blocks, block_size, block_size)
    target = _block_view(weight, layout, rows, cols).view(blocks)
    if not target.abs().max() > 0:
        return s1, None, s2
    mask = _block_view(torch.ones_like(weight), layout, rows, cols).view(blocks)
    return fit_whvi_mean(target, mask, s1, s2, prior_variance)


def fit_whvi_site(
    layout,
    s1: Tensor,
    s2: Tensor,
    prior_variance: float,
    current: GaussianQG,
    mean: Tensor,
    data_precision: Tensor | None,
    data_rhs: Tensor | None,
    what: str,
) -> tuple[Tensor, Tensor, GaussianQG]:
    """``(s1, s2, q(g))`` of a WHVI site (``layout``) from a Gaussian over its weight; see the module docstring.

    :param s1: the site's current ``s1`` (the projection's starting point), ``(K, D)``; ``s2`` likewise.
    :param current: the site's current ``q(g)``: the result is of its kind and rank.
    :param data_precision: the likelihood part of each row's precision, ``(R, F, F)``, or its diagonal in the
        site's shape; ``data_rhs`` the likelihood's linear term, in the site's shape. Errors start with ``what``.
    """
    if data_precision is None or data_rhs is None:
        raise ValueError(f"{what}: a WHVI site takes q(g) from the likelihood part; pass data_precision and data_rhs.")
    num_blocks, block_size = layout.block_shape
    rows, cols = num_blocks * block_size, block_size
    # The projection and q(g) are solved in float64 whatever the guide's dtype: the normal equations
    # of the fit are ill-conditioned in float32 (the guide casts the results back).
    mean, precision, rhs = mean.double(), data_precision.double(), data_rhs.double()
    row_precisions = precision.dim() == 3 and precision.shape[-1] == precision.shape[-2]
    full_rows = row_precisions and layout.kind == "matrix" and block_size <= FULL_ROW_PRECISION_MAX_BLOCK
    # A one-row weight laid out as a vector (expose="all") spreads its row over several grid rows, whose
    # couplings q(g)'s precision cannot hold: its covariance takes the precision's diagonal and its mean the
    # projection of the layer's mean (a mean solved with the diagonal alone ignores correlated inputs).
    vector_rows = row_precisions and layout.kind == "vector"
    if row_precisions and not full_rows:
        precision = precision.diagonal(dim1=-2, dim2=-1)
    if full_rows:
        grid_precision = _padded_rows(precision, rows, cols)
        grid_precision = _padded_rows(grid_precision.transpose(0, 2), cols, cols).transpose(0, 2)
        grid_precision = grid_precision.reshape(num_blocks, block_size, block_size, block_size)
    else:
        grid_precision = _block_view(precision, layout, rows, cols).reshape(num_blocks, block_size, block_size)
    blocks = (num_blocks, block_size, block_size)
    s1, projected_g, s2 = project_onto_whvi(mean, layout, s1.double(), s2.double(), prior_variance)
    eye = torch.eye(block_size, dtype=s1.dtype, device=s1.device)
    g_precision = whvi_precision(s1, s2, grid_precision, diagonal=False) + eye / prior_variance
    g_rhs = whvi_rhs(s1, s2, _block_view(rhs, layout, rows, cols).view(blocks))
    chol = cholesky_with_jitter(g_precision, f"{what}: q(g)")
    qg = GaussianQG.from_precision(current.kind, g_precision, g_rhs, cholesky=chol, rank=current.rank)
    if vector_rows and projected_g is not None:
        qg = dataclasses.replace(qg, loc=projected_g)
    return s1, s2, qg


def _nonnegative_solve(matrix: Tensor, target: Tensor, iterations: int = 500) -> Tensor:
    """``x >= 0`` minimizing ``|matrix x - target|`` for a non-negative ``matrix`` (multiplicative updates)."""
    x = target.clone()
    gram, rhs = matrix.T @ matrix, matrix.T @ target
    for _ in range(iterations):
        x = x * rhs / (gram @ x).clamp_min(1e-30)
    return x.clamp_min(1e-12 * target.max())


def fit_vsd_alpha(site, mean: Tensor, precision: Tensor, householder_matrix: Tensor) -> Tensor:
    r""":math:`\alpha` of a VSD site (a :class:`~pyro_whvi.infer.vsd.VSDSite`) whose :math:`\Theta` is ``mean``,
    for a Gaussian with the diagonal precision ``precision``; ``householder_matrix`` is the site's ``U``. See the module
    docstring."""
    grouped = (precision * mean.pow(2)).movedim(site.noise_dim, 0).reshape(site.num_noise, -1)
    target = site.num_columns / grouped.sum(-1).clamp_min(1e-30)
    target = target.clamp(1e-6, 1e2)
    return _nonnegative_solve(householder_matrix.detach().pow(2), target)

r"""Setting a guide's ``q`` for one layer from a Gaussian over the layer's weights (I-BLM §4.2).

The layer's Gaussian has independent output rows (the BLM posterior of each output unit), given as
means, the diagonal of each row's posterior precision (entries of the weight and of the bias), and
the likelihood part :math:`X^\top \operatorname{diag}(\sigma^{-2}) X` of each row's precision (the prior
part is the model's). Each guide takes its best approximation:

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
from pyro.infer.autoguide import AutoNormal
from torch import Tensor

from ..distributions.qg_family import GaussianQG
from ..infer import AutoVSDGuide, AutoWHVIGuide
from ..infer._base import StructuredAutoGuide
from ..infer._guide_utils import assign_param_, deep_getattr, has_deep_attr
from .blm import cholesky_with_jitter
from .whvi_projection import fit_whvi_mean, whvi_precision, whvi_rhs

__all__ = ["LayerGaussian", "assign_layer", "check_guide", "project_onto_whvi", "set_param", "set_whvi_isotropic"]

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


def check_guide(guide) -> None:
    if not isinstance(guide, (AutoNormal, StructuredAutoGuide)):
        raise TypeError(
            f"iblm_: {type(guide).__name__} is not supported; pass an AutoNormal, AutoWHVIGuide or AutoVSDGuide."
        )


def set_param(container, name: str, value: Tensor) -> None:
    """Overwrite the constrained value of the ``PyroParam`` ``container.<name>`` in place.

    In place, so that an optimizer already holding the parameter keeps working.
    """
    assign_param_(container, name, value, "iblm_")


def _set_mean_field(guide, site: str, mean: Tensor, precision: Tensor) -> None:
    if not has_deep_attr(guide.locs, site):
        raise KeyError(f"iblm_: {type(guide).__name__} has no mean-field parameters for site {site!r}.")
    set_param(guide.locs, site, mean)
    set_param(guide.scales, site, precision.rsqrt())


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


def _assign_whvi(guide: AutoWHVIGuide, site: str, mean: Tensor, precision: Tensor, rhs: Tensor) -> None:
    """Set ``s1``, ``s2`` and ``q(g)`` of a WHVI site from a Gaussian over its weight.

    ``precision`` is the likelihood part of each row's precision, ``(R, F, F)``, or its diagonal in the
    site's shape; ``rhs`` the likelihood's linear term, in the site's shape.
    """
    layout = guide.structured_sites[site]  # type: ignore[index]
    num_blocks, block_size = layout.block_shape
    rows, cols = num_blocks * block_size, block_size
    # The projection and q(g) are solved in float64 whatever the guide's dtype: the normal equations
    # of the fit are ill-conditioned in float32 (set_param casts the results back).
    mean, precision, rhs = mean.double(), precision.double(), rhs.double()
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
    s1 = deep_getattr(guide.whvi_s1, site).detach().double()
    s2 = deep_getattr(guide.whvi_s2, site).detach().double()
    lam = guide.prior_variance
    s1, projected_g, s2 = project_onto_whvi(mean, layout, s1, s2, lam)
    eye = torch.eye(block_size, dtype=s1.dtype, device=s1.device)
    g_precision = whvi_precision(s1, s2, grid_precision, diagonal=False) + eye / lam
    g_rhs = whvi_rhs(s1, s2, _block_view(rhs, layout, rows, cols).view(blocks))
    chol = cholesky_with_jitter(g_precision, f"iblm_: q(g) of {site!r}")
    qg = GaussianQG.from_precision(guide.covariance, g_precision, g_rhs, cholesky=chol, rank=guide.qg(site).rank)
    if vector_rows and projected_g is not None:
        qg = dataclasses.replace(qg, loc=projected_g)
    set_param(guide.whvi_s1, site, s1)
    set_param(guide.whvi_s2, site, s2)
    guide.set_qg_(site, qg, "iblm_")


def set_whvi_isotropic(guide: AutoWHVIGuide, site: str, weight_variance: float) -> None:
    r"""``q(g) = N(0, sigma^2 I)`` with ``sigma`` giving the weight entries variance ``weight_variance``.

    With :math:`g_k` independent of variance :math:`\sigma^2`, :math:`\operatorname{Var} W_{ij} =
    s_{1,i}^2 s_{2,j}^2 \sigma^2 / D`; ``s1``, ``s2`` are kept and their mean squares used.
    """
    s1 = deep_getattr(guide.whvi_s1, site).detach()
    s2 = deep_getattr(guide.whvi_s2, site).detach()
    sigma = (weight_variance * s1.shape[-1] / (s1.pow(2).mean() * s2.pow(2).mean())).sqrt()
    qg = GaussianQG.isotropic(guide.covariance, torch.zeros_like(s1), sigma, rank=guide.qg(site).rank)
    guide.set_qg_(site, qg, "iblm_")


def _nonnegative_solve(matrix: Tensor, target: Tensor, iterations: int = 500) -> Tensor:
    """``x >= 0`` minimizing ``|matrix x - target|`` for a non-negative ``matrix`` (multiplicative updates)."""
    x = target.clone()
    gram, rhs = matrix.T @ matrix, matrix.T @ target
    for _ in range(iterations):
        x = x * rhs / (gram @ x).clamp_min(1e-30)
    return x.clamp_min(1e-12 * target.max())


def _assign_vsd(guide: AutoVSDGuide, site: str, mean: Tensor, precision: Tensor) -> None:
    vsd_site = guide.structured_sites[site]  # type: ignore[index]
    grouped = (precision * mean.pow(2)).movedim(vsd_site.noise_dim, 0).reshape(vsd_site.num_noise, -1)
    target = vsd_site.num_columns / grouped.sum(-1).clamp_min(1e-30)
    target = target.clamp(1e-6, 1e2)
    orthogonal = guide.noise_distribution(site).householder_matrix.detach()
    alpha = _nonnegative_solve(orthogonal.pow(2), target)
    set_param(guide.vsd_theta, site, mean)
    set_param(guide.vsd_alpha, site, alpha)


def assign_layer(guide, weight_site: str, bias_site: str | None, layer: LayerGaussian) -> None:
    """Set ``guide``'s ``q`` for a layer's weight (and bias) from ``layer``; see the module docstring."""
    structured = guide.structured_sites or {} if isinstance(guide, StructuredAutoGuide) else {}
    if isinstance(guide, AutoWHVIGuide) and weight_site in structured:
        _assign_whvi(guide, weight_site, layer.weight_mean, layer.row_data_precision, layer.row_data_rhs)
    elif isinstance(guide, AutoVSDGuide) and weight_site in structured:
        _assign_vsd(guide, weight_site, layer.weight_mean, layer.weight_precision)
    else:
        _set_mean_field(guide, weight_site, layer.weight_mean, layer.weight_precision)
    if bias_site is None or layer.bias_mean is None or layer.bias_precision is None:
        return
    if isinstance(guide, AutoWHVIGuide) and bias_site in structured:
        assert layer.bias_data_precision is not None
        rhs = layer.bias_data_precision * layer.bias_mean
        _assign_whvi(guide, bias_site, layer.bias_mean, layer.bias_data_precision, rhs)
    elif isinstance(guide, AutoVSDGuide) and bias_site in structured:
        _assign_vsd(guide, bias_site, layer.bias_mean, layer.bias_precision)
    else:
        _set_mean_field(guide, bias_site, layer.bias_mean, layer.bias_precision)

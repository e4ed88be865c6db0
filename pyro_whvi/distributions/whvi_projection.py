r"""The WHVI matrix closest to a given one, and the ``q(g)`` that a Gaussian over the weights induces.

**Mean.** WHVI paper App. B, eq. (14): for a target :math:`\Gamma` find :math:`s_1, s_2, g` minimizing
:math:`\| M \odot (\Gamma - S_1 H \operatorname{diag}(g) H S_2) \|_F`, ``M`` masking the entries the weight
really has (padded columns and dropped rows are free). Alternating least squares, each step exact:

* ``g`` given ``s1, s2``: ``vect(W) = A g`` is linear in ``g`` and the normal matrix is
  :math:`(A^\top M A)_{kl} = c_{k \oplus l}`, :math:`c = \operatorname{diag}(H R H) / D`,
  :math:`R = M \odot s_1^2 (s_2^2)^\top`, because :math:`H_{ik} H_{il} = H_{i, k \oplus l} / \sqrt D` for
  the Sylvester Hadamard matrix; the right-hand side is :math:`\operatorname{diag}(H S_1 (M \odot \Gamma) S_2 H)`;
* ``s1`` (``s2``) given the rest: one scalar least-squares fit per row (column), its magnitude kept
  within a factor ``spread`` of the median (see :func:`fit_whvi_mean`).

The fit is invariant to :math:`(s_1, g, s_2) \to (a s_1, g / (a b), b s_2)`; the scale of ``g`` is then
chosen to minimize the KL to the prior :math:`\mathcal{N}(0, \lambda I)` (the likelihood does not see it).

**Posterior over g.** A linear-Gaussian likelihood on the weight rows, with precisions :math:`P_i` and
linear terms :math:`b_i` (independent rows, as the BLM's :math:`X^\top L^{-1} X` and :math:`X^\top L^{-1} y`),
seen through ``vect(W) = A g`` has precision :math:`A^\top P A =
\sum_i s_{1,i}^2 \operatorname{diag}(h_i) H S_2 P_i S_2 H \operatorname{diag}(h_i)` (``h_i`` the ``i``-th
row of ``H``) and linear term :math:`A^\top b = \sum_i s_{1,i}\, h_i \odot H(s_2 \odot b_i)`.

Shape letters: ``K`` blocks, ``D`` block size, ``R`` rows of the weight.

References:
    WHVI paper (Rossi et al., NeurIPS 2020): §2.2 (eq. 4), App. B (eq. 12–14).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ..ops import fwht
from .qg_family import GaussianQG, cholesky_with_jitter

__all__ = [
    "FULL_ROW_PRECISION_MAX_BLOCK",
    "fit_whvi_mean",
    "fit_whvi_site",
    "project_onto_whvi",
    "whvi_precision",
    "whvi_rhs",
]


def _xor_matrix(block_size: int, device) -> Tensor:
    index = torch.arange(block_size, device=device)
    return index.unsqueeze(0) ^ index.unsqueeze(1)


def _two_sided_hadamard(matrix: Tensor) -> Tensor:
    """``H matrix H`` over the last two dims (``H`` symmetric)."""
    return fwht(fwht(matrix).transpose(-1, -2)).transpose(-1, -2)


def _block_matrix(s1: Tensor, g: Tensor, s2: Tensor) -> Tensor:
    """``(K, D, D)``: :math:`S_1 H \\operatorname{diag}(g) H S_2` per block."""
    inner = _two_sided_hadamard(torch.diag_embed(g))
    return s1.unsqueeze(-1) * inner * s2.unsqueeze(-2)


def _solve_g(target: Tensor, mask: Tensor, s1: Tensor, s2: Tensor, xor: Tensor) -> Tensor:
    block_size = target.shape[-1]
    weights = mask * (s1.pow(2).unsqueeze(-1) * s2.pow(2).unsqueeze(-2))
    c = _two_sided_hadamard(weights).diagonal(dim1=-2, dim2=-1) / block_size
    normal = c[..., xor]  # (K, D, D)
    rhs = _two_sided_hadamard(s1.unsqueeze(-1) * (mask * target) * s2.unsqueeze(-2)).diagonal(dim1=-2, dim2=-1)
    jitter = 1e-10 * normal.diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1e-30)
    eye = torch.eye(block_size, dtype=target.dtype, device=target.device)
    return torch.linalg.solve(normal + jitter[:, None, None] * eye, rhs.unsqueeze(-1)).squeeze(-1)


def _fit_scale(target: Tensor, mask: Tensor, basis: Tensor, dim: int, previous: Tensor, spread: float) -> Tensor:
    """Per row (``dim=-1``) or column (``dim=-2``) least-squares scale of ``basis`` onto ``target``,
    its magnitude kept within a factor ``spread`` of the block's median magnitude."""
    numerator = (mask * target * basis).sum(dim)
    denominator = (mask * basis * basis).sum(dim)
    ok = denominator > 1e-12 * denominator.amax(-1, keepdim=True).clamp_min(1e-30)
    scale = torch.where(ok, numerator / denominator.clamp_min(1e-30), previous)
    median = scale.abs().median(-1, keepdim=True).values.clamp_min(1e-30)
    sign = torch.where(scale < 0, -1.0, 1.0).to(scale)
    return sign * scale.abs().clamp(median / spread, median * spread)


@torch.no_grad()
def fit_whvi_mean(
    target: Tensor,
    mask: Tensor,
    s1: Tensor,
    s2: Tensor,
    prior_variance: float = 1.0,
    iterations: int = 50,
    spread: float = 4.0,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""``(s1, g, s2)``, each ``(K, D)``, with :math:`S_1 H \operatorname{diag}(g) H S_2` closest to ``target``.

    :param target: ``(K, D, D)``: the blocks' target matrices (any value where ``mask`` is 0).
    :param mask: ``(K, D, D)``: 1 for the entries the weight has, 0 for padding and dropped rows.
    :param s1: ``(K, D)`` starting point (e.g. the guide's current ``s1``); ``s2`` likewise.
    :param prior_variance: :math:`\lambda`; the returned ``g`` has mean square :math:`\lambda`.
    :param spread: the entries of ``s1`` (and of ``s2``) stay within this factor of their median
        magnitude. Unrestricted, the fit of a matrix far from the WHVI form can put a few entries
        hundreds of times larger than the rest, and a step of a fixed size on ``g`` (Adam's) then moves
        the weights in those rows and columns by as much; ``float("inf")`` lifts the restriction.
    """
    xor = _xor_matrix(target.shape[-1], target.device)
    g = _solve_g(target, mask, s1, s2, xor)
    for _ in range(iterations):
        inner = _two_sided_hadamard(torch.diag_embed(g))
        s1 = _fit_scale(target, mask, inner * s2.unsqueeze(-2), -1, s1, spread)
        s2 = _fit_scale(target, mask, s1.unsqueeze(-1) * inner, -2, s2, spread)
        g = _solve_g(target, mask, s1, s2, xor)
    if not all(torch.isfinite(t).all() for t in (s1, g, s2)):
        raise ValueError("fit_whvi_mean: the fit diverged (NaN or Inf); is the target finite and the dtype float64?")
    # Balance: g's mean square is lambda and |s1| and |s2| have the same mean, per block.
    g_scale = (g.pow(2).mean(-1, keepdim=True) / prior_variance).sqrt().clamp_min(1e-30)
    g = g / g_scale
    ratio = (s1.abs().mean(-1, keepdim=True) / s2.abs().mean(-1, keepdim=True).clamp_min(1e-30)).clamp_min(1e-30)
    s1 = s1 * (g_scale / ratio).sqrt()
    s2 = s2 * (g_scale * ratio).sqrt()
    return s1, g, s2


def whvi_precision(s1: Tensor, s2: Tensor, row_precisions: Tensor, diagonal: bool, chunk: int = 16) -> Tensor:
    r"""The precision :math:`A^\top P A` over each block's ``g`` for independent weight rows.

    :param s1: ``(K, D)``; :param s2: ``(K, D)``.
    :param row_precisions: the precision of each of the ``D`` rows of each block over its ``D`` (padded)
        inputs, zero for rows the weight does not have: ``(K, D, D, D)``, or ``(K, D, D)`` for diagonal
        row precisions (then :math:`H \operatorname{diag}(v) H` has entries :math:`(H v)_{k \oplus l} / \sqrt D`
        so the whole product costs :math:`O(K D^2 \log D)`).
    :param diagonal: return only the diagonal ``(K, D)`` (what a mean-field ``q(g)`` needs) instead of
        the full ``(K, D, D)``.
    """
    num_blocks, block_size = s1.shape
    hadamard = fwht(torch.eye(block_size, dtype=s1.dtype, device=s1.device))  # row i is h_i (symmetric)
    row_weight = s1.pow(2)  # (K, R)
    if row_precisions.dim() == 3:
        spectrum = fwht(s2.pow(2).unsqueeze(-2) * row_precisions)  # (K, R, D): H v_i
        profile = (row_weight.unsqueeze(-1) * hadamard * spectrum).sum(-2) / block_size  # (K, D)
        if diagonal:
            return profile[..., :1].expand(num_blocks, block_size)
        return profile[..., _xor_matrix(block_size, s1.device)]
    result = s1.new_zeros((num_blocks, block_size) if diagonal else (num_blocks, block_size, block_size))
    for start in range(0, block_size, chunk):
        rows = slice(start, start + chunk)
        precisions = row_precisions[:, rows]
        scaled = s2.unsqueeze(-1).unsqueeze(-3) * precisions * s2.unsqueeze(-2).unsqueeze(-3)  # S2 P_i S2
        rotated = _two_sided_hadamard(scaled)  # (K, r, D, D): H S2 P_i S2 H
        if diagonal:  # h_{ik}^2 = 1 / D for every entry of H
            result += (row_weight[:, rows].unsqueeze(-1) * rotated.diagonal(dim1=-2, dim2=-1)).sum(-2) / block_size
        else:
            outer = hadamard[rows].unsqueeze(-1) * hadamard[rows].unsqueeze(-2)  # (r, D, D): h_i h_i^T
            result += torch.einsum("kr,rab,krab->kab", row_weight[:, rows], outer, rotated)
    return result


def whvi_rhs(s1: Tensor, s2: Tensor, row_rhs: Tensor) -> Tensor:
    r"""``(K, D)``: :math:`A^\top b = \sum_i s_{1,i}\, h_i \odot H (s_2 \odot b_i)` for row vectors ``b_i``.

    :param row_rhs: ``(K, D, D)``: ``b_i`` for each of the ``D`` rows of each block (e.g. the BLM's
        :math:`X^\top L^{-1} y`), zero for rows the weight does not have.
    """
    block_size = s1.shape[-1]
    hadamard = fwht(torch.eye(block_size, dtype=s1.dtype, device=s1.device))
    return (s1.unsqueeze(-1) * hadamard * fwht(s2.unsqueeze(-2) * row_rhs)).sum(-2)


#: Above this block size the WHVI precision uses the diagonal of each row's BLM precision (memory K D^3).
FULL_ROW_PRECISION_MAX_BLOCK = 256


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
    precision = data_precision
    row_precisions = precision.dim() == 3 and precision.shape[-1] == precision.shape[-2]
    full_rows = row_precisions and layout.kind == "matrix" and block_size <= FULL_ROW_PRECISION_MAX_BLOCK
    # A one-row weight laid out as a vector (expose="all") spreads its row over several grid rows, whose
    # couplings q(g)'s precision cannot hold: its covariance takes the precision's diagonal and its mean the
    # projection of the layer's mean (a mean solved with the diagonal alone ignores correlated inputs).
    vector_rows = row_precisions and layout.kind == "vector"
    if row_precisions and not full_rows:
        precision = precision.diagonal(dim1=-2, dim2=-1)  # before the float64 copy: (R, F, F) may be GiBs
    mean, precision, rhs = mean.double(), precision.double(), data_rhs.double()
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

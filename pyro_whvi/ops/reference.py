"""Pure-PyTorch reference implementations of the Walsh–Hadamard ops.

Always available, on every device and floating dtype; differentiable through ordinary
autograd and traceable by ``torch.compile``. The compiled kernels are tested against these,
and these are tested against :func:`scipy.linalg.hadamard`.

Shape letters used in this package: ``D`` is the transform length (a power of two),
``...`` any leading batch shape, ``P`` the number of distinct rows of a diagonal argument.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian
    Deep Learning*. NeurIPS 2020, §2.1 (the FWHT) and §2.2 (the product ``W h``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "fastfood",
    "fastfood_transpose",
    "fwht",
    "fwht_",
    "sum_to_shape",
    "whvi_design",
    "whvi_design_backward",
    "whvi_fourier_design_backward",
    "whvi_matvec",
    "whvi_matvec_backward",
    "xor_table",
]


def fwht(x: Tensor, normalized: bool = True) -> Tensor:
    r"""Walsh–Hadamard transform of the last dimension, :math:`\log_2 D` butterfly stages.

    :param x: tensor of shape ``(..., D)``, ``D`` a power of two.
    :param normalized: apply the orthonormal :math:`D^{-1/2} H` (default) or the :math:`\pm 1` matrix.
    """
    size = x.shape[-1]
    batch_shape = x.shape[:-1]
    y = x.reshape(-1, size)
    half = 1
    while half < size:
        y = y.reshape(-1, size // (2 * half), 2, half)
        top, bottom = y[:, :, 0], y[:, :, 1]
        y = torch.stack((top + bottom, top - bottom), dim=2)
        half *= 2
    y = y.reshape(*batch_shape, size)
    if normalized:
        y = y * size**-0.5
    elif size == 1:
        y = y.clone()
    return y


def fwht_(x: Tensor, normalized: bool = True) -> Tensor:
    """:func:`fwht` written back into ``x`` (through a temporary: the reference keeps the plain form that
    ordinary autograd differentiates; the compiled and GPU kernels transform in place)."""
    return x.copy_(fwht(x, normalized))


def whvi_matvec(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor, transform=None) -> Tensor:
    r""":math:`s_1 \odot H(g \odot H(s_2 \odot x))` with the orthonormal :math:`H`.

    The diagonals broadcast against ``x`` by ordinary PyTorch rules. ``transform`` computes the
    orthonormal FWHT (default: this module's; the GPU kernels pass theirs).
    """
    transform = transform or fwht
    return s1 * transform(g * transform(s2 * x))


def sum_to_shape(t: Tensor, shape: torch.Size) -> Tensor:
    """``t`` summed over the dimensions that broadcasting added to a tensor of ``shape``."""
    lead = t.dim() - len(shape)
    if lead > 0:
        t = t.sum(dim=tuple(range(lead)))
    keep = tuple(i for i, size in enumerate(shape) if size == 1 and t.shape[i] != 1)
    if keep:
        t = t.sum(dim=keep, keepdim=True)
    return t


def whvi_matvec_backward(
    grad: Tensor, x: Tensor, s1: Tensor, g: Tensor, s2: Tensor, transform=None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Vector-Jacobian products of :func:`whvi_matvec` for all four inputs.

    With :math:`u = H(s_2 x)`, :math:`v = H(g u)`, :math:`w = H(s_1 \bar y)`,
    :math:`z = H(g w)`: :math:`\bar x = s_2 z`, :math:`\bar s_1 = \sum \bar y v`,
    :math:`\bar g = \sum w u`, :math:`\bar s_2 = \sum x z`, each sum over the rows that
    share the diagonal's row. ``transform`` as in :func:`whvi_matvec`.
    """
    transform = transform or fwht
    u = transform(s2 * x)
    v = transform(g * u)
    w = transform(s1 * grad)
    z = transform(g * w)
    return (
        sum_to_shape(s2 * z, x.shape),
        sum_to_shape(grad * v, s1.shape),
        sum_to_shape(w * u, g.shape),
        sum_to_shape(x * z, s2.shape),
    )


def xor_table(size: int, device: torch.device | None = None) -> Tensor:
    """``(D, D)`` int64 table of ``i ^ j``: with the Sylvester matrix, ``H_ki H_kj = H_k,(i ^ j)``."""
    index = torch.arange(size, device=device)
    return index[:, None] ^ index


def whvi_design(x: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    r""":math:`\operatorname{diag}(H S_1 X S_2 H)` for ``(..., D, D)`` matrices ``X``, with the orthonormal ``H``.

    Since :math:`H_{ki} H_{kj} = H_{k, i \oplus j} / \sqrt D` (Sylvester order),
    :math:`y = D^{-1/2} H c` with :math:`c_l = \sum_i s_{1,i}\, s_{2, i \oplus l}\, X_{i, i \oplus l}`:
    one gather and one length-``D`` transform per matrix.
    """
    size = x.shape[-1]
    table = xor_table(size, x.device)  # table[l, i] = i ^ l, the column of row i that lands on l
    rows = torch.arange(size, device=x.device)
    weighted = x * torch.outer(s1, s2)
    return fwht(weighted[..., rows, table].sum(-1)) * size**-0.5


def whvi_design_backward(grad: Tensor, x: Tensor, s1: Tensor, s2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Vector-Jacobian products of :func:`whvi_design`.

    With :math:`z = D^{-1/2} H \bar y`: :math:`\bar X_{ij} = s_{1,i} s_{2,j} z_{i \oplus j}`, and with
    :math:`Q = \sum X_{ij} z_{i \oplus j}` over the matrices, :math:`\bar s_1 = Q s_2`,
    :math:`\bar s_2 = Q^\top s_1`.
    """
    size = x.shape[-1]
    shifted = (fwht(grad) * size**-0.5)[..., xor_table(size, x.device)]  # (..., D, D): z[i ^ j]
    q = (x * shifted).reshape(-1, size, size).sum(0)
    return shifted * torch.outer(s1, s2), q @ s2, s1 @ q


def whvi_fourier_design_backward(
    grad: Tensor, features: Tensor, s1: Tensor, s2: Tensor, design_backward=None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The backward of :func:`whvi_design` on random Fourier features, to their angles.

    ``features = [scale cos(A), scale sin(A)]`` (``F = 2m`` entries, zero-padded to ``D^2`` and read row
    by row): returns :math:`\bar A` ``(..., m)``, :math:`\bar s_1`, :math:`\bar s_2` and the per-row
    :math:`\sum_f \bar R_f R_f` (the caller divides by ``scale`` for its gradient).
    ``design_backward`` computes :func:`whvi_design_backward` (default: this module's; the GPU kernels pass theirs).
    """
    size, half = s1.shape[-1], features.shape[-1] // 2
    padded = torch.nn.functional.pad(features, (0, size * size - features.shape[-1])).unflatten(-1, (size, size))
    dpadded, ds1, ds2 = (design_backward or whvi_design_backward)(grad, padded, s1, s2)
    dfeatures = dpadded.flatten(-2)[..., : 2 * half]
    cos, sin = features[..., :half], features[..., half:]
    dcos, dsin = dfeatures[..., :half], dfeatures[..., half:]
    return cos * dsin - sin * dcos, ds1, ds2, (features * dfeatures).sum(-1)


def fastfood(x: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor, transform=None) -> Tensor:
    r"""Fastfood blocks :math:`\text{scale}_b \odot H(\text{gaussian}_b \odot \Pi_b H(\text{signs}_b \odot x))`.

    :param x: ``(..., P)``; the other arguments ``(B, P)``, ``(\Pi_b h)_i = h_{\text{permutation}_{bi}}``.
    :returns: ``(..., B, P)``.
    """
    transform = transform or fwht  # the GPU kernels pass their own transform
    h = transform(x.unsqueeze(-2) * signs)
    h = torch.take_along_dim(h, permutation.expand(h.shape), dim=-1)
    return transform(h * gaussian) * scale


def fastfood_transpose(
    grad: Tensor, signs: Tensor, permutation: Tensor, gaussian: Tensor, scale: Tensor, transform=None
) -> Tensor:
    """The adjoint of :func:`fastfood`: ``(..., B, P)`` to ``(..., P)`` (a scatter-add undoes the gather)."""
    transform = transform or fwht
    t = transform(grad * scale) * gaussian
    u = torch.zeros_like(t).scatter_add(-1, permutation.expand(t.shape), t)
    return (transform(u) * signs).sum(-2)

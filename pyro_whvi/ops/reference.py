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

__all__ = ["fwht", "whvi_matvec", "whvi_matvec_backward"]


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


def whvi_matvec(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor) -> Tensor:
    r""":math:`s_1 \odot H(g \odot H(s_2 \odot x))` with the orthonormal :math:`H`.

    The diagonals broadcast against ``x`` by ordinary PyTorch rules.
    """
    return s1 * fwht(g * fwht(s2 * x))


def _sum_to_shape(t: Tensor, shape: torch.Size) -> Tensor:
    lead = t.dim() - len(shape)
    if lead > 0:
        t = t.sum(dim=tuple(range(lead)))
    keep = tuple(i for i, size in enumerate(shape) if size == 1 and t.shape[i] != 1)
    if keep:
        t = t.sum(dim=keep, keepdim=True)
    return t


def whvi_matvec_backward(
    grad: Tensor, x: Tensor, s1: Tensor, g: Tensor, s2: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""Vector-Jacobian products of :func:`whvi_matvec` for all four inputs.

    With :math:`u = H(s_2 x)`, :math:`v = H(g u)`, :math:`w = H(s_1 \bar y)`,
    :math:`z = H(g w)`: :math:`\bar x = s_2 z`, :math:`\bar s_1 = \sum \bar y v`,
    :math:`\bar g = \sum w u`, :math:`\bar s_2 = \sum x z`, each sum over the rows that
    share the diagonal's row.
    """
    u = fwht(s2 * x)
    v = fwht(g * u)
    w = fwht(s1 * grad)
    z = fwht(g * w)
    return (
        _sum_to_shape(s2 * z, x.shape),
        _sum_to_shape(grad * v, s1.shape),
        _sum_to_shape(w * u, g.shape),
        _sum_to_shape(x * z, s2.shape),
    )

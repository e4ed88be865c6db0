r"""WHVI's design on random Fourier features, fused from the angles: :func:`whvi_fourier_design`.

Shape letters: ``N`` inputs, ``m`` frequencies (``F = 2m`` features), ``D`` the WHVI block
(``D^2 >= F``), ``...`` batch.

``whvi_design(reshape([scale cos(A), scale sin(A)]))`` computed forward as the two steps, but
differentiated in one compiled pass from the design's gradient to the angles: the ``N x D^2``
gradient of the features and the separate backward of ``cos``/``sin`` are never formed. This is the
RF-WHVI training step's main cost (WHVI paper App. D.4).

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 and Table 10.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..ops import reference, whvi_design
from ..ops.backends import use_compiled_kernels, use_gpu_kernels
from .features import fourier_features

__all__ = ["whvi_fourier_design"]


def _padded_matrices(features: Tensor, size: int) -> Tensor:
    if features.shape[-1] < size * size:
        features = F.pad(features, (0, size * size - features.shape[-1]))
    return features.unflatten(-1, (size, size))


def _composite(angles: Tensor, scale: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    return whvi_design(_padded_matrices(fourier_features(angles, scale), s1.shape[-1]), s1, s2)


class _WHVIFourierDesign(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, angles: Tensor, scale: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
        features = fourier_features(angles, scale)
        ctx.save_for_backward(angles, scale, s1, s2, features)
        return whvi_design(_padded_matrices(features, s1.shape[-1]), s1, s2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        angles, scale, s1, s2, features = ctx.saved_tensors
        needed = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True: differentiate the differentiable composition
            inputs = [t for t, n in zip((angles, scale, s1, s2), needed) if n]
            grads = iter(torch.autograd.grad(_composite(angles, scale, s1, s2), inputs, grad, create_graph=True))
            return tuple(next(grads) if n else None for n in needed)
        if use_compiled_kernels(grad) or use_gpu_kernels(grad):
            fused = torch.ops.pyro_whvi.whvi_fourier_design_backward(grad.contiguous(), features, s1, s2)
        else:
            fused = reference.whvi_fourier_design_backward(grad, features, s1, s2)
        dangles, ds1, ds2, row_sums = fused
        dscale = (row_sums.unsqueeze(-1) / scale).sum_to_size(scale.shape) if needed[1] else None
        return dangles.sum_to_size(angles.shape), dscale, ds1, ds2


def whvi_fourier_design(angles: Tensor, scale: Tensor, s1: Tensor, s2: Tensor) -> Tensor:
    r"""``whvi_design`` of the random Fourier features of ``angles``, with a fused backward.

    .. math:: y = \operatorname{diag}(H S_1 R S_2 H), \qquad
       \operatorname{vec}(R) = [\sigma \cos A,\ \sigma \sin A,\ 0, \dots] \in \mathbb R^{D^2}

    (the features read row by row into ``R``, zero-padded). Equal to
    ``ops.whvi_design(reshape(fourier_features(angles, scale)), s1, s2)``; differentiable in all inputs.

    :param angles: ``(..., N, m)``.
    :param scale: :math:`\sigma`, broadcasting against ``(..., N, 1)`` (last dimension 1).
    :param s1: ``(D,)``.
    :param s2: ``(D,)``, ``D^2 >= 2m``.
    :returns: ``(..., N, D)``.
    """
    size = s1.shape[-1]
    if 2 * angles.shape[-1] > size * size:
        raise ValueError(f"whvi_fourier_design: {2 * angles.shape[-1]} features do not fit a {size} x {size} matrix.")
    if scale.dim() and scale.shape[-1] != 1:
        raise ValueError(f"whvi_fourier_design: scale must be constant along the features, got {tuple(scale.shape)}.")
    return _WHVIFourierDesign.apply(angles, scale, s1, s2)

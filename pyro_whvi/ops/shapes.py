r"""WHVI for matrices whose sides are not equal powers of two (WHVI paper §2.5, Algorithm 1).

A ``D_out x D_in`` weight is covered by ``K = ceil(D_out / D)`` independent WHVI blocks of size
``D x D``, ``D`` the next power of two of ``D_in``: the input is zero-padded to ``D``, each block
maps it to ``D`` outputs, the ``K`` outputs are concatenated and the extra rows dropped.

Shape letters: ``K`` blocks, ``D`` block size (a power of two), ``...`` batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import next_power_of_two

__all__ = [
    "WHVIDimensions",
    "pad_to_power_of_two",
    "setup_dimensions",
    "stacked_whvi_conv2d",
    "stacked_whvi_matvec",
    "stacked_whvi_weight",
]


@dataclass(frozen=True)
class WHVIDimensions:
    """The layout chosen by :func:`setup_dimensions` for a ``out_features x in_features`` weight."""

    in_features: int
    out_features: int
    block_size: int  #: D, the power of two the input is padded to
    padding: int  #: D - in_features zeros appended to every input
    num_blocks: int  #: K = ceil(out_features / D) stacked WHVI blocks

    @property
    def padded_out_features(self) -> int:
        """``K * D`` rows before the extra ones are dropped."""
        return self.block_size * self.num_blocks

    @property
    def num_variational_parameters(self) -> int:
        """``3 K D``: s1, s2 and the mean of g per block (a diagonal q(g) adds ``K D`` more)."""
        return 3 * self.block_size * self.num_blocks


def setup_dimensions(in_features: int, out_features: int) -> WHVIDimensions:
    """WHVI paper Algorithm 1: pad the input side to a power of two and stack blocks to cover the output side.

    The paper's pseudocode tests ``next_power == 2 * D_in`` to skip padding, which can never hold
    for ``next_power = 2**ceil(log2 D_in)``; the intent (no padding when ``D_in`` is already a
    power of two) is what is implemented.

    :param in_features: ``D_in >= 1``.
    :param out_features: ``D_out >= 1``.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.5, Algorithm 1.
    """
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"setup_dimensions: {name} must be a positive integer, got {value!r}.")
    block_size = next_power_of_two(in_features)
    return WHVIDimensions(
        in_features=in_features,
        out_features=out_features,
        block_size=block_size,
        padding=block_size - in_features,
        num_blocks=math.ceil(out_features / block_size),
    )


def pad_to_power_of_two(x: Tensor, dim: int = -1) -> Tensor:
    """Append zeros along ``dim`` up to the next power of two (returns ``x`` itself if already one)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"pad_to_power_of_two: x must be a torch.Tensor, got {type(x).__name__}.")
    if x.dim() == 0:
        raise ValueError("pad_to_power_of_two: x must have at least one dimension.")
    size = x.shape[dim]
    target = next_power_of_two(size)
    if target == size:
        return x
    moved = x.movedim(dim, -1)
    return F.pad(moved, (0, target - size)).movedim(-1, dim)


def _check_blocks(s1: Tensor, g: Tensor, s2: Tensor) -> tuple[int, int]:
    if s1.dim() != 2 or s2.shape != s1.shape:
        raise ValueError(
            f"stacked WHVI: s1 and s2 must both have shape (K, D), got s1={tuple(s1.shape)}, s2={tuple(s2.shape)}."
        )
    num_blocks, block_size = s1.shape
    if g.dim() < 2 or tuple(g.shape[-2:]) != (num_blocks, block_size):
        raise ValueError(
            f"stacked WHVI: g must have shape (..., K, D) = (..., {num_blocks}, {block_size}), got {tuple(g.shape)}."
        )
    return num_blocks, block_size


def stacked_whvi_matvec(x: Tensor, s1: Tensor, g: Tensor, s2: Tensor, out_features: int) -> Tensor:
    r"""``W x`` for a WHVI weight of any shape laid out by :func:`setup_dimensions`.

    :param x: ``(..., D_in)`` with ``D_in <= D``; zero-padded to ``D``.
    :param s1: ``(K, D)``.
    :param g: ``(K, D)`` shared, or ``(..., K, D)`` one draw per example (local reparameterization).
    :param s2: ``(K, D)``.
    :param out_features: ``D_out <= K D``; the extra rows are dropped.
    :returns: ``(..., D_out)``.
    """
    from . import whvi_matvec

    num_blocks, block_size = _check_blocks(s1, g, s2)
    if x.shape[-1] > block_size:
        raise ValueError(f"stacked_whvi_matvec: x has {x.shape[-1]} features but the blocks take at most {block_size}.")
    if not 1 <= out_features <= num_blocks * block_size:
        raise ValueError(
            f"stacked_whvi_matvec: out_features must be in [1, {num_blocks * block_size}], got {out_features}."
        )
    padded = F.pad(x, (0, block_size - x.shape[-1])).unsqueeze(-2)
    y = whvi_matvec(padded, s1, g, s2)
    return y.flatten(-2)[..., :out_features]


def stacked_whvi_conv2d(
    images: Tensor, s1: Tensor, g: Tensor, s2: Tensor, weight_shape, stride=1, padding=0, dilation=1
) -> Tensor:
    r"""``F.conv2d(images, W)`` for the WHVI filter bank ``W`` read as a ``(C_out, C_in k_h k_w)`` matrix (§3.3).

    Every patch goes through :func:`stacked_whvi_matvec`; ``W`` is never formed.

    :param images: ``(N, C_in, H, W)``.
    :param g: ``(K, D)`` shared, or ``(N, K, D)``: one draw per image.
    :param weight_shape: ``(C_out, C_in, k_h, k_w)``.
    :param stride: as ``F.conv2d`` (int or pair; ``groups=1``, numeric padding).
    :returns: ``(N, C_out, H_out, W_out)``.
    """
    pair = torch.nn.modules.utils._pair
    stride, padding, dilation = pair(stride), pair(padding), pair(dilation)
    out_channels, _, kernel_h, kernel_w = weight_shape
    patches = F.unfold(images, (kernel_h, kernel_w), dilation=dilation, padding=padding, stride=stride)
    height = (images.shape[-2] + 2 * padding[0] - dilation[0] * (kernel_h - 1) - 1) // stride[0] + 1
    width = (images.shape[-1] + 2 * padding[1] - dilation[1] * (kernel_w - 1) - 1) // stride[1] + 1
    if g.dim() == 3:
        g = g.unsqueeze(-3)  # (N, 1, K, D): each image's draw for all its patches
    output = stacked_whvi_matvec(patches.mT, s1, g, s2, out_channels)  # (N, L, C_out)
    return output.mT.reshape(images.shape[0], out_channels, height, width)


def stacked_whvi_weight(s1: Tensor, g: Tensor, s2: Tensor, out_features: int, in_features: int) -> Tensor:
    r"""The dense ``(D_out, D_in)`` weight: blocks :math:`S_{1,k} H \operatorname{diag}(g_k) H S_{2,k}` stacked by rows.

    Extra rows and padded columns are dropped.

    :param g: ``(K, D)`` for one draw, or ``(..., K, D)`` for several. Costs :math:`O(K D^2 \log D)`
        per draw; meant for checks, small layers and uses that need the matrix itself.
    :returns: ``(..., D_out, D_in)``.
    """
    from . import whvi_matvec

    num_blocks, block_size = _check_blocks(s1, g, s2)
    eye = torch.eye(block_size, dtype=s1.dtype, device=s1.device).unsqueeze(-2)  # (D_in, 1, D)
    columns = whvi_matvec(eye, s1, g.unsqueeze(-3), s2)  # (..., j, k, i) = W_k[i, j]
    weight = columns.movedim(-3, -1).reshape(*g.shape[:-2], num_blocks * block_size, block_size)
    return weight[..., :out_features, :in_features]

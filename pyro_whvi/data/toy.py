r"""The 1-D regression problem of the WHVI paper's §3.1 (Fig. 4): inputs on :math:`\mathcal{U}[-1, 2]`
with a gap, noisy targets of a wiggly function, noise variance :math:`e^{-3}`.

The paper does not publish its function or gap; these are fixed here (and documented) so results
can be compared across runs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["TOY_GAP", "TOY_NOISE_SCALE", "toy_function", "toy_regression_1d"]

TOY_GAP = (0.2, 1.0)  #: the removed interval, about a quarter of [-1, 2]
TOY_NOISE_SCALE = math.exp(-1.5)  #: noise variance exp(-3), as in the paper


def toy_function(x: Tensor) -> Tensor:
    """The noiseless target, :math:`\\sin(3x) + \\tfrac12 \\cos(7x + 1)`."""
    return torch.sin(3 * x) + 0.5 * torch.cos(7 * x + 1)


def toy_regression_1d(num_points: int = 128, seed: int = 0, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """``num_points`` inputs ``(N, 1)`` drawn on [-1, 2] outside :data:`TOY_GAP`, and noisy targets ``(N,)``."""
    generator = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.get_default_dtype()
    x = torch.empty(0, dtype=dtype)
    while x.numel() < num_points:
        draw = torch.rand(2 * num_points, generator=generator, dtype=dtype) * 3 - 1
        x = torch.cat([x, draw[(draw < TOY_GAP[0]) | (draw > TOY_GAP[1])]])
    x = x[:num_points]
    y = toy_function(x) + TOY_NOISE_SCALE * torch.randn(num_points, generator=generator, dtype=dtype)
    return x.unsqueeze(-1), y

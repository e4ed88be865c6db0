r"""How a weight site of any shape maps onto stacked WHVI blocks (WHVI paper §2.5, Algorithm 1).

Shape letters: ``K`` stacked blocks, ``D`` block size (a power of two), ``...`` sample/batch dims.

* **matrix**: a ``(D_out, D_in)`` weight, or a filter bank ``(C_out, C_in, k_1, ...)`` read as the
  matrix ``(C_out, C_in k_1 ...)`` (§3.3). The input side is padded to ``D``, ``K = ceil(D_out / D)``
  blocks are stacked by rows and extra rows dropped.
* **vector**: a parameter with ``n`` entries (a vector, or a matrix with a side of length one) is
  reshaped into one ``D x D`` block with ``D^2 >= n`` and the first ``n`` entries (row-major) are
  kept, so ``O(sqrt n)`` variational parameters describe ``n`` values (§2.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ops.shapes import setup_dimensions

__all__ = ["WHVILayout"]


@dataclass(frozen=True)
class WHVILayout:
    """Where the entries of a weight of shape ``shape`` live in the ``(K, D)`` WHVI parameters."""

    shape: torch.Size  #: the weight's own shape
    kind: str  #: ``"matrix"`` or ``"vector"``
    out_features: int  #: rows of the matrix view (``n`` for a vector)
    in_features: int  #: columns of the matrix view (``1`` for a vector)
    block_size: int  #: D
    num_blocks: int  #: K

    @classmethod
    def for_shape(cls, shape: tuple[int, ...] | torch.Size, site: str = "weight") -> WHVILayout:
        """The layout WHVI uses for a weight of this shape.

        :raises ValueError: for a scalar or an empty weight, naming ``site``.
        """
        shape = torch.Size(shape)
        if len(shape) == 0 or shape.numel() < 2:
            raise ValueError(
                f"WHVI site {site!r}: cannot place a weight of shape {tuple(shape)} on WHVI blocks; "
                "it needs at least two entries (use a mean-field guide for scalars)."
            )
        if len(shape) >= 2 and shape[0] > 1 and math.prod(shape[1:]) > 1:
            out_features, in_features = shape[0], math.prod(shape[1:])
            dims = setup_dimensions(in_features, out_features)
            return cls(shape, "matrix", out_features, in_features, dims.block_size, dims.num_blocks)
        numel = shape.numel()
        block_size = 1 << math.ceil(math.log2(numel) / 2)
        return cls(shape, "vector", numel, 1, block_size, 1)

    @property
    def block_shape(self) -> torch.Size:
        """``(K, D)``, the shape of ``g``, ``s1`` and ``s2``."""
        return torch.Size((self.num_blocks, self.block_size))

    @property
    def num_latent(self) -> int:
        """``K D``, the number of entries of ``g``."""
        return self.num_blocks * self.block_size

    @property
    def matrix_shape(self) -> torch.Size:
        """The shape of the dense matrix the blocks cover before the weight is cut out of it."""
        if self.kind == "vector":
            return torch.Size((self.block_size, self.block_size))
        return torch.Size((self.out_features, self.in_features))

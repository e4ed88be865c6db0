"""scikit-learn's bundled ``load_digits`` (1,797 8x8 images, 10 classes) as a seeded train/test split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .sklearn_sets import sklearn_datasets

__all__ = ["DigitsSplit", "load_digits_split"]


@dataclass
class DigitsSplit:
    """Pixels scaled to ``[0, 1]``; ``x`` is ``(N, 64)`` or, with ``images=True``, ``(N, 1, 8, 8)``."""

    x_train: Tensor
    y_train: Tensor  #: (N_train,) int64 labels
    x_test: Tensor
    y_test: Tensor


def load_digits_split(
    test_fraction: float = 0.3, seed: int = 0, images: bool = False, dtype: torch.dtype | None = None
) -> DigitsSplit:
    """A stratified-by-shuffle train/test split of ``sklearn.datasets.load_digits`` (no download needed)."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"load_digits_split: test_fraction must be in (0, 1), got {test_fraction!r}.")
    data = sklearn_datasets("load_digits_split").load_digits()
    x = torch.as_tensor(data.data / 16.0, dtype=dtype or torch.get_default_dtype())
    y = torch.as_tensor(data.target, dtype=torch.long)
    if images:
        x = x.reshape(-1, 1, 8, 8)
    order = torch.as_tensor(np.random.default_rng(seed).permutation(len(y)))
    num_test = round(test_fraction * len(y))
    test, train = order[:num_test], order[num_test:]
    return DigitsSplit(x[train], y[train], x[test], y[test])

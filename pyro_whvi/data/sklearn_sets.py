"""scikit-learn's bundled datasets as train/test splits, the defaults that need no download.

* :func:`load_diabetes_split`: regression (442 patients, 10 features), random 90/10 splits like the
  UCI ones, inputs and targets standardized with training statistics (:class:`~pyro_whvi.data.UCISplit`).
* :func:`load_breast_cancer_split`: binary classification (569 tumours, 30 features), inputs
  standardized with training statistics, integer labels (:class:`ClassificationSplit`).
* Digits: :func:`pyro_whvi.data.load_digits_split`.

Shape letters: ``N`` examples, ``D`` features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .uci import UCISplit, standardized_split

__all__ = ["ClassificationSplit", "load_breast_cancer_split", "load_diabetes_split", "sklearn_datasets"]


def sklearn_datasets(caller: str):
    """``sklearn.datasets``, or an ``ImportError`` naming ``caller`` and the extra that brings scikit-learn
    (an application dependency: the library itself does not need it)."""
    try:
        from sklearn import datasets
    except ImportError as error:
        raise ImportError(
            f"{caller} reads scikit-learn's bundled data sets: pip install 'pyro_whvi[experiments]' (or scikit-learn)"
        ) from error
    return datasets


@dataclass
class ClassificationSplit:
    """Standardized inputs ``(N, D)`` and ``(N,)`` int64 labels."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


def _rows(num_rows: int, test_fraction: float, seed: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not 0 < test_fraction < 1:
        raise ValueError(f"{name}: test_fraction must be in (0, 1), got {test_fraction!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"{name}: the split/seed must be a non-negative integer, got {seed!r}.")
    order = np.random.default_rng(seed).permutation(num_rows)
    num_test = max(1, round(test_fraction * num_rows))
    return order[num_test:], order[:num_test]


def load_diabetes_split(split: int = 0, test_fraction: float = 0.1, dtype: torch.dtype | None = None) -> UCISplit:
    """Split ``split`` (a seed) of ``sklearn.datasets.load_diabetes``; metrics in original units use
    ``y_mean``/``y_std`` as for UCI data."""
    data = sklearn_datasets("load_diabetes_split").load_diabetes()
    train, test = _rows(len(data.target), test_fraction, split, "load_diabetes_split")
    return standardized_split(np.asarray(data.data), np.asarray(data.target, dtype=float), train, test, dtype)


def load_breast_cancer_split(
    seed: int = 0, test_fraction: float = 0.3, dtype: torch.dtype | None = None
) -> ClassificationSplit:
    """A seeded train/test split of ``sklearn.datasets.load_breast_cancer`` (labels 0 = malignant, 1 = benign)."""
    data = sklearn_datasets("load_breast_cancer_split").load_breast_cancer()
    train, test = _rows(len(data.target), test_fraction, seed, "load_breast_cancer_split")
    labels = np.asarray(data.target, dtype=float)
    standardized = standardized_split(np.asarray(data.data), labels, train, test, dtype)
    return ClassificationSplit(
        x_train=standardized.x_train,
        y_train=torch.as_tensor(data.target[train], dtype=torch.long),
        x_test=standardized.x_test,
        y_test=torch.as_tensor(data.target[test], dtype=torch.long),
    )

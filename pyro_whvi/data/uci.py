r"""UCI regression data in the split format of Gal & Ghahramani's "Dropout as a Bayesian approximation"
experiments: ``data.txt`` (whitespace separated), ``index_features.txt``, ``index_target.txt``,
``index_train_<k>.txt``, ``index_test_<k>.txt`` (0-based row indices).

Shape letters: ``N`` examples, ``D`` features, ``S`` posterior samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["UCISplit", "gaussian_mnll", "load_uci_split", "num_uci_splits", "rmse", "standardized_split"]

_REQUIRED = ("data.txt", "index_features.txt", "index_target.txt")


@dataclass
class UCISplit:
    """One train/test split, inputs standardized with training statistics.

    Targets are standardized too (``y = (y_raw - y_mean) / y_std``); metrics in the original units
    use ``y_mean``/``y_std``.
    """

    x_train: Tensor  #: (N_train, D)
    y_train: Tensor  #: (N_train,)
    x_test: Tensor  #: (N_test, D)
    y_test: Tensor  #: (N_test,)
    y_mean: float
    y_std: float


def _check_directory(directory: Path) -> None:
    missing = [name for name in _REQUIRED if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{directory} is not a UCI split directory: missing {missing} (expected data.txt, index_features.txt, "
            "index_target.txt, index_train_<k>.txt, index_test_<k>.txt)."
        )


def num_uci_splits(directory: str | Path) -> int:
    """How many ``index_train_<k>.txt`` files the directory has."""
    directory = Path(directory)
    _check_directory(directory)
    return len(list(directory.glob("index_train_*.txt")))


def load_uci_split(directory: str | Path, split: int, dtype: torch.dtype | None = None) -> UCISplit:
    """Load split ``split`` of the dataset in ``directory``.

    :raises FileNotFoundError: if the directory or the split's index files are missing.
    :raises ValueError: if the data contain NaNs or indices are out of range.
    """
    directory = Path(directory)
    _check_directory(directory)
    train_file, test_file = directory / f"index_train_{split}.txt", directory / f"index_test_{split}.txt"
    if not train_file.is_file() or not test_file.is_file():
        raise FileNotFoundError(f"{directory}: split {split} has no {train_file.name}/{test_file.name}.")
    data = np.loadtxt(directory / "data.txt", ndmin=2)
    if np.isnan(data).any():
        raise ValueError(f"{directory / 'data.txt'} contains NaN values.")
    features = np.loadtxt(directory / "index_features.txt", dtype=int, ndmin=1)
    target = int(np.loadtxt(directory / "index_target.txt", dtype=int))
    train = np.loadtxt(train_file, dtype=int, ndmin=1)
    test = np.loadtxt(test_file, dtype=int, ndmin=1)
    for name, index in (("train", train), ("test", test)):
        if index.min() < 0 or index.max() >= len(data):
            raise ValueError(
                f"{directory}: split {split} {name} indices fall outside the {len(data)} rows of data.txt."
            )
    return standardized_split(data[:, features], data[:, target], train, test, dtype)


def standardized_split(
    x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, dtype: torch.dtype | None = None
) -> UCISplit:
    """Split rows ``train``/``test`` of ``(N, D)`` inputs and ``(N,)`` targets, both standardized with the
    training rows' mean and standard deviation (constant columns are left unscaled)."""
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    x_std[x_std == 0] = 1.0
    y_mean, y_std = float(y[train].mean()), float(y[train].std()) or 1.0
    dtype = dtype or torch.get_default_dtype()

    def tensor(array: np.ndarray) -> Tensor:
        return torch.as_tensor(array, dtype=dtype)

    return UCISplit(
        x_train=tensor((x[train] - x_mean) / x_std),
        y_train=tensor((y[train] - y_mean) / y_std),
        x_test=tensor((x[test] - x_mean) / x_std),
        y_test=tensor((y[test] - y_mean) / y_std),
        y_mean=y_mean,
        y_std=y_std,
    )


def rmse(f_samples: Tensor, y: Tensor) -> float:
    """Root mean squared error of the predictive mean; ``f_samples`` is ``(S, N)``."""
    return float((f_samples.mean(0) - y).pow(2).mean().sqrt())


def gaussian_mnll(f_samples: Tensor, noise_scale: Tensor | float, y: Tensor) -> float:
    r"""Mean negative log predictive density, :math:`-\frac1N \sum_i \log \frac1S \sum_s
    \mathcal{N}(y_i \mid f_s(x_i), \sigma^2)`, for ``f_samples`` of shape ``(S, N)``."""
    noise = torch.as_tensor(noise_scale, dtype=f_samples.dtype)
    log_density = torch.distributions.Normal(f_samples, noise).log_prob(y)
    return float(-(torch.logsumexp(log_density, 0) - math.log(f_samples.shape[0])).mean())

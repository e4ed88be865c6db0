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

__all__ = [
    "UCISplit",
    "load_uci_split",
    "num_uci_splits",
    "standardized_split",
    "uci_split_files",
]

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


def uci_split_files(directory: str | Path, split: int) -> tuple[Path, ...]:
    """The files split ``split`` is read from: data, features, target, training and test indices.

    :raises FileNotFoundError: if any of them is missing.
    """
    directory = Path(directory)
    _check_directory(directory)
    train_file, test_file = directory / f"index_train_{split}.txt", directory / f"index_test_{split}.txt"
    if not train_file.is_file() or not test_file.is_file():
        raise FileNotFoundError(f"{directory}: split {split} has no {train_file.name}/{test_file.name}.")
    return (*(directory / name for name in _REQUIRED), train_file, test_file)


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    """The whitespace-separated tokens of each non-blank line of ``path`` with its 1-based line number
    (``#`` starts a comment, as for ``np.loadtxt``)."""
    lines = path.read_text(errors="replace").split("\n")
    return [(n, tokens) for n, line in enumerate(lines, 1) if (tokens := line.split("#")[0].split())]


def _hint(token: str) -> str:
    if token.lower() in ("?", "nan", "na", "n/a", "-nan", "+nan"):
        return "a missing value (NaN): remove or impute its row"
    if "," in token:
        return "columns are separated by whitespace, not commas"
    if token.lower().lstrip("+-") in ("inf", "infinity"):
        return "an infinite value: remove its row or replace the value"
    return "write a decimal number such as -1.5 or 2e3"


def _float(token: str) -> float:
    """``token`` as a number, NaN if it is none."""
    try:
        return float(token)
    except ValueError:
        return math.nan


def _read_data(path: Path) -> np.ndarray:
    """The ``(N, columns)`` finite numbers of ``data.txt``; a ``ValueError`` names the line and column
    of the first problem."""
    rows = _lines(path)
    width = len(rows[0][1]) if rows else 0
    values = []
    for line, tokens in rows:
        for column, token in enumerate(tokens, 1):
            if not math.isfinite(_float(token)):
                raise ValueError(
                    f"{path}, line {line}, column {column}: expected a finite number, got {token[:40]!r}; "
                    f"{_hint(token)}."
                )
        if len(tokens) != width:
            raise ValueError(
                f"{path}, line {line}: expected {width} columns as on line {rows[0][0]}, found {len(tokens)}; "
                "every row needs a value in each column."
            )
        values.append([float(token) for token in tokens])
    if len(values) < 2:
        raise ValueError(f"{path}: at least 2 rows expected (training and test rows), found {len(values)}.")
    return np.array(values)


def _read_indices(path: Path, bound: int, what: str) -> list[tuple[int, int]]:
    """The 0-based indices in ``path``, each with its line, all whole numbers in ``[0, bound)``; ``what``
    names what they index (``"row"``/``"column"`` of data.txt) in the error."""
    indices = []
    for line, tokens in _lines(path):
        for column, token in enumerate(tokens, 1):
            value = _float(token)
            if not (value.is_integer() and 0 <= value < bound):
                raise ValueError(
                    f"{path}, line {line}, column {column}: expected a {what} of data.txt, a whole number from 0 to "
                    f"{bound - 1}, got {token[:40]!r}; indices are 0-based, whitespace separated."
                )
            indices.append((int(value), line))
    if not indices:
        raise ValueError(f"{path} is empty; expected 0-based {what} indices of data.txt, one per line.")
    return indices


def load_uci_split(directory: str | Path, split: int, dtype: torch.dtype | None = None) -> UCISplit:
    """Load split ``split`` of the dataset in ``directory``, validating every file.

    :raises FileNotFoundError: if the directory or the split's index files are missing.
    :raises ValueError: naming the file, line and column and the fix, if data.txt has anything but finite
        numbers in equal-length rows or fewer than 2 rows, an index is not a whole number in range, an index
        file is empty, the target is among the features, there are fewer than 2 training rows, a test row is
        also a training row, or the values are too large to standardize.
    """
    data_file, features_file, target_file, train_file, test_file = uci_split_files(directory, split)
    data = _read_data(data_file)
    rows, columns = data.shape
    features = _read_indices(features_file, columns, "column")
    target = _read_indices(target_file, columns, "column")
    train = _read_indices(train_file, rows, "row")
    test = _read_indices(test_file, rows, "row")
    if len(target) != 1:
        raise ValueError(f"{target_file}: expected exactly one column index, found {len(target)}; keep the target's.")
    for feature, line in features:
        if feature == target[0][0]:
            raise ValueError(
                f"{features_file}, line {line}: column {feature} is the target ({target_file.name}); remove it "
                "from the features."
            )
    if len(train) < 2:
        raise ValueError(f"{train_file}: at least 2 rows expected for the training statistics, found {len(train)}.")
    training = {row: line for row, line in train}
    for row, line in test:
        if row in training:
            raise ValueError(
                f"{test_file}, line {line}: row {row} is also in {train_file.name} (line {training[row]}); "
                "a test row must not be trained on."
            )
    x, y = data[:, [f for f, _ in features]], data[:, target[0][0]]
    try:
        with np.errstate(over="raise", invalid="raise"):  # statistics that overflow float64
            result = standardized_split(x, y, np.array([r for r, _ in train]), np.array([r for r, _ in test]), dtype)
        tensors = (result.x_train, result.y_train, result.x_test, result.y_test)
        if not all(bool(t.isfinite().all()) for t in tensors):  # or standardized values beyond ``dtype``
            raise FloatingPointError
    except FloatingPointError:
        raise ValueError(f"{data_file}: values too large to standardize; rescale the columns.") from None
    return result


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

"""Which data ``whvi uci`` runs on: UCI split-format folders and scikit-learn's bundled sets, by split.

A dataset is a directory in the standard UCI split format (``data.txt``, ``index_features.txt``,
``index_target.txt``, ``index_train_<k>.txt``, ``index_test_<k>.txt``) or one of scikit-learn's bundled
sets (``diabetes`` regression, ``breast_cancer`` and ``digits`` classification; the split index seeds
their random 90/10 or 70/30 split).

References:
    J. M. Hernández-Lobato, R. Adams. *Probabilistic Backpropagation*. ICML 2015 (the split format).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from ..data import load_breast_cancer_split, load_diabetes_split, load_digits_split, load_uci_split
from ..data.uci import num_uci_splits, uci_split_files
from .noisy_sets import read_noise_std

__all__ = [
    "BUNDLED_DATASETS",
    "SplitSizes",
    "UCIData",
    "check_source",
    "data_key",
    "dataset_name",
    "is_bundled",
    "load_dataset_split",
    "parse_splits",
]

BUNDLED_DATASETS = ("diabetes", "breast_cancer", "digits")
MAX_SPLITS = 1000  # more in one --splits is a typo (0-100000000), not a plan


@dataclass
class UCIData:
    """One split; ``y_scale`` turns standardized regression targets back into original units."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str  # "regression" or "classification"
    y_scale: float = 1.0
    num_classes: int = 1


def parse_splits(text: str) -> tuple[int, ...]:
    """``"0-4"`` -> (0, 1, 2, 3, 4); ``"0,2,5"`` -> (0, 2, 5); a ``ValueError`` for anything else,
    a range that runs backwards included, or more than :data:`MAX_SPLITS` splits."""
    splits: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            start, stop = int(first), int(last or first) + 1
        except ValueError:
            start = stop = -1
        if not 0 <= start < stop:
            raise ValueError(f"splits must look like '0-4' or '0,2,5' (non-negative, ranges upwards), got {text!r}")
        if len(splits) + stop - start > MAX_SPLITS:
            raise ValueError(f"at most {MAX_SPLITS} splits expected, got {text!r}")
        splits.extend(range(start, stop))
    return tuple(dict.fromkeys(splits))


def is_bundled(source: str | Path) -> bool:
    return isinstance(source, str) and source in BUNDLED_DATASETS


def dataset_name(source: str | Path) -> str:
    """The name results are filed under: the bundled set's, or the folder's (``.`` named after itself)."""
    return str(source) if is_bundled(source) else Path(source).resolve().name


def data_key(source: str | Path, split: int) -> str:
    """What identifies split ``split``'s data: the bundled set's name, or the folder's resolved path and
    a hash of the files the split is read from, so that an edited or another folder is not mistaken for it."""
    if is_bundled(source):
        return str(source)
    digest = hashlib.sha256()
    for file in uci_split_files(source, split):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return f"{Path(source).resolve()}:{digest.hexdigest()}"


class SplitSizes(NamedTuple):
    """The largest sizes over a run's splits: training and test rows, input features and outputs per row; and the
    fewest training rows of a split (0: not counted), what a held-out part is checked on."""

    train: int
    test: int
    features: int
    outputs: int
    fewest_train: int = 0


def check_source(source: str | Path, splits: tuple[int, ...]) -> SplitSizes:
    """A ``ValueError``/``FileNotFoundError`` naming the problem when ``source`` cannot provide ``splits``:
    every requested split of a folder is loaded and validated (:func:`~pyro_whvi.data.load_uci_split`).

    :returns: the largest sizes over the splits (what memory the run needs depends on them)."""
    if is_bundled(source):
        data = load_dataset_split(source, 0)
        outputs = data.num_classes if data.task == "classification" else 1
        return SplitSizes(len(data.y_train), len(data.y_test), data.x_train.shape[1], outputs, len(data.y_train))
    available = num_uci_splits(source)  # raises for a missing directory or files
    missing = [k for k in splits if k >= available]
    if missing:
        listed = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        has = f"splits 0-{available - 1}" if available else "no index_train_<k>.txt"
        raise ValueError(f"{source} has {has}; asked for {listed}")
    sizes = SplitSizes(0, 0, 0, 1)
    fewest: list[int] = []
    for split in splits:
        loaded = load_uci_split(source, split)
        shape = (len(loaded.y_train), len(loaded.y_test), loaded.x_train.shape[1], 1)
        sizes = SplitSizes(*map(max, sizes[:4], shape))
        fewest.append(len(loaded.y_train))
    read_noise_std(source)  # a damaged noise_std.txt is reported now, not after training
    return sizes._replace(fewest_train=min(fewest))


def load_dataset_split(source: str | Path, split: int, *, standardize_targets: bool = True) -> UCIData:
    """Split ``split`` of a UCI-format directory or a bundled scikit-learn set (see the module doc).

    :param standardize_targets: regression targets standardized with the training statistics (``y_scale``
        turns them back); ``False`` keeps them in their original units, as the WHVI paper does (App. D.1)."""
    if source == "digits":
        digits = load_digits_split(seed=split)
        return UCIData(digits.x_train, digits.y_train, digits.x_test, digits.y_test, "classification", num_classes=10)
    if source == "breast_cancer":
        cancer = load_breast_cancer_split(seed=split)
        return UCIData(cancer.x_train, cancer.y_train, cancer.x_test, cancer.y_test, "classification", num_classes=2)
    data = load_diabetes_split(split) if source == "diabetes" else load_uci_split(source, split)
    if not standardize_targets:
        y_train, y_test = (y * data.y_std + data.y_mean for y in (data.y_train, data.y_test))
        return UCIData(data.x_train, y_train, data.x_test, y_test, "regression")
    return UCIData(data.x_train, data.y_train, data.x_test, data.y_test, "regression", y_scale=data.y_std)

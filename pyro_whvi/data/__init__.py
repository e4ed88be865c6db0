"""Datasets and metrics: UCI regression splits (the standard ``index_train_<k>.txt`` format), the
WHVI paper's 1-D toy problem, and scikit-learn's bundled digits."""

from .digits import DigitsSplit, load_digits_split
from .toy import TOY_GAP, TOY_NOISE_SCALE, toy_function, toy_regression_1d
from .uci import UCISplit, gaussian_mnll, load_uci_split, num_uci_splits, rmse

__all__ = [
    "TOY_GAP",
    "TOY_NOISE_SCALE",
    "DigitsSplit",
    "UCISplit",
    "gaussian_mnll",
    "load_digits_split",
    "load_uci_split",
    "num_uci_splits",
    "rmse",
    "toy_function",
    "toy_regression_1d",
]

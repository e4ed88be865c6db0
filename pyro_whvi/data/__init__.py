"""Datasets: UCI regression splits (the standard ``index_train_<k>.txt`` format), the
WHVI paper's 1-D toy problem, scikit-learn's bundled digits, diabetes and breast cancer, and the
closed-form functions of the GP experiment (:mod:`pyro_whvi.data.synthetic`)."""

from .digits import DigitsSplit, load_digits_split
from .sklearn_sets import ClassificationSplit, load_breast_cancer_split, load_diabetes_split
from .synthetic import SYNTHETIC_FUNCTIONS, SyntheticDataset, SyntheticFunction, make_synthetic_dataset
from .toy import TOY_GAP, TOY_NOISE_SCALE, toy_function, toy_regression_1d
from .uci import UCISplit, load_uci_split, num_uci_splits

__all__ = [
    "SYNTHETIC_FUNCTIONS",
    "TOY_GAP",
    "TOY_NOISE_SCALE",
    "ClassificationSplit",
    "DigitsSplit",
    "SyntheticDataset",
    "SyntheticFunction",
    "UCISplit",
    "load_breast_cancer_split",
    "load_diabetes_split",
    "load_digits_split",
    "load_uci_split",
    "make_synthetic_dataset",
    "num_uci_splits",
    "toy_function",
    "toy_regression_1d",
]

"""Random-feature Gaussian processes on the FWHT for GPyTorch (WHVI paper App. D.4).

* :class:`RandomFeatureKernel` — RBF random Fourier features with dense, Fastfood or SORF projections.
* :class:`RandomFeatureGP` — the linearized GP ``f = Phi(x) w`` with a Gaussian or WHVI posterior over ``w``.
* :class:`GPRegressor` — one fit/predict interface shared with the inducing-point baselines
  (:mod:`pyro_whvi.baselines`).
"""

from .kernel import RandomFeatureKernel
from .model import POSTERIORS, RandomFeatureGP, RandomFeatureRegressor
from .posteriors import COVARIANCES, GaussianWeightPosterior, WeightPosterior, WHVIWeightPosterior
from .regressor import FitResult, GPInitialization, GPRegressor, GPSchedule, TorchGPRegressor

__all__ = [
    "COVARIANCES",
    "POSTERIORS",
    "FitResult",
    "GPInitialization",
    "GPRegressor",
    "GPSchedule",
    "GaussianWeightPosterior",
    "RandomFeatureGP",
    "RandomFeatureKernel",
    "RandomFeatureRegressor",
    "TorchGPRegressor",
    "WHVIWeightPosterior",
    "WeightPosterior",
]

"""Random-feature Gaussian processes on the FWHT for GPyTorch (WHVI paper App. D.4).

* :class:`RandomFeatureKernel` — RBF random Fourier features with dense, Fastfood or SORF projections.
* :class:`RandomFeatureGP` — the linearized GP ``f = Phi(x) w`` with a Gaussian or WHVI posterior over ``w``,
  a GPyTorch ``ApproximateGP`` whose :class:`RandomFeatureVariationalStrategy` (:class:`WHVIVariationalStrategy` for
  WHVI) treats ``w`` as the inducing variables and owns the feature design; the posteriors are pure ``q(z)``.

Fitting and predicting with them next to inducing-point baselines is the application's
(:mod:`pyro_whvi.experiments.gp_regressors`, :mod:`pyro_whvi.experiments.baselines`).
"""

from .kernel import RandomFeatureKernel
from .posteriors import COVARIANCES, GaussianWeightPosterior, WeightPosterior, WHVIWeightPosterior
from .random_feature_gp import POSTERIORS, RandomFeatureGP, check_regression_data
from .variational_strategy import RandomFeatureVariationalStrategy, WHVIVariationalStrategy

__all__ = [
    "COVARIANCES",
    "POSTERIORS",
    "GaussianWeightPosterior",
    "RandomFeatureGP",
    "RandomFeatureKernel",
    "RandomFeatureVariationalStrategy",
    "WHVIVariationalStrategy",
    "WHVIWeightPosterior",
    "WeightPosterior",
    "check_regression_data",
]

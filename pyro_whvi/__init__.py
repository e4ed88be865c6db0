"""pyro_whvi: structured variational inference for over-parameterized Pyro and GPyTorch models.

The foundation is :mod:`pyro_whvi.ops`, the fast Walsh–Hadamard transform and the fused WHVI
product with compiled CPU kernels and a pure-PyTorch reference.
"""

from . import distributions, infer, init, ops
from .distributions import StructuredDropoutNoise, WHVIMatrix, WHVINormal
from .infer import AutoVSDGuide, AutoWHVIGuide, KLAnnealing, WHVIReparam, local_reparameterization
from .init import iblm_, xavier_normal_

__version__ = "0.1.0.dev0"

__all__ = [
    "AutoVSDGuide",
    "AutoWHVIGuide",
    "KLAnnealing",
    "StructuredDropoutNoise",
    "WHVIMatrix",
    "WHVINormal",
    "WHVIReparam",
    "__version__",
    "distributions",
    "iblm_",
    "infer",
    "init",
    "local_reparameterization",
    "ops",
    "xavier_normal_",
]

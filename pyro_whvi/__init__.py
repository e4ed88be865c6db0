"""pyro_whvi: structured variational inference for over-parameterized Pyro and GPyTorch models.

The foundation is :mod:`pyro_whvi.ops`, the fast Walsh–Hadamard transform and the fused WHVI
product with compiled CPU kernels and a pure-PyTorch reference. The library is ``ops``,
``distributions``, ``infer``, ``nn``, ``init``, ``gp``, ``metrics`` and ``data``; the GPyTorch side,
:mod:`pyro_whvi.gp` (random-feature GPs), and the application, :mod:`pyro_whvi.experiments` (training
engine, UCI harness, demo, GP experiment with its SVGP baselines, the ``whvi`` command), are imported
on first access.
"""

import importlib
from typing import Any

from . import distributions, infer, init, nn, ops
from .distributions import StructuredDropoutNoise, WHVIMatrix, WHVINormal
from .infer import AutoVSDGuide, AutoWHVIGuide, KLAnnealing, WHVIReparam, local_reparameterization
from .init import iblm_, xavier_normal_

__version__ = "0.1.0.dev0"

_LAZY_SUBMODULES = ("experiments", "gp")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AutoVSDGuide",
    "AutoWHVIGuide",
    "KLAnnealing",
    "StructuredDropoutNoise",
    "WHVIMatrix",
    "WHVINormal",
    "WHVIReparam",
    "__version__",
    "baselines",
    "distributions",
    "gp",
    "iblm_",
    "infer",
    "init",
    "local_reparameterization",
    "nn",
    "ops",
    "xavier_normal_",
]

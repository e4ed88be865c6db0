"""Baselines for the GP experiments: sparse variational GPs (inducing points) in GPyTorch and GPflow.

GPflow and TensorFlow are the optional ``[baselines]`` extra; they are imported only when a
:class:`GPflowSVGP` is built, so importing this package does not need them.
"""

from __future__ import annotations

from .gpflow_svgp import GPflowSVGP
from .svgp import (
    GPyTorchSVGP,
    inducing_points_for_parameters,
    initial_inducing_points,
    svgp_num_variational_parameters,
)

__all__ = [
    "GPflowSVGP",
    "GPyTorchSVGP",
    "inducing_points_for_parameters",
    "initial_inducing_points",
    "svgp_num_variational_parameters",
]

"""Variational layers: the posterior inside ``nn.Module`` s, plain PyTorch end to end (``torch.compile``);
and ready-made Pyro networks (:class:`BayesianMLP`, :class:`BayesianCNN`, in :mod:`pyro_whvi.nn.networks`).

:func:`bayesian_` converts an existing network in one call; :func:`kl_divergence` is the KL term of an
ELBO loss. See :mod:`pyro_whvi.nn.base` for the scope of the noise draws and the use inside Pyro models.
"""

from .base import ExecutionScope, VariationalLayer, kl_divergence, normal_kl, softplus_inverse
from .convert import METHODS, bayesian_
from .mean_field import MeanFieldLinear
from .networks import BayesianCNN, BayesianMLP
from .vsd import VSDConv2d, VSDLinear
from .whvi import WHVIConv2d, WHVILinear

__all__ = [
    "METHODS",
    "BayesianCNN",
    "BayesianMLP",
    "ExecutionScope",
    "MeanFieldLinear",
    "VSDConv2d",
    "VSDLinear",
    "VariationalLayer",
    "WHVIConv2d",
    "WHVILinear",
    "bayesian_",
    "kl_divergence",
    "normal_kl",
    "softplus_inverse",
]

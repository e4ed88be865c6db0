r"""Distributions for structured variational posteriors.

* :class:`WHVIMatrix` / :class:`WHVINormal`: the matrix-variate ``q(W)`` that WHVI induces on a
  weight (WHVI paper §2.2, App. A), with a fast product with inputs.
* :class:`GaussianQG`: the one family of WHVI posteriors ``q(g)`` (diagonal / full / low-rank covariance,
  optionally planar flows), its closed-form KL, and the :class:`WHVIConvention` s of networks and GPs
  (:mod:`~pyro_whvi.distributions.qg_family`).
* :class:`PlanarFlowNormal`: ``q(g)`` of NF-WHVI, a diagonal Gaussian through planar flows (§2.5, App. C).
* :class:`StructuredDropoutNoise`: VSD's Householder-structured multiplicative noise (VSD paper §3.1),
  and the closed-form KL terms of VSD in :mod:`~pyro_whvi.distributions.empirical_bayes`.
* :class:`WHVILayout`: how a weight of any shape sits on stacked WHVI blocks (§2.5, Algorithm 1).
"""

from . import empirical_bayes
from .householder import StructuredDropoutNoise, householder_product
from .layout import WHVILayout
from .planar import PlanarFlowNormal
from .qg_family import GP_CONVENTION, NETWORK_CONVENTION, GaussianQG, WHVIConvention
from .whvi_matrix import WHVIMatrix, WHVINormal, gaussian_blocks, whvi_weight

__all__ = [
    "GP_CONVENTION",
    "NETWORK_CONVENTION",
    "GaussianQG",
    "PlanarFlowNormal",
    "StructuredDropoutNoise",
    "WHVIConvention",
    "WHVILayout",
    "WHVIMatrix",
    "WHVINormal",
    "empirical_bayes",
    "gaussian_blocks",
    "householder_product",
    "whvi_weight",
]

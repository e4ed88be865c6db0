r"""Distributions for structured variational posteriors.

* :class:`WHVIMatrix` / :class:`WHVINormal`: the matrix-variate ``q(W)`` that WHVI induces on a
  weight (WHVI paper §2.2, App. A), with a fast product with inputs.
* :class:`PlanarFlowNormal`: ``q(g)`` of NF-WHVI, a diagonal Gaussian through planar flows (§2.5, App. C).
* :class:`StructuredDropoutNoise`: VSD's Householder-structured multiplicative noise (VSD paper §3.1),
  and the closed-form KL terms of VSD in :mod:`~pyro_whvi.distributions.empirical_bayes`.
* :class:`WHVILayout`: how a weight of any shape sits on stacked WHVI blocks (§2.5, Algorithm 1).
"""

from . import empirical_bayes
from .householder import StructuredDropoutNoise, householder_product
from .layout import WHVILayout
from .planar import PlanarFlowNormal
from .whvi_matrix import WHVIMatrix, WHVINormal, gaussian_blocks, whvi_weight

__all__ = [
    "PlanarFlowNormal",
    "StructuredDropoutNoise",
    "WHVILayout",
    "WHVIMatrix",
    "WHVINormal",
    "empirical_bayes",
    "gaussian_blocks",
    "householder_product",
    "whvi_weight",
]

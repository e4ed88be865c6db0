r"""Distributions for structured variational posteriors.

* :class:`WHVIMatrix` / :class:`WHVINormal`: the matrix-variate ``q(W)`` that WHVI induces on a
  weight (WHVI paper §2.2, App. A), with a fast product with inputs.
* :class:`PlanarFlowNormal`: ``q(g)`` of NF-WHVI, a diagonal Gaussian through planar flows (§2.5, App. C).
* :class:`WHVILayout`: how a weight of any shape sits on stacked WHVI blocks (§2.5, Algorithm 1).
"""

from .layout import WHVILayout
from .planar import PlanarFlowNormal
from .whvi_matrix import WHVIMatrix, WHVINormal, gaussian_blocks, whvi_weight

__all__ = ["PlanarFlowNormal", "WHVILayout", "WHVIMatrix", "WHVINormal", "gaussian_blocks", "whvi_weight"]

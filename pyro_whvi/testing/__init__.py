"""Reusable test bases for users who write their own guide, as ``gpytorch.test`` ships its test cases.

:class:`StructuredGuideTestCase` runs a guide through the checks every guide of the library passes: Pyro's
``SVI`` with each ELBO, ``Predictive``, minibatch scaling, ``state_dict`` and param-store round trips,
dtype and device moves, and every structured parameter moving under SVI. :class:`RandomFeatureStrategyTestCase`
does the same for a random-feature GP's variational strategy against GPyTorch's definitions and closed forms.
They need ``pytest`` (the ``dev`` extra); the library never imports this package.
"""

from .conformance_models import ConformanceMLP, LocalLatentMLP
from .guide_case import StructuredGuideTestCase
from .guide_case_base import GuideCaseBase
from .strategy_case import RandomFeatureStrategyTestCase

__all__ = [
    "ConformanceMLP",
    "GuideCaseBase",
    "LocalLatentMLP",
    "RandomFeatureStrategyTestCase",
    "StructuredGuideTestCase",
]

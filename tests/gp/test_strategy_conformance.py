"""Every random-feature GP configuration through the strategy conformance checks of
``pyro_whvi.testing.RandomFeatureStrategyTestCase``: a Gaussian or a WHVI posterior, mean-field or full."""

from __future__ import annotations

from pyro_whvi.testing import RandomFeatureStrategyTestCase

from .test_gp_model import _float64_model


class TestGaussianDiagonal(RandomFeatureStrategyTestCase):
    design_is_features = True

    def make_model(self, seed: int = 0):
        return _float64_model("gaussian", "diagonal", seed)


class TestGaussianFull(RandomFeatureStrategyTestCase):
    design_is_features = True

    def make_model(self, seed: int = 0):
        return _float64_model("gaussian", "full", seed)


class TestWHVIDiagonal(RandomFeatureStrategyTestCase):
    def make_model(self, seed: int = 0):
        return _float64_model("whvi", "diagonal", seed)


class TestWHVIFull(RandomFeatureStrategyTestCase):
    def make_model(self, seed: int = 0):
        return _float64_model("whvi", "full", seed)

"""Every guide configuration through the conformance checks of ``pyro_whvi.testing.StructuredGuideTestCase``:
AutoWHVIGuide with each covariance, with planar flows and with the paper's preset; AutoVSDGuide with each of
``VSD_OPTIONS`` (plain and hierarchical); Pyro's AutoNormal initialized by I-BLM."""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from pyro.infer.autoguide import AutoNormal

from pyro_whvi import AutoVSDGuide, AutoWHVIGuide, iblm_
from pyro_whvi.infer._guide_utils import deep_getattr
from pyro_whvi.testing import StructuredGuideTestCase

from ..helpers import GUIDES, VSD_OPTIONS

WHVI = frozenset({"whvi_s1", "whvi_s2", "locs", "scales"})


class TestWHVIDiagonal(StructuredGuideTestCase):
    structured_groups = WHVI

    def make_guide(self, model):
        return GUIDES["whvi"](model)


class TestWHVIFull(StructuredGuideTestCase):
    structured_groups = frozenset({"whvi_s1", "whvi_s2", "locs", "scale_trils"})

    def make_guide(self, model):
        return GUIDES["whvi-full"](model)


class TestWHVILowRank(StructuredGuideTestCase):
    structured_groups = WHVI | {"cov_factors"}

    def make_guide(self, model):
        return GUIDES["whvi-lowrank"](model)


class TestWHVIPlanarFlows(StructuredGuideTestCase):
    structured_groups = WHVI | {"flows"}

    def make_guide(self, model):
        return AutoWHVIGuide(model, flows=3)  # a longer chain than GUIDES["nf-whvi"]'s two


class TestWHVIPaperPreset(StructuredGuideTestCase):
    """Biases under WHVI too (vectors on a square block), the last layer mean-field."""

    structured_groups = WHVI

    def make_guide(self, model):
        return GUIDES["whvi-paper"](model)


class VSDTestCase(StructuredGuideTestCase):
    """AutoVSDGuide with ``options``: Theta and alpha per site, Householder vectors unless ``reflections=0``,
    and the hierarchical model's q(z)."""

    options: ClassVar[dict] = {}

    @property
    def structured_groups(self):
        groups = {"vsd_theta", "vsd_alpha"}
        if self.options.get("reflections", 1):
            groups.add("vsd_householder")
        if self.options.get("hierarchical"):
            groups |= {"vsd_z_loc", "vsd_z_scale"}
        return frozenset(groups)

    def make_guide(self, model):
        return AutoVSDGuide(model, **self.options)

    def may_stay(self, guide, name):
        """With ``hidden_rank``, ``v_t = FC_t(v_(t-1))`` goes through a ReLU bottleneck: when all its units are
        off for ``v_(t-1)`` (each is at init with probability about 1/2), the bottleneck's first layer and
        second-layer weight get no gradient, and ``v_t`` is its second-layer bias alone. Those parameters get
        no gradient if and only if every unit of that bottleneck is off."""
        found = re.fullmatch(r"vsd_householder\.(.+)\.steps\.(\d+)\.(0\.weight|0\.bias|2\.weight)_unconstrained", name)
        if found is None or self.options.get("hidden_rank") is None:
            return False
        vectors, step = deep_getattr(guide.vsd_householder, found.group(1)), int(found.group(2))
        with torch.no_grad():
            previous = vectors()[step]  # row t-1 is v_t: v_(step + 1), the input of steps[step]
            return bool((vectors.steps[step][0](previous) <= 0).all())


class TestVSDNoReflection(VSDTestCase):
    options = VSD_OPTIONS["T0"]


class TestVSDOneReflection(VSDTestCase):
    options = VSD_OPTIONS["T1"]


class TestVSDTwoReflections(VSDTestCase):
    options = VSD_OPTIONS["T2"]


class TestVSDLowRankHouseholder(VSDTestCase):
    options = VSD_OPTIONS["lowrank"]


class TestVSDHierarchical(VSDTestCase):
    options = VSD_OPTIONS["hierarchical"]


class TestVSDHierarchicalGamma(VSDTestCase):
    options = VSD_OPTIONS["hierarchical-gamma"]


class TestAutoNormalFromIBLM(StructuredGuideTestCase):
    """Pyro's AutoNormal, initialized by I-BLM: no structured site, every parameter mean-field."""

    def make_guide(self, model):
        return AutoNormal(model)

    def initialize(self, guide, data):
        iblm_(guide, data, batch_size=self.num_data)

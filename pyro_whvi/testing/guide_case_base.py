"""The hooks and helpers of the guide conformance base (:mod:`~pyro_whvi.testing.guide_case`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoGuide
from pyro.optim import PyroOptim
from torch import Tensor

from .conformance_models import ConformanceMLP, parameter_groups

__all__ = ["GuideCaseBase"]


class GuideCaseBase:
    """The hooks and helpers of :class:`~pyro_whvi.testing.StructuredGuideTestCase`: a subclass implements
    :meth:`make_guide` and sets ``structured_groups``; it may override :meth:`make_model`, :meth:`make_data`,
    :meth:`initialize` (e.g. I-BLM), :meth:`may_stay`, ``unsupported_elbos`` and the sizes below.

    Every configuration of the library trains with all three ELBOs (checked: none needs ``unsupported_elbos``).
    Each test runs in float64, with Pyro's validation on, seed 0 and an empty param store (an autouse fixture)."""

    #: Parameter groups (the guide's attribute holding them, e.g. ``"whvi_s1"``, ``"vsd_theta"``) that each
    #: structured site must have parameters in; empty for a guide without structured sites.
    structured_groups: frozenset[str] = frozenset()
    #: ELBO name -> (exception type, regex) for ELBOs the guide legitimately cannot train with.
    unsupported_elbos: ClassVar[dict[str, tuple[type[BaseException], str]]] = {}
    widths = (4, 8, 8, 1)
    num_data = 32
    batch_size = 8  # minibatches: num_data / batch_size of them in the partition check
    num_samples = 5  # Predictive draws
    steps = 10  # SVI steps before parameters must have moved
    lr = 0.01

    @pytest.fixture(autouse=True)
    def _environment(self) -> Iterator[None]:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        pyro.set_rng_seed(0)
        pyro.clear_param_store()
        try:
            with pyro.validation_enabled(True):
                yield
        finally:
            torch.set_default_dtype(previous)

    # -- the hooks -------------------------------------------------------------------------------

    def make_model(self) -> ConformanceMLP:
        return ConformanceMLP(list(self.widths))

    def make_data(self) -> tuple[Tensor, Tensor]:
        """The same regression data on every call (its own generator), in the default dtype."""
        generator = torch.Generator().manual_seed(1234)
        x = torch.randn(self.num_data, self.widths[0], generator=generator)
        y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(self.num_data, generator=generator)
        return x, y

    def make_guide(self, model: ConformanceMLP) -> AutoGuide:
        """A new guide for ``model``, not yet called."""
        raise NotImplementedError

    def initialize(self, guide: AutoGuide, data: tuple[Tensor, Tensor]) -> None:
        """Initialize a new guide's parameters before training (e.g. ``iblm_``); a guide that is about to
        load a saved state is not initialized. Default: the guide's own initialization."""

    def may_stay(self, guide: AutoGuide, name: str) -> bool:
        """Whether guide parameter ``name`` gets no gradient at the guide's present values, for a reason the
        subclass checks on ``guide``: it may then keep its initial value under SVI if this holds both before
        and after training. Default: no parameter may."""
        return False

    # -- helpers ---------------------------------------------------------------------------------

    def structured_sites(self, guide: AutoGuide) -> dict[str, set[str]]:
        """Each structured site, with the names its parameters are filed under in the guide (the site's
        own, and the guide's site for it, e.g. ``"layers.0.weight_whvi_g"``)."""
        sites = getattr(guide, "structured_sites", None) or {}
        return {site: {site, guide.guide_site(site)} for site in sites}

    def site_parameters(self, guide: AutoGuide) -> dict[str, dict[str, Tensor]]:
        """``{structured site: {parameter name: parameter}}`` from ``guide.named_parameters()``."""
        parameters = dict(guide.named_parameters())
        result: dict[str, dict[str, Tensor]] = {}
        for site, keys in self.structured_sites(guide).items():
            result[site] = {}
            for name, value in parameters.items():
                _, rest = parameter_groups(name)
                if any(rest == key or rest.startswith(key + ".") for key in keys):
                    result[site][name] = value
        return result

    def _setup(self):
        model = self.make_model()
        guide = self.make_guide(model)
        x, y = self.make_data()
        self.initialize(guide, (x, y))
        guide(x, y)
        return model, guide, x, y

    def _svi(self, model, guide, elbo=None, optim=None) -> SVI:
        return SVI(model, guide, optim or PyroOptim(torch.optim.Adam, {"lr": self.lr}), elbo or Trace_ELBO())

    def _return_sites(self, model, guide, x, y) -> dict[str, torch.Size]:
        """Every site Predictive is asked for, with its shape in one execution of the model."""
        trace = poutine.trace(model).get_trace(x, y)
        latent = [name for name, _ in guide.prototype_trace.iter_stochastic_nodes()]
        names = [*latent, *self.structured_sites(guide), "f", "obs"]
        return {name: trace.nodes[name]["value"].shape for name in dict.fromkeys(names)}

    def _predict(self, model, guide, x, sites, seed: int = 7) -> dict[str, Tensor]:
        pyro.set_rng_seed(seed)
        return Predictive(model, guide=guide, num_samples=self.num_samples, return_sites=list(sites))(x)

"""The base of the structured guides: the model transformed in place, and the mean-field Normal they
give every site they do not take.

The mean-field part is as :class:`~pyro.infer.autoguide.AutoNormal`: a Normal in unconstrained
space per latent site, plates and subsampling included, with the scale initialized relative to the
prior's. A subclass implements the hooks :class:`~pyro_whvi.infer.ModelTransform` calls
(``select_sites``, ``structured_sites``, ``auxiliary_model_sites``, ``replace_model_site``) and
``_init_structured_parameters``.
"""

from __future__ import annotations

import warnings
from contextlib import ExitStack

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.distributions.util import sum_rightmost
from pyro.infer.autoguide import AutoGuide
from pyro.infer.autoguide.utils import helpful_support_errors
from pyro.nn import PyroModule, PyroParam
from pyro.ops.tensor_utils import periodic_repeat
from torch.distributions import biject_to

from ._guide_utils import deep_getattr, deep_set_param, normal_quantiles, prior_stddev
from .lazy_weight import check_example_dim
from .model_transform import ModelTransform, SiteFilter, select_sites

__all__ = ["StructuredAutoGuide"]


class StructuredAutoGuide(AutoGuide):
    """``AutoGuide`` over the model it transforms; ``self.locs``/``self.scales``: a mean-field Normal per other site.

    ``guide.model`` is the user's model object itself (transformed in place, see
    :mod:`pyro_whvi.infer.model_transform`).
    """

    scale_constraint = constraints.softplus_positive
    locs: PyroModule
    scales: PyroModule
    _init_scale: float
    _in_setup: bool
    _expose: SiteFilter | None
    _hide: SiteFilter | None
    model_site_shapes: dict | None
    model_transform: ModelTransform
    example_dim: int
    strict: bool

    def __init__(self, model, *, example_dim: int = 0, strict: bool = False, create_plates=None):
        self.example_dim = check_example_dim(example_dim, type(self).__name__)
        self.strict = bool(strict)
        super().__init__(model, create_plates=create_plates)
        self.model_transform = ModelTransform(model, self)

    @property
    def structured_sites(self) -> dict | None:
        raise NotImplementedError

    def _selected_sites(self) -> dict:
        """The structured sites, or a clear error before the first call chose them."""
        sites = self.structured_sites
        if sites is None:
            raise RuntimeError(
                f"{type(self).__name__}: the weight sites are chosen on the first call of the guide or the model."
            )
        return sites

    def _require_prototype(self, what: str) -> None:
        if self.prototype_trace is None:
            raise RuntimeError(f"{type(self).__name__}.{what}: call the guide once (or train it) first.")

    def _require_site(self, weight_site: str, what: str) -> None:
        """A clear error unless the guide is set up and ``weight_site`` is one of its structured sites."""
        self._require_prototype(what)
        sites = self._selected_sites()
        if weight_site not in sites:
            raise KeyError(
                f"{weight_site!r} is not a weight site of this {type(self).__name__}; sites: {sorted(sites)}."
            )

    @torch.no_grad()
    def median(self, *args, num_samples: int = 1000, **kwargs) -> dict:
        """Posterior medians of every latent site, and of each structured weight under its own name."""
        return {name: value[0] for name, value in self.quantiles([0.5], num_samples=num_samples).items()}

    def _trace_and_select(
        self, original_model, args, kwargs, *, check_site, is_default, mean_field_last_layer=False
    ) -> dict:
        """Trace the user's model once: record its sample-site shapes, return the selected weight sites."""
        self.model_site_shapes, sites = select_sites(
            original_model,
            args,
            kwargs,
            expose=self._expose,
            hide=self._hide,
            mean_field_last_layer=mean_field_last_layer,
            check_site=check_site,
            is_default=is_default,
            guide_name=type(self).__name__,
        )
        if not sites:
            warnings.warn(
                f"{type(self).__name__}: no weight site was selected (every latent site gets a mean-field Normal). "
                "Weights need a real prior with the whole matrix as one event, e.g. "
                "dist.Normal(0., 1.).expand([out, in]).to_event(2), or name them with expose=.",
                UserWarning,
                stacklevel=3,
            )
        return sites

    def guide_site(self, weight_site: str) -> str:
        """The site this guide samples for a structured weight site (marked with ``GUIDE_KEY``)."""
        raise NotImplementedError

    def _sample_structured(self, name: str, sampled: dict) -> torch.Tensor | None:
        """Sample site ``name`` if the guide structures it (``sampled``: the values so far), else ``None``."""
        raise NotImplementedError

    def forward(self, *args, **kwargs):
        """Sample every latent site of the transformed model; returns ``{site: value}``."""
        self.model_transform.check_attached()
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        plates = self._create_plates(*args, **kwargs)
        result: dict = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            value = self._sample_structured(name, result)
            result[name] = value if value is not None else self._sample_mean_field(name, site, plates)
        return result

    def _init_structured_parameters(self) -> None:
        """Create the parameters of every site (structured and mean-field) from ``self.prototype_trace``."""
        raise NotImplementedError

    def _setup_prototype(self, *args, **kwargs):
        if self.structured_sites is None:
            self.model_transform.select(args, kwargs)
        self._in_setup = True  # the transformed model applies init_loc_fn while the prototype is traced
        try:
            super()._setup_prototype(*args, **kwargs)
        finally:
            self._in_setup = False
        self._event_dims: dict[str, int] = {}
        self.locs = PyroModule()
        self.scales = PyroModule()
        self._init_structured_parameters()

    def _init_mean_field(self, name: str, site: dict) -> None:
        with helpful_support_errors(site):
            init_loc = biject_to(site["fn"].support).inv(site["value"].detach()).detach()
        event_dim = site["fn"].event_dim + init_loc.dim() - site["value"].dim()
        self._event_dims[name] = event_dim
        for frame in site["cond_indep_stack"]:
            full_size = frame.full_size or frame.size
            if full_size != frame.size:
                init_loc = periodic_repeat(init_loc, full_size, frame.dim - event_dim).contiguous()
        deep_set_param(self.locs, name, PyroParam(init_loc, constraints.real, event_dim))
        init_scale = torch.full_like(init_loc, self._init_scale) * prior_stddev(site["fn"], init_loc)
        deep_set_param(self.scales, name, PyroParam(init_scale, self.scale_constraint, event_dim))

    def _sample_mean_field(self, name: str, site: dict, plates: dict) -> torch.Tensor:
        transform = biject_to(site["fn"].support)
        with ExitStack() as stack:
            for frame in site["cond_indep_stack"]:
                if frame.vectorized:
                    stack.enter_context(plates[frame.name])
            loc, scale = deep_getattr(self.locs, name), deep_getattr(self.scales, name)
            unconstrained = pyro.sample(
                name + "_unconstrained",
                dist.Normal(loc, scale).to_event(self._event_dims[name]),
                infer={"is_auxiliary": True},
            )
            value = transform(unconstrained)
            if poutine.get_mask() is False:
                log_density = 0.0
            else:
                log_density = transform.inv.log_abs_det_jacobian(value, unconstrained)
                log_density = sum_rightmost(log_density, log_density.dim() - value.dim() + site["fn"].event_dim)
            return pyro.sample(name, dist.Delta(value, log_density=log_density, event_dim=site["fn"].event_dim))

    def _mean_field_quantiles(self, name: str, site: dict, levels: torch.Tensor) -> torch.Tensor:
        loc, scale = deep_getattr(self.locs, name), deep_getattr(self.scales, name)
        return biject_to(site["fn"].support)(normal_quantiles(loc, scale, levels))

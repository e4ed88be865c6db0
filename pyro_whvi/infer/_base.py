"""The base of the structured guides: Pyro's :class:`~pyro.infer.autoguide.AutoNormal` for every site they do
not take, over the model they transform in place.

The mean-field part is ``AutoNormal``'s: a Normal in unconstrained space per latent site, in
``self.locs`` / ``self.scales``, plates and subsampling included. Inherited from ``AutoNormal`` as it is:
``_get_loc_and_scale``, ``scale_constraint``, ``_create_plates``, the ``locs``/``scales`` containers and their
parameter names, and ``isinstance(guide, AutoNormal)``. Replaced: the prototype set-up, ``forward``, ``median``
and ``quantiles``, because two things differ: the sites a subclass structures get its parameters instead, and
a real-valued site's scale starts relative to its prior's. ``AutoNormal`` has no per-site hooks, so its
per-site initialization and draw are written again here, and one loop draws every site in the prototype
trace's order, structured ones included (the order fixes the random stream).

It stays a subclass, not a composition of Pyro's pieces, so that seeded runs, parameter names and
prior-relative initial scales stay as they are (the argument: ``docs/development.md``, "The structured
guides"); the transform's contract is :class:`~pyro_whvi.infer.guide_contract.TransformingGuide`.

A subclass implements the hooks :class:`~pyro_whvi.infer.ModelTransform` calls (``select_sites``,
``structured_sites``, ``auxiliary_model_sites``, ``replace_model_site``), ``_init_structured_parameters``,
``_sample_structured``, ``_structured_quantiles``, and, for its structured sites, the guide protocol of
:mod:`pyro_whvi.init` (``_set_structured_gaussian_``, ``_set_structured_isotropic_``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from contextlib import ExitStack

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.distributions.util import sum_rightmost
from pyro.infer.autoguide import AutoGuide, AutoNormal
from pyro.infer.autoguide.utils import helpful_support_errors
from pyro.nn import PyroModule, PyroParam
from pyro.ops.tensor_utils import periodic_repeat
from torch import Tensor
from torch.distributions import biject_to

from ..distributions.whvi_matrix import has_real_support
from ._guide_utils import assign_param_, deep_getattr, deep_set_param, has_deep_attr, normal_quantiles, prior_stddev
from .lazy_weight import check_example_dim
from .model_transform import ModelTransform
from .site_selection import SiteFilter, select_sites

__all__ = ["StructuredAutoGuide", "set_mean_field_gaussian_", "set_mean_field_isotropic_"]


class StructuredAutoGuide(AutoNormal):
    """``AutoNormal`` for the sites a subclass does not structure, over the model it transforms.

    ``guide.model`` is the user's model object itself (transformed in place, see
    :mod:`pyro_whvi.infer.model_transform`).
    """

    locs: PyroModule
    scales: PyroModule
    init_loc_fn: Callable
    _init_scale: float
    _expose: SiteFilter | None
    _hide: SiteFilter | None
    model_site_shapes: dict | None
    model_transform: ModelTransform
    example_dim: int
    strict: bool

    def __init__(self, model, *, example_dim: int = 0, strict: bool = False, create_plates=None):
        """A subclass sets ``init_loc_fn``, ``_init_scale``, ``_expose`` and ``_hide`` first."""
        self.example_dim = check_example_dim(example_dim, type(self).__name__)
        self.strict = bool(strict)
        self.model_site_shapes = None
        self._in_setup = False
        super().__init__(model, init_loc_fn=self.init_loc_fn, init_scale=self._init_scale, create_plates=create_plates)
        # AutoNormal wraps the model in InitMessenger(init_loc_fn). Ours stays the user's object, transformed in
        # place, and the transform applies init_loc_fn itself while the prototype is traced.
        self._model = (model,)
        self.model_transform = ModelTransform(model, self)

    @property
    def structured_sites(self) -> dict | None:
        raise NotImplementedError

    @property
    def _sites(self) -> dict:
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
        sites = self._sites
        if weight_site not in sites:
            raise KeyError(
                f"{weight_site!r} is not a weight site of this {type(self).__name__}; sites: {sorted(sites)}."
            )

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

    @property
    def in_setup(self) -> bool:
        """Whether the guide is tracing its prototype now (``TransformingGuide.in_setup``)."""
        return self._in_setup

    def guide_site(self, weight_site: str) -> str:
        """The site this guide samples for a structured weight site (marked with ``GUIDE_KEY``)."""
        raise NotImplementedError

    # -- prototype and parameters ----------------------------------------------------------------

    def _setup_prototype(self, *args, **kwargs):
        if self.structured_sites is None:
            self.model_transform.select(args, kwargs)
        self._in_setup = True  # the transformed model applies init_loc_fn while the prototype is traced
        try:
            AutoGuide._setup_prototype(self, *args, **kwargs)  # not AutoNormal's: it would give every site a Normal
        finally:
            self._in_setup = False
        self._event_dims = {}
        self.locs = PyroModule()
        self.scales = PyroModule()
        self._init_structured_parameters()

    def _init_structured_parameters(self) -> None:
        """Create the parameters of every site (structured and mean-field) from ``self.prototype_trace``."""
        raise NotImplementedError

    def _init_mean_field(self, name: str, site: dict) -> None:
        """``AutoNormal``'s parameters for one site, the scale relative to the prior's (:func:`prior_stddev`)."""
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

    # -- sampling and summaries ------------------------------------------------------------------

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

    def _sample_structured(self, name: str, sampled: dict) -> Tensor | None:
        """Sample site ``name`` if the guide structures it (``sampled``: the values so far), else ``None``."""
        raise NotImplementedError

    def _sample_mean_field(self, name: str, site: dict, plates: dict) -> Tensor:
        """One site as ``AutoNormal.forward`` samples it; a real-valued one straight from its Normal: the same draw,
        value and ``Trace_ELBO``, one sample site instead of an auxiliary one and its ``Delta``."""
        transform = biject_to(site["fn"].support)
        with ExitStack() as stack:
            for frame in site["cond_indep_stack"]:
                if frame.vectorized:
                    stack.enter_context(plates[frame.name])
            loc, scale = self._get_loc_and_scale(name)
            posterior = dist.Normal(loc, scale).to_event(self._event_dims[name])
            if has_real_support(site["fn"]):
                return pyro.sample(name, posterior)
            unconstrained = pyro.sample(name + "_unconstrained", posterior, infer={"is_auxiliary": True})
            value = transform(unconstrained)
            if poutine.get_mask() is False:
                log_density = 0.0
            else:
                log_density = transform.inv.log_abs_det_jacobian(value, unconstrained)
                log_density = sum_rightmost(log_density, log_density.dim() - value.dim() + site["fn"].event_dim)
            return pyro.sample(name, dist.Delta(value, log_density=log_density, event_dim=site["fn"].event_dim))

    @torch.no_grad()
    def median(self, *args, num_samples: int = 1000, **kwargs) -> dict:
        """Posterior medians of every latent site, and of each structured weight under its own name."""
        return {name: value[0] for name, value in self.quantiles([0.5], num_samples=num_samples).items()}

    @torch.no_grad()
    def quantiles(self, quantiles: Iterable[float], *args, num_samples: int = 1000, **kwargs) -> dict:
        """Marginal quantiles of every latent site, and of each structured weight under its own name
        (how: :meth:`_structured_quantiles`; ``num_samples`` draws where they are Monte-Carlo estimates)."""
        self._require_prototype("quantiles/median")
        levels = torch.as_tensor(list(quantiles))
        result: dict = {}
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            structured = self._structured_quantiles(name, levels, num_samples)
            if structured is None:
                loc, scale = self._get_loc_and_scale(name)
                structured = {name: biject_to(site["fn"].support)(normal_quantiles(loc, scale, levels))}
            result.update(structured)
        return result

    def _structured_quantiles(self, name: str, levels: Tensor, num_samples: int) -> dict | None:
        """``{site: quantiles}`` for site ``name`` if the guide structures it, else ``None``."""
        raise NotImplementedError

    # -- the guide protocol of pyro_whvi.init (I-BLM, Xavier) --------------------------------------

    def set_site_gaussian_(
        self,
        site: str,
        mean: Tensor,
        precision: Tensor,
        *,
        data_precision: Tensor | None = None,
        data_rhs: Tensor | None = None,
    ) -> None:
        r"""Set ``q`` of ``site``, in place, to its family's approximation of a Gaussian over the site's value.

        :param mean: the Gaussian's mean, in the site's shape.
        :param precision: the diagonal of its precision, in the site's shape.
        :param data_precision: where the Gaussian is a posterior under the model's prior, its likelihood
            part: per output row, ``(R, F, F)`` over the row's ``F`` entries, or its diagonal in the site's shape.
        :param data_rhs: the likelihood's linear term (:math:`X^\top L^{-1} y`), in the site's shape.

        A mean-field site takes ``mean`` and the variances ``1 / precision``, the ``KL(q || p)`` optimum
        (I-BLM App. D), and ignores the likelihood part; a structured site, see the subclass's
        ``_set_structured_gaussian_``.
        """
        what = f"{type(self).__name__}.set_site_gaussian_({site!r})"
        if site in self._sites:
            self._set_structured_gaussian_(site, mean, precision, data_precision, data_rhs, what)
        else:
            set_mean_field_gaussian_(self, site, mean, precision, what)

    def set_site_isotropic_(self, site: str, variance: float) -> None:
        r"""Set ``q`` of ``site``, in place, to an uninformed start whose entries have variance ``variance``
        about zero, as far as its family allows: :math:`\mathcal{N}(0, \text{variance})` for a mean-field
        site; a structured site, see the subclass's ``_set_structured_isotropic_``."""
        what = f"{type(self).__name__}.set_site_isotropic_({site!r})"
        if site in self._sites:
            self._set_structured_isotropic_(site, variance, what)
        else:
            set_mean_field_isotropic_(self, site, variance, what)

    def _set_structured_gaussian_(
        self,
        site: str,
        mean: Tensor,
        precision: Tensor,
        data_precision: Tensor | None,
        data_rhs: Tensor | None,
        what: str,
    ) -> None:
        """:meth:`set_site_gaussian_` for a structured site; errors start with ``what``."""
        raise NotImplementedError

    def _set_structured_isotropic_(self, site: str, variance: float, what: str) -> None:
        """:meth:`set_site_isotropic_` for a structured site; errors start with ``what``."""
        raise NotImplementedError


def _mean_field_loc(guide: AutoNormal, site: str, what: str) -> Tensor:
    if not has_deep_attr(guide.locs, site):
        raise KeyError(f"{what}: {type(guide).__name__} has no mean-field parameters for this site.")
    return deep_getattr(guide.locs, site)


def set_mean_field_gaussian_(guide: AutoNormal, site: str, mean: Tensor, precision: Tensor, what: str) -> None:
    """Set the Normal an ``AutoNormal`` (or a structured guide's mean-field part) gives ``site`` to mean ``mean``
    and variances ``1 / precision``, in place. Errors start with ``what`` (which names the site)."""
    _mean_field_loc(guide, site, what)
    assign_param_(guide.locs, site, mean, what)
    assign_param_(guide.scales, site, precision.rsqrt(), what)


def set_mean_field_isotropic_(guide: AutoNormal, site: str, variance: float, what: str) -> None:
    """Set the Normal an ``AutoNormal`` (or a structured guide's mean-field part) gives ``site`` to
    :math:`\\mathcal{N}(0, \\text{variance})` per entry, in place. Errors start with ``what`` (which names the site)."""
    loc = _mean_field_loc(guide, site, what)
    assign_param_(guide.locs, site, loc.new_zeros(loc.shape), what)
    assign_param_(guide.scales, site, loc.new_full(loc.shape, variance**0.5), what)

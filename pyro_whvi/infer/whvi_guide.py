r"""``AutoWHVIGuide``: WHVI and NF-WHVI for any Pyro model, by swapping one guide.

Weight sites (by default every latent site whose event is a matrix with both sides > 1) are
reparameterized by :class:`~pyro_whvi.infer.WHVIReparam` into a latent ``g`` of ``K D`` entries;
``g`` gets a Gaussian guide (diagonal, full or low-rank covariance per block) or a diagonal Gaussian
through planar flows (NF-WHVI). Every other latent site gets a mean-field Normal, as in
:class:`~pyro.infer.autoguide.AutoNormal`. Train with Pyro's own machinery::

    guide = AutoWHVIGuide(model)
    svi = SVI(model, guide, Adam({"lr": 1e-3}), Trace_ELBO())

The guide transforms ``model`` in place (:mod:`pyro_whvi.infer.model_transform`): the same object goes to
``SVI``, ``Trace_ELBO()(model, guide)``, ``Predictive`` and ``iblm_``. In it, ``F.linear``/``F.conv2d``
on a WHVI weight draw ``g`` per example (local reparameterization), unless
``guide.local_reparameterization = False``.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020: §2.2–2.5, App. A–D.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pyro
import torch
from pyro.distributions import constraints
from pyro.distributions.transforms import Planar
from pyro.infer.autoguide import init_to_sample
from pyro.nn import PyroModule, PyroParam
from torch import nn

from .._moved import moved_names
from ..distributions import WHVILayout, WHVIMatrix, WHVINormal
from ..distributions.qg_family import COVARIANCES, NETWORK_CONVENTION, QG_CONSTRAINTS, QG_FIELDS, GaussianQG
from ..distributions.whvi_projection import fit_whvi_site
from ._base import StructuredAutoGuide
from ._guide_utils import (
    assign_param_,
    deep_getattr,
    deep_set_param,
    empirical_quantiles,
    has_deep_attr,
    is_default_whvi_weight,
    marginal_std,
    normal_quantiles,
    pyro_params_,
)
from .lazy_weight import local_reparameterization_enabled
from .model_transform import GUIDE_KEY
from .site_selection import SiteFilter, named_sites
from .whvi_reparam import POSTERIOR_KEY, WHVIReparam, check_whvi_site, g_site_name

__all__ = ["AutoWHVIGuide"]

#: The ``PyroModule`` holding each field of ``q(g)`` (:class:`GaussianQG`); ``<group>.<g site>`` is the
#: parameter's name in ``guide.state_dict()`` and the param store.
QG_GROUPS = {"loc": "locs", "scale": "scales", "scale_tril": "scale_trils", "cov_factor": "cov_factors"}


class _GuideOwnedReparam(WHVIReparam):
    """WHVIReparam whose ``s1``, ``s2`` live in the guide, so ``guide.state_dict()`` holds them."""

    def __init__(self, guide: AutoWHVIGuide):
        super().__init__(guide.prior_variance, example_dim=guide.example_dim, strict=guide.strict)
        self._guide = (guide,)

    def local_enabled(self) -> bool:
        return local_reparameterization_enabled(self._guide[0].local_reparameterization)

    def scales(self, name, layout, like):
        guide = self._guide[0]
        if not has_deep_attr(guide.whvi_s1, name):
            s1, s2 = NETWORK_CONVENTION.init_scales(layout.block_shape, self.prior_variance, like)
            deep_set_param(guide.whvi_s1, name, PyroParam(s1, constraints.real, event_dim=2))
            deep_set_param(guide.whvi_s2, name, PyroParam(s2, constraints.real, event_dim=2))
        # Inside the guide's context the access goes through pyro.param, so the model trace records
        # s1 and s2 and SVI optimizes them (outside it, PyroModule would return a bare tensor).
        with guide._pyro_context:
            return deep_getattr(guide.whvi_s1, name), deep_getattr(guide.whvi_s2, name)


class AutoWHVIGuide(StructuredAutoGuide):
    r"""WHVI / NF-WHVI guide for the weight sites of a Pyro model, mean-field Normal for the rest.

    :param model: a Pyro model (e.g. a ``PyroModule`` with ``PyroSample`` weight priors).
    :param prior_variance: :math:`\lambda` in the WHVI prior :math:`g \sim \mathcal{N}(0, \lambda I)`
        (default 1; see :mod:`pyro_whvi.infer.whvi_reparam` for why, and for the ``s1``/``s2`` init).
    :param covariance: ``q(g)`` per block: ``"diagonal"`` (:math:`O(D)` parameters, the paper's
        G-WHVI), ``"full"`` (:math:`O(D^2)`) or ``"lowrank"`` (diagonal plus rank ``rank``).
    :param rank: rank of the ``"lowrank"`` factor (default ``ceil(sqrt(D))``).
    :param flows: number of planar flows over each site's ``g`` (NF-WHVI, diagonal base).
    :param expose: sites to put under WHVI (names, a predicate, or ``"all"``: every real-valued
        site with at least two entries), replacing the default choice; vectors (reshaped onto a square
        block, §2.5) and conv filter banks are allowed here.
    :param hide: sites to keep out of WHVI (names or a predicate); they get the mean-field guide.
    :param mean_field_last_layer: give the last layer a mean-field guide, as in the paper's experiments
        (§3.2): every latent site of the module that holds the model's last weight (in execution
        order), its weight and bias together.
    :param sites: a named selection of the sites whose settings fill the arguments left unset
        (:data:`~pyro_whvi.infer.site_selection.NAMED_SITES`; ``"paper"``: ``expose="all"``,
        ``mean_field_last_layer=True``).
    :param preset: the deprecated name of ``sites`` (a ``DeprecationWarning``; removed in the next release).
    :param local_reparameterization: draw ``g`` per example in ``F.linear``/``F.conv2d`` (also
        settable later as ``guide.local_reparameterization``); one draw per example per model
        execution, shared by every use of the weight in it (:mod:`pyro_whvi.infer.lazy_weight`).
    :param example_dim: the dimension of a linear layer's input that indexes examples (0: the leading
        batch index; 1 for sequence-first ``(T, B, D)`` inputs).
    :param strict: an op on a WHVI weight that cannot use the per-example draws (``W.t()``,
        ``x @ W.T``, ``F.embedding``) raises instead of warning that it sees one shared draw.
    :param init_loc_fn: initialization of the mean-field sites (Pyro's strategies); the default, a
        draw from the prior, breaks the symmetry that zeros (``AutoNormal``'s default) leave in a network.
    :param init_scale: initial standard deviation, relative to the prior's: of ``q(g)`` in units of
        :math:`\sqrt{\lambda}`, of real-valued mean-field sites in units of their prior standard
        deviation, of other (constrained) sites in unconstrained space. ``g``'s mean starts at a prior draw.
    :param create_plates: as in Pyro's autoguides, for data subsampling.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2–2.5 (NF-WHVI: §2.5, App. C), App. D.1.
    """

    def __init__(
        self,
        model: Callable,
        *,
        prior_variance: float = 1.0,
        covariance: str = "diagonal",
        rank: int | None = None,
        flows: int = 0,
        expose: SiteFilter | None = None,
        hide: SiteFilter | None = None,
        mean_field_last_layer: bool | None = None,
        sites: str | None = None,
        preset: str | None = None,
        local_reparameterization: bool = True,
        example_dim: int = 0,
        strict: bool = False,
        init_loc_fn: Callable = init_to_sample,
        init_scale: float = 0.1,
        create_plates: Callable | None = None,
    ):
        settings = named_sites(sites, preset, "AutoWHVIGuide")
        if expose is None:
            expose = settings.get("expose")
        if mean_field_last_layer is None:
            mean_field_last_layer = settings.get("mean_field_last_layer", False)
        if covariance not in COVARIANCES:
            raise ValueError(f"AutoWHVIGuide: covariance must be one of {COVARIANCES}, got {covariance!r}.")
        if not isinstance(flows, int) or flows < 0:
            raise ValueError(f"AutoWHVIGuide: flows must be a non-negative int, got {flows!r}.")
        if flows and covariance != "diagonal":
            raise ValueError("AutoWHVIGuide: planar flows start from a diagonal Gaussian; use covariance='diagonal'.")
        if rank is not None and (covariance != "lowrank" or not isinstance(rank, int) or rank < 1):
            raise ValueError("AutoWHVIGuide: rank must be a positive int and goes with covariance='lowrank'.")
        if isinstance(init_scale, bool) or not (isinstance(init_scale, (int, float)) and init_scale > 0):
            raise ValueError(f"AutoWHVIGuide: init_scale must be a float > 0, got {init_scale!r}.")
        if not prior_variance > 0:
            raise ValueError(f"AutoWHVIGuide: prior_variance must be > 0, got {prior_variance!r}.")
        self.prior_variance = float(prior_variance)
        self.covariance, self.rank, self.num_flows = covariance, rank, flows
        self.local_reparameterization = local_reparameterization
        self.init_loc_fn, self._init_scale = init_loc_fn, float(init_scale)
        self._expose, self._hide, self._mean_field_last_layer = expose, hide, bool(mean_field_last_layer)
        self.whvi_layouts: dict[str, WHVILayout] | None = None
        super().__init__(model, example_dim=example_dim, strict=strict, create_plates=create_plates)
        self.whvi_s1, self.whvi_s2 = PyroModule(), PyroModule()
        self.reparam = _GuideOwnedReparam(self)

    # -- selection and model checks (used by ModelTransform) ----------------------------------

    def select_sites(self, original_model: Callable, *args, **kwargs) -> None:
        """Trace the original model once and fix which weight sites go under WHVI."""
        self.whvi_layouts = self._trace_and_select(
            original_model,
            args,
            kwargs,
            check_site=check_whvi_site,
            is_default=is_default_whvi_weight,
            mean_field_last_layer=self._mean_field_last_layer,
        )
        self._weight_of_g = {g_site_name(name): name for name in self.whvi_layouts}

    @property
    def structured_sites(self) -> dict[str, WHVILayout] | None:
        """The WHVI weight sites and their layouts (``None`` until the first call)."""
        return self.whvi_layouts

    def auxiliary_model_sites(self) -> set[str]:
        return {g_site_name(name) for name in self.whvi_layouts or {}}

    def replace_model_site(self, msg: dict) -> None:
        new_msg = self.reparam.apply({"name": msg["name"], "fn": msg["fn"], "value": None, "is_observed": False})
        msg["fn"], msg["value"], msg["is_observed"] = new_msg["fn"], new_msg["value"], new_msg["is_observed"]

    # -- prototype and parameters ----------------------------------------------------------------

    def _init_structured_parameters(self) -> None:
        for field in QG_FIELDS[self.covariance]:
            if QG_GROUPS[field] != "scales":  # ``locs`` and ``scales`` are the base's, shared with mean-field sites
                setattr(self, QG_GROUPS[field], PyroModule())
        if self.num_flows:
            self.flows = PyroModule()
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if name in self._weight_of_g:
                self._init_g(name, site["value"])
            else:
                self._init_mean_field(name, site)

    def _init_g(self, name: str, like: torch.Tensor) -> None:
        layout: WHVILayout = self._sites[self._weight_of_g[name]]
        root_lambda = self.prior_variance**0.5
        loc = root_lambda * torch.randn(tuple(layout.block_shape), dtype=like.dtype, device=like.device)
        rank = (self.rank or math.ceil(layout.block_size**0.5)) if self.covariance == "lowrank" else None
        initial = GaussianQG.isotropic(
            self.covariance, loc, self._init_scale * root_lambda, rank=rank, factor_scale=0.1
        )
        for field, value in initial.fields().items():
            param = PyroParam(value, QG_CONSTRAINTS[field], event_dim=value.dim())
            deep_set_param(getattr(self, QG_GROUPS[field]), name, param)
        if self.num_flows:
            chain = [PyroModule[Planar](layout.num_latent) for _ in range(self.num_flows)]  # type: ignore[arg-type]
            planars = PyroModule[nn.ModuleList](chain)  # type: ignore[arg-type]
            deep_set_param(self.flows, name, pyro_params_(planars.to(dtype=like.dtype, device=like.device)))

    # -- distributions ---------------------------------------------------------------------------

    def qg(self, weight_site: str) -> GaussianQG:
        """The Gaussian part of ``q(g)`` of a WHVI weight site (the base of the flows, if any), blocks ``(K, D)``."""
        name = g_site_name(weight_site)
        fields = {
            field: deep_getattr(getattr(self, QG_GROUPS[field]), name) for field in ("loc", *QG_FIELDS[self.covariance])
        }
        return GaussianQG(self.covariance, **fields)

    def set_qg_(self, weight_site: str, qg: GaussianQG, what: str = "set_qg_") -> None:
        """Overwrite ``q(g)`` of a WHVI weight site in place with ``qg`` (of the guide's kind; flows are kept)."""
        if qg.kind != self.covariance:
            raise ValueError(f"{what}: the guide's q(g) is {self.covariance!r}, got a {qg.kind!r} one.")
        name = g_site_name(weight_site)
        for field, value in qg.fields().items():
            assign_param_(getattr(self, QG_GROUPS[field]), name, value, what)

    def get_posterior(self, weight_site: str):
        """``q(g)`` of a WHVI weight site, event shape ``(K, D)``."""
        qg = self.qg(weight_site)
        flows = list(deep_getattr(self.flows, g_site_name(weight_site))) if self.num_flows else None
        return qg.distribution(flows)

    def weight_distribution(self, weight_site: str) -> WHVIMatrix:
        """``q(W)`` of a WHVI weight site: :class:`WHVINormal` for Gaussian ``q(g)``, else :class:`WHVIMatrix`."""
        self._require_site(weight_site, "weight_distribution")
        s1, s2 = deep_getattr(self.whvi_s1, weight_site), deep_getattr(self.whvi_s2, weight_site)
        cls = WHVIMatrix if self.num_flows else WHVINormal
        return cls(s1, s2, self.get_posterior(weight_site), self._sites[weight_site].shape)

    def _sample_structured(self, name, sampled):
        if name not in self._weight_of_g:
            return None
        posterior = self.get_posterior(self._weight_of_g[name])
        return pyro.sample(name, posterior, infer={POSTERIOR_KEY: posterior, GUIDE_KEY: True})

    def guide_site(self, weight_site: str) -> str:
        return g_site_name(weight_site)

    def _structured_quantiles(self, name, levels, num_samples):
        """Quantiles of a ``g`` site and its weight: exact for Gaussian ``q(g)``, ``num_samples`` draws with flows."""
        if name not in self._weight_of_g:
            return None
        weight_site = self._weight_of_g[name]
        posterior, weights = self.get_posterior(weight_site), self.weight_distribution(weight_site)
        if self.num_flows:
            draws = posterior.rsample((num_samples,)), weights.rsample((num_samples,))
            return {name: empirical_quantiles(draws[0], levels), weight_site: empirical_quantiles(draws[1], levels)}
        return {
            name: normal_quantiles(posterior.mean, marginal_std(posterior), levels),
            weight_site: normal_quantiles(weights.mean, weights.stddev, levels),
        }

    def _set_structured_gaussian_(self, site, mean, precision, data_precision, data_rhs, what) -> None:
        """``s1``, ``s2`` from projecting ``mean`` onto the WHVI form, ``q(g)`` the posterior of the likelihood
        part under ``g``'s prior (:func:`~pyro_whvi.distributions.whvi_projection.fit_whvi_site`)."""

        s1, s2 = deep_getattr(self.whvi_s1, site).detach(), deep_getattr(self.whvi_s2, site).detach()
        layout, like = self._sites[site], self.qg(site)
        s1, s2, qg = fit_whvi_site(layout, s1, s2, self.prior_variance, like, mean, data_precision, data_rhs, what)
        assign_param_(self.whvi_s1, site, s1, what)
        assign_param_(self.whvi_s2, site, s2, what)
        self.set_qg_(site, qg, what)

    def _set_structured_isotropic_(self, site, variance, what) -> None:
        r"""``s1``, ``s2`` kept, :math:`q(g) = \mathcal{N}(0, \sigma^2 I)` with the :math:`\sigma` that gives the
        entries, :math:`\operatorname{Var} W_{ij} = s_{1,i}^2 s_{2,j}^2 \sigma^2 / D`, the variance on average."""
        s1, s2 = deep_getattr(self.whvi_s1, site).detach(), deep_getattr(self.whvi_s2, site).detach()
        sigma = (variance * s1.shape[-1] / (s1.pow(2).mean() * s2.pow(2).mean())).sqrt()
        qg = GaussianQG.isotropic(self.covariance, torch.zeros_like(s1), sigma, rank=self.qg(site).rank)
        self.set_qg_(site, qg, what)


__getattr__ = moved_names(
    __name__,
    {"PRESETS": "pyro_whvi.infer.site_selection", "NAMED_SITES": "pyro_whvi.infer.site_selection"},
)

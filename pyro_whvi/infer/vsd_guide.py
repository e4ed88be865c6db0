r"""``AutoVSDGuide``: Variational Structured Dropout for any Pyro model, by swapping one guide.

Every selected weight site (by default each real weight matrix with more than one input and each
convolution filter bank) becomes :math:`W = \operatorname{diag}(\xi) \Theta` with
:math:`\xi \sim \mathcal{N}(1, U \operatorname{diag}(\alpha) U^\top)`, :math:`U = H_T \cdots H_1`;
:math:`\Theta`, :math:`\alpha` and the Householder vectors are learned, and the site's KL is the
empirical-Bayes one of eq. (6), independent of :math:`\Theta`. Every other latent site gets a
mean-field Normal. Train with Pyro's own machinery::

    guide = AutoVSDGuide(model, reflections=2)
    svi = SVI(model, guide, Adam({"lr": 1e-3}), Trace_ELBO())

The guide transforms ``model`` in place, replacing the VSD sites' priors (see
:mod:`pyro_whvi.infer.vsd_reparam` and :mod:`pyro_whvi.infer.model_transform`). In it ``F.linear`` multiplies each
example's inputs by its own draw of :math:`\xi`, and ``F.conv2d`` each image's output channels: one
draw per example, as dropout, and no noisy weight is formed.

References:
    S. Nguyen, D. Nguyen, K. Nguyen, K. Than, H. Bui, N. Ho. *Structured Dropout Variational
    Inference for Bayesian Neural Networks*. NeurIPS 2021: §3.1–3.4, App. B–D, App. I.1.
"""

from __future__ import annotations

from collections.abc import Callable

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide import init_to_sample
from pyro.nn import PyroModule, PyroParam
from torch import Tensor, nn

from ..distributions.empirical_bayes import vsd_hierarchical_kl, vsd_kl
from ..distributions.householder import StructuredDropoutNoise, fit_vsd_alpha
from ._base import StructuredAutoGuide
from ._guide_utils import (
    assign_param_,
    deep_getattr,
    deep_set_param,
    empirical_quantiles,
    like_tensor,
    normal_quantiles,
    pyro_params_,
)
from .lazy_weight import local_reparameterization_enabled
from .model_transform import GUIDE_KEY
from .site_selection import SiteFilter
from .vsd_reparam import (
    EmpiricalBayesPrior,
    VSDPosterior,
    VSDSite,
    check_vsd_site,
    is_default_vsd_site,
    z_prior,
    z_site_name,
)
from .vsd_weight import scale_along

__all__ = ["AutoVSDGuide", "HouseholderVectors"]

Z_PRIORS = ("inverse_gamma", "gamma")


class HouseholderVectors(nn.Module):
    r"""The Householder vectors of one site: :math:`v_1` free, :math:`v_t = \mathrm{FC}_t(v_{t-1})`, ``t = 2..T``.

    ``FC_t`` is a full ``K x K`` affine layer, or with ``hidden_rank = r`` a ``K -> r -> K`` ReLU
    bottleneck (``O(r K)`` parameters, App. D). In the Householder flow VSD builds on (Tomczak &
    Welling, 2016) :math:`v_1` comes from an encoder; with no encoder it is a free parameter here (an
    FC in front of it would add ``K^2`` parameters without changing the reachable ``U``).
    """

    def __init__(self, size: int, reflections: int, hidden_rank: int | None, like: Tensor):
        super().__init__()
        self.size, self.reflections = size, reflections
        if reflections:
            self.first = nn.Parameter(torch.randn(size, dtype=like.dtype, device=like.device))
        else:  # U = I: no parameters, only the dtype and device of the empty (0, K) result
            self.register_buffer("empty", like.new_zeros(0, size))
        steps = []
        for _ in range(max(reflections - 1, 0)):
            if hidden_rank is None:
                step: nn.Module = nn.Linear(size, size)
            else:
                step = nn.Sequential(nn.Linear(size, hidden_rank), nn.ReLU(), nn.Linear(hidden_rank, size))
            steps.append(step.to(dtype=like.dtype, device=like.device))
        self.steps = nn.ModuleList(steps)

    def forward(self) -> Tensor:
        """``(T, K)``; row ``t-1`` is :math:`v_t` (``T = 0``: an empty ``(0, K)``)."""
        if self.reflections == 0:
            return self.get_buffer("empty")
        vectors: list[Tensor] = [self.first]
        for step in self.steps:
            vectors.append(step(vectors[-1]))
        return torch.stack(vectors)


class AutoVSDGuide(StructuredAutoGuide):
    r"""Variational Structured Dropout for the weight sites of a Pyro model, mean-field Normal for the rest.

    :param model: a Pyro model (e.g. a ``PyroModule`` with ``PyroSample`` weight priors).
    :param reflections: ``T``, the number of Householder reflections (``0``: ``U = I``, Gaussian
        dropout with the empirical-Bayes KL; the paper recommends 1 or 2).
    :param hidden_rank: ``r`` of the ReLU bottleneck between successive Householder vectors
        (``None``: a full ``K x K`` layer); with ``T >= 2`` it must not exceed any site's ``K``.
    :param init_alpha: initial :math:`\alpha` (``p / (1 - p)`` for a dropout rate ``p``); learned in
        log space, unbounded (no clipping is needed, unlike variational dropout).
    :param hierarchical: add per-row scales ``z`` (§3.3): :math:`W = \operatorname{diag}(z \odot \xi)\Theta`,
        a ``z`` site with prior ``z_prior`` in the model and a log-normal ``q(z)`` in the guide.
    :param z_prior: ``(kind, concentration, rate)`` with kind ``"inverse_gamma"`` or ``"gamma"``
        (default ``InverseGamma(3, 2)``: mean 1, variance 1).
    :param expose: sites to put under VSD (names, a predicate, or ``"all"``), replacing the default.
    :param hide: sites to keep out of VSD (they get the mean-field guide).
    :param local_reparameterization: one noise draw per example in ``F.linear``/``F.conv2d``
        (also settable later as ``guide.local_reparameterization``), per model execution, shared by
        every use of the weight in it (:mod:`pyro_whvi.infer.lazy_weight`).
    :param example_dim: the dimension of a linear layer's input that indexes examples (0: the leading
        batch index; 1 for sequence-first ``(T, B, D)`` inputs).
    :param strict: an op on a VSD weight that cannot use the per-example draws raises instead of warning.
    :param init_loc_fn: initialization of :math:`\Theta` and of the mean-field sites (Pyro's strategies).
    :param init_scale: initial standard deviation of the mean-field sites relative to the prior's.
    :param create_plates: as in Pyro's autoguides, for data subsampling.

    Parameters live in ``guide.vsd_theta``, ``guide.vsd_alpha`` (constrained positive: Pyro
    optimizes its logarithm), ``guide.vsd_householder``, and for the hierarchical model
    ``guide.vsd_z_loc``/``guide.vsd_z_scale``.

    References:
        VSD paper (Nguyen et al., NeurIPS 2021), §3.1–3.4 (eq. 6, 14–15), App. B–D, App. I.1.
    """

    def __init__(
        self,
        model: Callable,
        *,
        reflections: int = 1,
        hidden_rank: int | None = None,
        init_alpha: float = 0.25,
        hierarchical: bool = False,
        z_prior: tuple[str, float, float] = ("inverse_gamma", 3.0, 2.0),
        expose: SiteFilter | None = None,
        hide: SiteFilter | None = None,
        local_reparameterization: bool = True,
        example_dim: int = 0,
        strict: bool = False,
        init_loc_fn: Callable = init_to_sample,
        init_scale: float = 0.1,
        create_plates: Callable | None = None,
    ):
        if isinstance(reflections, bool) or not isinstance(reflections, int) or reflections < 0:
            raise ValueError(f"AutoVSDGuide: reflections (T) must be an int >= 0 (0 means U = I), got {reflections!r}.")
        if hidden_rank is not None and (not isinstance(hidden_rank, int) or hidden_rank < 1):
            raise ValueError(f"AutoVSDGuide: hidden_rank must be a positive int or None, got {hidden_rank!r}.")
        if not (isinstance(init_alpha, (int, float)) and init_alpha > 0):
            raise ValueError(
                f"AutoVSDGuide: init_alpha must be > 0 (alpha = p / (1 - p) for a dropout rate p), got {init_alpha!r}."
            )
        kind, concentration, rate = z_prior
        if kind not in Z_PRIORS or not (concentration > 0 and rate > 0):
            raise ValueError(
                f"AutoVSDGuide: z_prior must be (kind, concentration > 0, rate > 0) with kind in {Z_PRIORS}, "
                f"got {z_prior!r}."
            )
        if isinstance(init_scale, bool) or not (isinstance(init_scale, (int, float)) and init_scale > 0):
            raise ValueError(f"AutoVSDGuide: init_scale must be a number > 0, got {init_scale!r}.")
        self.reflections, self.hidden_rank, self.init_alpha = reflections, hidden_rank, float(init_alpha)
        self.hierarchical, self.z_prior = hierarchical, (kind, float(concentration), float(rate))
        self.local_reparameterization = local_reparameterization
        self.init_loc_fn, self._init_scale = init_loc_fn, float(init_scale)
        self._expose, self._hide = expose, hide
        self.vsd_sites: dict[str, VSDSite] | None = None
        super().__init__(model, example_dim=example_dim, strict=strict, create_plates=create_plates)

    # -- the hooks ModelTransform calls ----------------------------------------------------------

    def select_sites(self, original_model: Callable, *args, **kwargs) -> None:
        """Trace the original model once and fix which weight sites go under VSD."""
        self.vsd_sites = self._trace_and_select(
            original_model, args, kwargs, check_site=check_vsd_site, is_default=is_default_vsd_site
        )
        for name, site in self.vsd_sites.items():
            if self.reflections >= 2 and self.hidden_rank is not None and self.hidden_rank > site.num_noise:
                raise ValueError(
                    f"AutoVSDGuide: hidden_rank={self.hidden_rank} exceeds K={site.num_noise} of site {name!r} "
                    f"(shape {tuple(site.shape)}); use hidden_rank <= {site.num_noise} or None."
                )
        self._weight_of_z = {z_site_name(name): name for name in self.vsd_sites} if self.hierarchical else {}

    @property
    def structured_sites(self) -> dict[str, VSDSite] | None:
        """The VSD weight sites and how each is read (``None`` until the first call)."""
        return self.vsd_sites

    def auxiliary_model_sites(self) -> set[str]:
        return set(self._weight_of_z) if self.vsd_sites is not None else set()

    def replace_model_site(self, msg: dict) -> None:
        site = self._sites[msg["name"]]
        if self.hierarchical:
            pyro.sample(z_site_name(msg["name"]), z_prior(*self.z_prior, like_tensor(msg["fn"]), site.num_noise))
        msg["fn"] = EmpiricalBayesPrior(msg["fn"])

    # -- prototype and parameters ----------------------------------------------------------------

    def _init_structured_parameters(self) -> None:
        self.vsd_theta, self.vsd_alpha, self.vsd_householder = PyroModule(), PyroModule(), PyroModule()
        if self.hierarchical:
            self.vsd_z_loc, self.vsd_z_scale = PyroModule(), PyroModule()
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if name in self._sites:
                self._init_vsd(name, site["value"].detach())
            elif name not in self._weight_of_z:
                self._init_mean_field(name, site)

    def _init_vsd(self, name: str, theta: Tensor) -> None:
        size = self._sites[name].num_noise
        deep_set_param(self.vsd_theta, name, PyroParam(theta.clone(), constraints.real, event_dim=theta.dim()))
        alpha = theta.new_full((size,), self.init_alpha)
        deep_set_param(self.vsd_alpha, name, PyroParam(alpha, constraints.positive, event_dim=1))
        vectors = HouseholderVectors(size, self.reflections, self.hidden_rank, theta)
        pyro.nn.module.to_pyro_module_(vectors)  # its parameters become PyroParams of the guide
        deep_set_param(self.vsd_householder, name, pyro_params_(vectors))
        if self.hierarchical:
            deep_set_param(self.vsd_z_loc, name, PyroParam(theta.new_zeros(size), constraints.real, event_dim=1))
            scale = theta.new_full((size,), 0.1)
            deep_set_param(self.vsd_z_scale, name, PyroParam(scale, self.scale_constraint, event_dim=1))

    # -- distributions ---------------------------------------------------------------------------

    def noise_distribution(self, weight_site: str) -> StructuredDropoutNoise:
        r""":math:`q(\xi) = \mathcal{N}(1, U \operatorname{diag}(\alpha) U^\top)` of a VSD site."""
        self._require_site(weight_site, "noise_distribution")
        alpha = deep_getattr(self.vsd_alpha, weight_site)
        return StructuredDropoutNoise(alpha, deep_getattr(self.vsd_householder, weight_site)())

    def z_posterior(self, weight_site: str):
        """``q(z)``, log-normal, of a VSD site of the hierarchical model."""
        self._require_site(weight_site, "z_posterior")
        if not self.hierarchical:
            raise RuntimeError("AutoVSDGuide.z_posterior: the guide was built with hierarchical=False.")
        loc, scale = deep_getattr(self.vsd_z_loc, weight_site), deep_getattr(self.vsd_z_scale, weight_site)
        return dist.LogNormal(loc, scale).to_event(1)

    def kl(self, weight_site: str, noise: StructuredDropoutNoise | None = None) -> Tensor:
        """The site's KL term: eq. (6), or for the hierarchical model the expectation of eq. (15) over ``q(z)``."""
        site = self._sites[weight_site]
        noise = noise if noise is not None else self.noise_distribution(weight_site)
        if not self.hierarchical:
            return vsd_kl(noise.alpha, noise.variance, site.num_columns)
        z_dist = self.z_posterior(weight_site).base_dist
        return vsd_hierarchical_kl(noise.alpha, noise.variance, site.num_columns, z_dist.loc, z_dist.scale)

    def get_posterior(self, weight_site: str, row_scale: Tensor | None = None) -> VSDPosterior:
        """The guide's distribution for a VSD site (``row_scale``: a draw of ``z`` for the hierarchical model)."""
        noise = self.noise_distribution(weight_site)
        local = local_reparameterization_enabled(self.local_reparameterization)
        theta = deep_getattr(self.vsd_theta, weight_site)
        weight_options = {"example_dim": self.example_dim, "strict": self.strict, "site": weight_site}
        site = self._sites[weight_site]
        return VSDPosterior(theta, noise, site, self.kl(weight_site, noise), row_scale, local, weight_options)

    def _sample_structured(self, name, sampled):
        if name in self._weight_of_z:
            return pyro.sample(name, self.z_posterior(self._weight_of_z[name]))
        if name in self._sites:
            row_scale = sampled.get(z_site_name(name)) if self.hierarchical else None
            return pyro.sample(name, self.get_posterior(name, row_scale), infer={GUIDE_KEY: True})
        return None

    def guide_site(self, weight_site: str) -> str:
        return weight_site

    def _structured_quantiles(self, name, levels, num_samples):
        r"""Exact for a plain VSD site (:math:`W_{ij} \sim \mathcal{N}(\Theta_{ij}, \Theta_{ij}^2 s_i)`) and for
        ``z``; for a hierarchical one, a Monte-Carlo estimate from ``num_samples`` draws of :math:`(z, \xi)`."""
        if name in self._weight_of_z:
            z_dist = self.z_posterior(self._weight_of_z[name]).base_dist
            return {name: normal_quantiles(z_dist.loc, z_dist.scale, levels).exp()}
        if name not in self._sites:
            return None
        if self.hierarchical:  # W = diag(z * xi) Theta for num_samples independent (z, xi), drawn in one batch
            xi = self.noise_distribution(name).sample((num_samples,)) * self.z_posterior(name).sample((num_samples,))
            draws = scale_along(deep_getattr(self.vsd_theta, name), xi, self._sites[name].noise_dim)
            return {name: empirical_quantiles(draws, levels)}
        posterior = self.get_posterior(name)
        return {name: normal_quantiles(posterior.mean, posterior.variance.sqrt(), levels)}

    def _set_structured_gaussian_(self, site, mean, precision, data_precision, data_rhs, what) -> None:
        r""":math:`\Theta` = ``mean``; :math:`\alpha` gives it the variances closest to ``1 / precision``
        (:func:`~pyro_whvi.distributions.householder.fit_vsd_alpha`); the Householder vectors are kept."""

        alpha = fit_vsd_alpha(self._sites[site], mean, precision, self.noise_distribution(site).householder_matrix)
        assign_param_(self.vsd_theta, site, mean, what)
        assign_param_(self.vsd_alpha, site, alpha, what)

    def _set_structured_isotropic_(self, site, variance, what) -> None:
        r""":math:`\Theta` drawn from :math:`\mathcal{N}(0, \text{variance})` (a zero :math:`\Theta` would switch the
        multiplicative noise off); :math:`\alpha` and the Householder vectors are kept."""
        assign_param_(self.vsd_theta, site, variance**0.5 * torch.randn_like(deep_getattr(self.vsd_theta, site)), what)

r"""The site-level pieces of Variational Structured Dropout: which weights it takes, and the pair of
distributions through which Pyro's ELBOs see its KL term.

A weight site ``W`` becomes :math:`W = \operatorname{diag}(\xi) \Theta`, the noise :math:`\xi` scaling
the inputs of a linear layer (dropout on the layer's inputs) or the output channels of a convolution
(§3.4). The KL of eq. (6) does not depend on :math:`\Theta` and cannot be written as
``log q(W) - log p(W)`` of one draw (``q(W)`` is degenerate; eq. 5 uses the product of its column
marginals), so:

* the model's prior is replaced by :class:`EmpiricalBayesPrior`, whose ``log_prob`` is zero (the
  empirical-Bayes prior is a function of the variational parameters, so its density is folded into
  the guide's term); sampling it without a guide draws from the original prior;
* the guide samples the site from :class:`VSDPosterior`, whose ``log_prob`` of its own draws is the
  KL (a constant in the draw, so no score-function term arises), and ``kl_divergence`` between the
  two returns the same number for ``TraceMeanField_ELBO``.

Either way the ELBO's term for the site is exactly :math:`-\mathrm{KL}^{EB}`.

References:
    VSD paper (Nguyen et al., NeurIPS 2021), §3.2–3.4, App. B–C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from torch import Tensor
from torch.distributions import Distribution, register_kl

from ..distributions.householder import StructuredDropoutNoise
from ..distributions.whvi_matrix import has_real_support
from .vsd_weight import VSDWeight, scale_along

_SCALAR = torch.Size()

__all__ = ["EmpiricalBayesPrior", "VSDPosterior", "VSDSite", "check_vsd_site", "z_site_name"]


def z_site_name(name: str) -> str:
    """Name of the row-scale site ``z`` that the hierarchical VSD model adds for weight site ``name``."""
    return f"{name}_vsd_z"


@dataclass(frozen=True)
class VSDSite:
    """How VSD reads a weight of shape ``shape``: ``K`` noise entries along ``noise_dim``, ``Q`` entries each."""

    shape: torch.Size
    noise_dim: int

    @property
    def num_noise(self) -> int:
        """``K``: the length of :math:`\\xi`."""
        return self.shape[self.noise_dim]

    @property
    def num_columns(self) -> int:
        """``Q``: how many weight entries each noise entry multiplies (the ``Q`` of eq. 6)."""
        return math.prod(self.shape) // self.num_noise


def check_vsd_site(name: str, fn) -> VSDSite:
    """How VSD reads weight site ``name`` with prior ``fn``, or a ``ValueError`` saying why it cannot."""
    if getattr(fn.support, "is_discrete", False):
        raise ValueError(f"VSD site {name!r}: {type(fn).__name__} is discrete; VSD needs a real-valued weight.")
    if not has_real_support(fn):
        raise ValueError(
            f"VSD site {name!r}: support {fn.support} is not the real line; hide this site from AutoVSDGuide "
            "so that it gets a mean-field guide."
        )
    if fn.batch_shape != torch.Size():
        raise ValueError(
            f"VSD site {name!r}: the prior has batch shape {tuple(fn.batch_shape)}; declare the whole weight as one "
            f"event, e.g. dist.Normal(0., 1.).expand({list(fn.shape())}).to_event({len(fn.shape())}), outside "
            "pyro.plate."
        )
    shape = fn.event_shape
    if len(shape) == 2:
        return VSDSite(shape, noise_dim=1)
    if 3 <= len(shape) <= 5:
        return VSDSite(shape, noise_dim=0)
    raise ValueError(
        f"VSD site {name!r}: event shape {tuple(shape)}; VSD takes a linear weight (out, in) or a convolution's "
        "filter bank (C_out, C_in, k...). Hide the site (it then gets a mean-field guide)."
    )


def is_default_vsd_site(fn) -> bool:
    """Default selection: every real weight matrix with more than one input, and every filter bank."""
    try:
        site = check_vsd_site("", fn)
    except ValueError:
        return False
    return site.num_noise > 1


class EmpiricalBayesPrior(TorchDistribution):
    """The model side of a VSD site: ``log_prob`` zero, ``sample`` from the original prior.

    :param original: the model's prior for the weight, used only to draw without a guide.

    ``has_rsample`` is true (drawing goes through the original prior's ``rsample`` where it has one)
    so that ``TraceGraph_ELBO`` treats the site as reparameterized and leaves the lazy value alone.
    """

    arg_constraints: dict = {}  # noqa: RUF012
    support = constraints.real
    has_rsample = True

    def __init__(self, original: TorchDistribution):
        self.original = original
        super().__init__(torch.Size(), original.event_shape, validate_args=False)

    def sample(self, sample_shape=_SCALAR):
        return self.original.sample(sample_shape)

    def rsample(self, sample_shape=_SCALAR):
        if self.original.has_rsample:
            return self.original.rsample(sample_shape)
        return self.original.sample(sample_shape)

    def log_prob(self, value):
        return torch.zeros((), dtype=value.dtype, device=value.device)


class VSDPosterior(TorchDistribution):
    r"""The guide side of a VSD site: draws :class:`~pyro_whvi.infer.VSDWeight` values, ``log_prob`` = KL.

    :param theta: :math:`\Theta`, the weight's shape.
    :param noise: :class:`~pyro_whvi.distributions.StructuredDropoutNoise` over the ``K`` noise entries.
    :param site: the :class:`VSDSite` (``noise_dim``, ``K``, ``Q``).
    :param kl: the KL term of the site (eq. 6, or the expectation of eq. 15 over ``q(z)``).
    :param row_scale: the hierarchical model's draw of ``z`` (``(K,)``), or ``None``.
    :param local: draw :math:`\xi` per example in ``F.linear``/``F.conv2d``.
    :param weight_options: keyword arguments of the :class:`~pyro_whvi.infer.VSDWeight` values
        (``example_dim``, ``strict``, ``site``).
    """

    arg_constraints: dict = {}  # noqa: RUF012
    support = constraints.real
    has_rsample = True

    def __init__(
        self,
        theta: Tensor,
        noise: StructuredDropoutNoise,
        site: VSDSite,
        kl: Tensor,
        row_scale: Tensor | None = None,
        local: bool = True,
        weight_options: dict | None = None,
    ):
        self.theta, self.noise, self.site, self.kl = theta, noise, site, kl
        self.row_scale, self.local, self.weight_options = row_scale, local, weight_options or {}
        super().__init__(torch.Size(), theta.shape, validate_args=False)

    def rsample(self, sample_shape=_SCALAR):
        if sample_shape != torch.Size():
            raise ValueError(
                "VSDPosterior draws one lazy weight at a time; use Predictive(..., parallel=False) and ELBOs "
                "without vectorize_particles."
            )
        return VSDWeight(
            self.theta,
            self.noise,
            self.site.noise_dim,
            row_scale=self.row_scale,
            local=self.local,
            **self.weight_options,
        )

    def sample(self, sample_shape=_SCALAR):
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value):
        return self.kl

    @property
    def mean(self) -> Tensor:
        """:math:`\\Theta` (given ``z`` for the hierarchical model: :math:`\\operatorname{diag}(z) \\Theta`)."""
        return self.theta if self.row_scale is None else scale_along(self.theta, self.row_scale, self.site.noise_dim)

    @property
    def variance(self) -> Tensor:
        """Marginal variances :math:`\\Theta_{ij}^2 s_i` (given ``z``: times :math:`z_i^2`)."""
        scale = self.noise.variance
        if self.row_scale is not None:
            scale = scale * self.row_scale.square()
        return scale_along(self.theta.square(), scale, self.site.noise_dim)


@register_kl(VSDPosterior, EmpiricalBayesPrior)
def _kl_vsd_empirical_bayes(q: VSDPosterior, p: EmpiricalBayesPrior) -> Tensor:
    return q.kl


@register_kl(VSDPosterior, Distribution)
def _kl_vsd_other_prior(q: VSDPosterior, p: Distribution) -> Tensor:
    raise ValueError(
        f"A VSD site met the prior {type(p).__name__} instead of the empirical-Bayes one: the ELBO was given the "
        "original model. Pass guide.model (the model with the VSD sites' priors replaced) to SVI/ELBO/Predictive."
    )


def z_prior(kind: str, concentration: float, rate: float, like: Tensor, size: int):
    """The hierarchical model's prior on ``z``: ``InverseGamma`` or ``Gamma``, ``(K,)`` as one event."""
    cls = dist.InverseGamma if kind == "inverse_gamma" else dist.Gamma
    return cls(like.new_tensor(concentration), like.new_tensor(rate)).expand([size]).to_event(1)

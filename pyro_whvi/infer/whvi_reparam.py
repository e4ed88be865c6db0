r"""The model side of WHVI: a reparameterizer from a weight site to its latent ``g``.

``W ~ p(W)`` (shape ``D_out x D_in``, a filter bank, or a vector) becomes

.. math:: g \sim \mathcal{N}(0, \lambda I_{K D}), \qquad W = S_1 H \operatorname{diag}(g) H S_2,

with ``S1``, ``S2`` learned point estimates (WHVI paper §2.2, App. D.1). The prior moves from the
``D_out D_in`` entries of ``W`` to ``g``: ``q(W)`` lives on a ``K D``-dimensional subspace, where a
prior over all entries of ``W`` has no density, so the ELBO is only defined with the prior on ``g``.

Defaults (the paper leaves them open; a public reproduction failed on them, its KL term
dominating): ``lambda = 1``, ``s1 = lambda^{-1/4}``, ``s2 = lambda^{-1/4}`` with random signs.
Then the prior mean weight has entries of variance ``1 / D`` (LeCun-style, ``D`` the padded fan-in),
and a guide started at a prior draw ``mu ~ N(0, lambda)`` with ``sigma = 0.1 sqrt(lambda)`` pays a KL
of about ``2.3`` nats per entry of ``g`` whatever ``lambda`` is. The paper's ``lambda = 1e-5`` only
rescales ``g`` against ``S1 S2``; with Adam's absolute step sizes ``lambda = 1`` keeps ``g`` at
unit scale.
"""

from __future__ import annotations

import warnings
from typing import cast

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.reparam.reparam import Reparam, ReparamMessage, ReparamResult
from pyro.poutine.messenger import Messenger
from torch import Tensor
from torch.distributions import Normal

from ..distributions import WHVILayout, WHVIMatrix
from ..distributions.qg_family import NETWORK_CONVENTION
from ..distributions.whvi_matrix import base_distribution, has_real_support
from ._guide_utils import like_tensor
from .lazy_weight import check_example_dim, local_reparameterization_enabled
from .whvi_weight import WHVIWeight

__all__ = ["WHVIReparam", "check_whvi_site", "g_site_name", "init_whvi_scales", "whvi_prior"]

POSTERIOR_KEY = "whvi_posterior"


def g_site_name(name: str) -> str:
    """Name of the latent ``g`` site that replaces weight site ``name``."""
    return f"{name}_whvi_g"


def check_whvi_site(name: str, fn) -> WHVILayout:
    """The layout of weight site ``name`` with prior ``fn``, or a ``ValueError`` saying why WHVI cannot take it."""
    if getattr(fn.support, "is_discrete", False):
        raise ValueError(f"WHVI site {name!r}: {type(fn).__name__} is discrete; WHVI needs a real-valued weight.")
    if not has_real_support(fn):
        raise ValueError(
            f"WHVI site {name!r}: support {fn.support} is not the real line; WHVI weights are unconstrained "
            "(hide this site from the WHVI guide so that it gets a mean-field guide)."
        )
    if fn.batch_shape != torch.Size():
        raise ValueError(
            f"WHVI site {name!r}: the prior has batch shape {tuple(fn.batch_shape)}; declare the whole weight as "
            f"one event, e.g. dist.Normal(0., 1.).expand({list(fn.shape())}).to_event({len(fn.shape())}), and keep "
            "weight sites outside pyro.plate."
        )
    return WHVILayout.for_shape(fn.event_shape, site=name)


def whvi_prior(layout: WHVILayout, prior_variance: float, like: Tensor):
    """``N(0, lambda I)`` over ``g``, event shape ``(K, D)``."""
    zeros = like.new_zeros(layout.block_shape)
    return dist.Normal(zeros, zeros.new_tensor(prior_variance).sqrt()).to_event(2)


def init_whvi_scales(layout: WHVILayout, prior_variance: float, like: Tensor) -> tuple[Tensor, Tensor]:
    """The default ``s1 = lambda^{-1/4}``, ``s2 = lambda^{-1/4}`` times random signs (FASTFOOD's ``B``):
    :data:`~pyro_whvi.distributions.qg_family.NETWORK_CONVENTION`."""
    return NETWORK_CONVENTION.init_scales(layout.block_shape, prior_variance, like)


class _PosteriorCapture(Messenger):
    """Reads the ``q(g)`` a WHVI guide attached to the replayed ``g`` site."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.posterior = None

    def _pyro_post_sample(self, msg):
        if msg["name"] == self.name:
            self.posterior = (msg.get("infer") or {}).get(POSTERIOR_KEY)


class WHVIReparam(Reparam):
    r"""Reparameterize a weight site into WHVI's latent ``g`` and a deterministic weight.

    Works with ``poutine.reparam(model, {"fc1.weight": WHVIReparam()})`` and any guide over the
    ``"<site>_whvi_g"`` sites; :class:`~pyro_whvi.AutoWHVIGuide` sets it up for you and also avoids
    Pyro's support check on the weight value, which would form the dense weight every step.

    The site's value is a :class:`~pyro_whvi.infer.WHVIWeight`: ``F.linear``/``F.conv2d`` on it
    draw ``g`` per example from ``q(g)`` when a WHVI guide supplied ``q(g)`` (local
    reparameterization), and any other use forms the dense weight of the site's draw.

    :param prior_variance: :math:`\lambda` in :math:`p(g) = \mathcal{N}(0, \lambda I)`.
    :param local_reparameterization: draw ``g`` per example in ``F.linear``/``F.conv2d``.
    :param example_dim: the dimension of a linear layer's input that indexes examples (one draw each).
    :param strict: an op on the weight that cannot use the per-example draws raises instead of warning.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2–2.3, §2.5, App. D.1.
    """

    def __init__(
        self,
        prior_variance: float = 1.0,
        *,
        local_reparameterization: bool = True,
        example_dim: int = 0,
        strict: bool = False,
    ):
        if not prior_variance > 0:
            raise ValueError(f"WHVIReparam: prior_variance must be > 0, got {prior_variance!r}.")
        self.prior_variance = float(prior_variance)
        self.local_reparameterization = local_reparameterization
        self.example_dim = check_example_dim(example_dim, "WHVIReparam")
        self.strict = bool(strict)

    def scales(self, name: str, layout: WHVILayout, like: Tensor) -> tuple[Tensor, Tensor]:
        """``(s1, s2)`` for site ``name``: the extension point. Default: ``pyro.param`` in the param store."""
        # Lazy inits: after the first step the store has both, and no random init is drawn again.
        s1 = pyro.param(f"{name}_whvi_s1", lambda: init_whvi_scales(layout, self.prior_variance, like)[0])
        s2 = pyro.param(f"{name}_whvi_s2", lambda: init_whvi_scales(layout, self.prior_variance, like)[1])
        return s1, s2

    def local_enabled(self) -> bool:
        """Whether weights made now draw ``g`` per example (a :func:`local_reparameterization` block wins)."""
        return local_reparameterization_enabled(self.local_reparameterization)

    def apply(self, msg: ReparamMessage) -> ReparamResult:
        name, fn = msg["name"], cast(dist.TorchDistribution, msg["fn"])
        if msg["is_observed"]:
            raise ValueError(f"WHVIReparam: site {name!r} is observed; WHVI applies to latent weights only.")
        layout = check_whvi_site(name, fn)
        if not isinstance(base_distribution(fn), Normal):
            warnings.warn(
                f"WHVI site {name!r}: the prior {type(base_distribution(fn)).__name__} is replaced by the WHVI prior "
                f"g ~ N(0, {self.prior_variance} I) on the latent g (a prior on W has no density on WHVI's subspace).",
                UserWarning,
                stacklevel=2,
            )
        like = like_tensor(fn)
        s1, s2 = self.scales(name, layout, like)
        prior = whvi_prior(layout, self.prior_variance, s1)
        capture = _PosteriorCapture(g_site_name(name))
        with capture:
            g = pyro.sample(g_site_name(name), prior)
        if g.shape != layout.block_shape:
            raise ValueError(
                f"WHVI site {name!r}: g has shape {tuple(g.shape)}, expected {tuple(layout.block_shape)}; WHVI "
                "weights cannot sit inside pyro.plate or vectorized particles: use Predictive(..., parallel=False) "
                "and ELBOs with num_particles but without vectorize_particles."
            )
        posterior = capture.posterior
        # Only a matrix layout has a per-example product; other sites (a bias on WHVI blocks) use their draw.
        local = posterior is not None and layout.kind == "matrix" and self.local_enabled()
        distribution = WHVIMatrix(s1, s2, posterior if posterior is not None else prior, layout.shape)
        weight = WHVIWeight(distribution, g, local, example_dim=self.example_dim, strict=self.strict, site=name)
        return {"fn": dist.Delta(weight, event_dim=fn.event_dim).mask(False), "value": weight, "is_observed": True}

r"""GPyTorch's variational strategy for a linearized GP: the inducing variables are the random-feature weights.

Shape letters: ``N`` inputs, ``d`` input dimensions, ``L`` inducing variables (the latent dimension of
the weight posterior), ``R`` columns of the covariance root, ``...`` batch.

An inducing-point strategy maps ``q(u)`` at inducing inputs ``Z`` to ``q(f)`` through the prior
conditional ``p(f | u)``. For ``f(x) = Psi(x) z`` the conditional is deterministic given ``z``, so
``q(z) = N(mu, C C^T)`` (:class:`~pyro_whvi.gp.posteriors.WeightPosterior`) maps to

.. math::
    q(f) = \mathcal N\big(m(x) + \Psi(x)\,\mu,\; (\Psi(x) C)(\Psi(x) C)^\top\big),

returned with the root operator ``Psi C`` (``N x R``, never ``N x N``). The weights have no input
locations: :attr:`inducing_points` is an empty ``(L, 0)`` buffer, kept for GPyTorch's interface only.

References:
    S. Rossi, S. Marmin, M. Filippone. *Walsh-Hadamard Variational Inference for Bayesian Deep
    Learning*. NeurIPS 2020, App. D.4 (eq. 22) and Table 10.
    J. Hensman, N. Fusi, N. D. Lawrence. *Gaussian Processes for Big Data*. UAI 2013 (the variational
    strategy GPyTorch's interface follows).
"""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
import torch.nn.functional as F
from gpytorch.distributions import MultivariateNormal
from gpytorch.variational import _VariationalStrategy
from linear_operator.operators import (
    ConstantDiagLinearOperator,
    LinearOperator,
    LowRankRootLinearOperator,
    RootLinearOperator,
)
from torch import Tensor

from ..distributions.conventions import GP_CONVENTION
from ..ops import fwht, whvi_design
from ..ops._checks import check_finite
from .fourier_design import whvi_fourier_design
from .posteriors import WeightPosterior, WHVIWeightPosterior

__all__ = ["RandomFeatureVariationalStrategy", "WHVIVariationalStrategy", "root_covariance"]


def root_covariance(root: Tensor) -> RootLinearOperator:
    """``root root^T`` as a lazy operator: :class:`LowRankRootLinearOperator` when ``R < N``."""
    return LowRankRootLinearOperator(root) if root.shape[-1] < root.shape[-2] else RootLinearOperator(root)


def _check_targets(gradient: Tensor, mean: Tensor) -> None:
    """Refuse non-finite targets, seen in the loss's gradient with respect to ``q(f)``'s finite mean.

    The targets reach only the likelihood (``-mll(model(x), y)``), never the model, so the model finds them
    here, in ``loss.backward()``, before any parameter receives a non-finite gradient: the gradient of a
    likelihood term is NaN or infinite exactly at the rows whose target is.
    """
    if gradient.device.type == "meta":  # no values to check
        return
    bad = ~torch.isfinite(gradient)
    if bad.any() and torch.isfinite(mean).all():
        rows = torch.nonzero(bad.reshape(-1, bad.shape[-1]).any(0)).flatten().tolist()
        shown = ("row " if len(rows) == 1 else "rows ") + ", ".join(map(str, rows[:5])) + (", ..." * (len(rows) > 5))
        check_finite("RandomFeatureGP", f"y (the targets; {shown}, found by the loss's gradient)", gradient)


class RandomFeatureVariationalStrategy(_VariationalStrategy):
    r"""``q(f(x))`` of ``f = Psi(x) z`` from the weight posterior ``q(z)``; the KL is ``KL(q(z) || p(z))``.

    :param model: the approximate GP it serves (a :class:`~pyro_whvi.gp.RandomFeatureGP`): its
        ``covar_module``, a :class:`~pyro_whvi.gp.RandomFeatureKernel`, gives the features and its
        ``mean_module`` the prior mean. The strategy reads no more of it, and imports nothing of the model.
    :param variational_distribution: ``q(z)`` with prior ``N(0, lambda I)``: ``z = w`` with ``lambda = 1``,
        or WHVI's ``g``.

    Calling it marginalizes the posterior's own mean and root (no ``L x L`` covariance is formed);
    :meth:`forward` is the same map for any Gaussian ``q(u)`` handed in, GPyTorch's hook. The
    posterior is initialized when built, so ``variational_params_initialized`` is 1 from the start.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), App. D.4.
    """

    def __init__(self, model: gpytorch.models.ApproximateGP, variational_distribution: WeightPosterior):
        latent = variational_distribution.loc
        no_locations = torch.empty(variational_distribution.latent_dim, 0, dtype=latent.dtype, device=latent.device)
        super().__init__(model, no_locations, variational_distribution, learn_inducing_locations=False)
        # Neither buffer carries information, so neither enters the state dict (whose keys stay q's).
        self.register_buffer("inducing_points", self.inducing_points, persistent=False)
        initialized = torch.ones((), dtype=torch.long, device=latent.device)
        self.register_buffer("variational_params_initialized", initialized, persistent=False)

    @property
    def weight_posterior(self) -> WeightPosterior:
        """``q(z)``, the module holding the variational parameters."""
        return self._variational_distribution

    @property
    def prior_distribution(self) -> MultivariateNormal:
        """``p(z) = N(0, lambda I)`` (built on each access, so it follows the model's dtype and device)."""
        loc = self.weight_posterior.loc
        variance = torch.full((1,), self.weight_posterior.prior_variance, dtype=loc.dtype, device=loc.device)
        return MultivariateNormal(torch.zeros_like(loc), ConstantDiagLinearOperator(variance, loc.shape[-1]))

    def kl_divergence(self) -> Tensor:
        """``KL(q(z) || p(z))`` in closed form (:meth:`WeightPosterior.kl_divergence`)."""
        return self.weight_posterior.kl_divergence()

    def design(self, x: Tensor) -> Tensor:
        """``Psi(x)``, ``(..., N, L)``: the map from ``z`` to ``f = Psi(x) z``; here the features themselves."""
        return self.feature_design(self.model.covar_module.feature_map(x))

    def feature_design(self, features: Tensor) -> Tensor:
        """``Psi`` from features already computed, ``(..., N, F)`` to ``(..., N, L)``."""
        return features

    @property
    def num_variational_parameters(self) -> int:
        """The free parameters of ``q(w)`` (``q(z)``'s and the design's; hyperparameters not counted)."""
        return self.weight_posterior.num_variational_parameters

    def prior_mean(self, x: Tensor, mean: Tensor) -> Tensor:
        """``mean + m(x)``; a :class:`~gpytorch.means.ZeroMean` is skipped (adding zeros changes no value)."""
        mean_module = self.model.mean_module
        return mean if isinstance(mean_module, gpytorch.means.ZeroMean) else mean + mean_module(x)

    def mean_and_root(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Mean ``(..., N)`` and covariance root ``(..., N, R)`` of ``q(f)`` at inputs ``(..., N, d)``."""
        design, posterior = self.design(x), self.weight_posterior
        mean = design @ posterior.loc
        root = design * posterior.scale if posterior.covariance == "diagonal" else design @ posterior.scale_tril
        return self.prior_mean(x, mean), root

    def forward(
        self,
        x: Tensor,
        inducing_points: Tensor,
        inducing_values: Tensor,
        variational_inducing_covar: LinearOperator | None = None,
        diag: bool = True,
        **kwargs: Any,
    ) -> MultivariateNormal:
        r"""``q(f)`` for ``q(z) = N(inducing_values, variational_inducing_covar)``: mean ``Psi m``, root
        ``Psi S^{1/2}``."""
        if variational_inducing_covar is None:
            raise NotImplementedError("RandomFeatureVariationalStrategy: q(z) must be Gaussian (got a point mass).")
        design = self.design(x)
        root = variational_inducing_covar.root_decomposition().root.to_dense()
        return MultivariateNormal(self.prior_mean(x, design @ inducing_values), root_covariance(design @ root))

    def __call__(self, x: Tensor, prior: bool = False, diag: bool = True, **kwargs: Any) -> MultivariateNormal:
        """``q(f(x))`` with the root operator ``Psi(x) C``; ``prior=True``: :meth:`RandomFeatureGP.forward`.

        GPyTorch's base call would build ``q(z)``'s ``L x L`` covariance operator and hand it to
        :meth:`forward`; here the posterior's own root goes straight in (GPyTorch's LMC, multitask and
        nearest-neighbour strategies override the call too).
        """
        if prior:
            return self.model.forward(x, **kwargs)
        if self.training:
            self._clear_cache()
        if not isinstance(x, Tensor) or x.dim() < 2:
            raise ValueError(f"RandomFeatureGP: inputs must be a (..., N, d) tensor, got {getattr(x, 'shape', x)}.")
        mean, root = self.mean_and_root(x)
        if mean.requires_grad:
            values = mean.detach()
            mean.register_hook(lambda gradient: _check_targets(gradient, values))
        return MultivariateNormal(mean, root_covariance(root))

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # Before this strategy existed the posterior itself sat at the strategy's place in the model, so
        # older state dicts hold q's tensors one level up: move them under ``_variational_distribution.``.
        for name in self.weight_posterior.state_dict():
            if prefix + name in state_dict and "." not in name:
                state_dict[f"{prefix}_variational_distribution.{name}"] = state_dict.pop(prefix + name)
        # Before the strategy owned the design, WHVI's S1 and S2 sat in the posterior: move them up here.
        for name in self._parameters:
            old = f"{prefix}_variational_distribution.{name}"
            if old in state_dict and prefix + name not in state_dict:
                state_dict[prefix + name] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class WHVIVariationalStrategy(RandomFeatureVariationalStrategy):
    r"""The strategy of a WHVI posterior: ``w`` reshaped into ``W = S1 H diag(g) H S2`` (``D x D``, ``D^2 >= F``,
    WHVI paper §2.5), with ``S1``, ``S2`` point estimates of its design (initialized to 1: the
    :data:`~pyro_whvi.distributions.conventions.GP_CONVENTION`) and ``q(g)`` the
    :class:`~pyro_whvi.gp.posteriors.WHVIWeightPosterior`.

    Its design is ``Psi(x)_k = [H (S1 R(x) S2) H]_kk`` with ``R(x)`` the features reshaped the same way: from
    the feature angles by :func:`~pyro_whvi.gp.fourier_design.whvi_fourier_design` (one compiled backward pass
    instead of three) in :meth:`design`, from features by :func:`pyro_whvi.ops.whvi_design` in
    :meth:`feature_design`.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §2.2, §2.5, App. D.4.
    """

    def __init__(self, model: gpytorch.models.ApproximateGP, variational_distribution: WHVIWeightPosterior):
        super().__init__(model, variational_distribution)
        block, loc = variational_distribution.latent_dim, variational_distribution.loc
        s1, s2 = GP_CONVENTION.init_scales((block,), variational_distribution.prior_variance, loc.detach())
        self.s1 = torch.nn.Parameter(s1)
        self.s2 = torch.nn.Parameter(s2)

    def design(self, x: Tensor) -> Tensor:
        angles, scale = self.model.covar_module.feature_angles(x)
        return whvi_fourier_design(angles, scale, self.s1, self.s2)

    def feature_design(self, features: Tensor) -> Tensor:
        block = self.weight_posterior.latent_dim
        if features.shape[-1] < block * block:
            features = F.pad(features, (0, block * block - features.shape[-1]))
        return whvi_design(features.unflatten(-1, (block, block)), self.s1, self.s2)

    def weight_mean(self) -> Tensor:
        """``E_q[w]``, ``(F,)``: the first ``F`` entries of ``S1 H diag(mu) H S2`` read row by row."""
        loc = self.weight_posterior.loc
        eye = torch.eye(loc.shape[-1], dtype=loc.dtype, device=loc.device)
        matrix = self.s1[:, None] * fwht(fwht(eye * loc).mT).mT * self.s2
        return matrix.flatten()[: self.weight_posterior.num_features]

"""The models and helpers the guide conformance checks (:mod:`~pyro_whvi.testing.guide_case`) train."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pyro
import pyro.distributions as dist
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceGraph_ELBO, TraceMeanField_ELBO
from torch import Tensor

from ..nn import BayesianMLP

__all__ = ["ELBOS", "MISMATCH_WARNINGS", "ConformanceMLP", "LocalLatentMLP"]

ELBOS: dict[str, Callable[[], pyro.infer.ELBO]] = {
    "Trace_ELBO": Trace_ELBO,
    "TraceMeanField_ELBO": TraceMeanField_ELBO,
    "TraceGraph_ELBO": TraceGraph_ELBO,
}

#: Pyro's warnings that a guide does not match its model ("Found vars in model but not guide", ...), or
#: that TraceMeanField_ELBO could not verify the mean-field restriction: errors in the checks.
MISMATCH_WARNINGS = ("Found ", "Failed to verify mean field")


class ConformanceMLP(BayesianMLP):
    """``BayesianMLP`` whose data plate can subsample: with ``subsample_size`` the likelihood is
    ``pyro.plate("data", N, subsample_size=B)`` over the whole batch's outputs (the weights are drawn
    outside it, and so is each example's noise), so Pyro draws the minibatch and scales its log-likelihood
    by ``N / B``; ``scale_likelihood=False`` undoes that scale (a broken model, to show a check can fail).
    The noise scale starts at 1, so that most of the likelihood is a constant per example."""

    def __init__(self, widths, noise_scale: float = 1.0):
        super().__init__(widths, noise_scale=noise_scale)

    def forward(
        self,
        x: Tensor,
        y: Tensor | None = None,
        num_data: int | None = None,
        subsample_size: int | None = None,
        scale_likelihood: bool = True,
    ) -> Tensor:
        if subsample_size is None:
            return super().forward(x, y, num_data)
        f = self.predict(x)
        pyro.deterministic("f", f)
        undo = 1.0 if scale_likelihood else subsample_size / x.shape[0]
        noise_scale = cast(Tensor, self.noise_scale)
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as index, poutine.scale(scale=undo):
            pyro.sample("obs", dist.Normal(f[index], noise_scale), obs=None if y is None else y[index])
        return f


class LocalLatentMLP(ConformanceMLP):
    """A per-example latent ``offset`` in the subsampled data plate, for the guide to subsample as the model
    does (through ``create_plates``); ``last_index`` is the model's last minibatch."""

    last_index: Tensor | None = None

    def forward(self, x: Tensor, y: Tensor | None = None, subsample_size: int | None = None) -> Tensor:  # type: ignore[override]
        f = self.predict(x)
        noise_scale = cast(Tensor, self.noise_scale)
        with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as index:
            self.last_index = index
            offset = pyro.sample("offset", dist.Normal(0.0, 0.5))
            pyro.sample("obs", dist.Normal(f[index] + offset, noise_scale), obs=None if y is None else y[index])
        return f


def data_plate(x: Tensor, y: Tensor | None = None, subsample_size: int | None = None):
    """The guide's ``create_plates`` for :class:`LocalLatentMLP`."""
    return pyro.plate("data", x.shape[0], subsample_size=subsample_size)


def parameter_groups(name: str) -> tuple[str, str]:
    """``("whvi_s1", "layers.0.weight")`` for the guide parameter ``whvi_s1.layers.0.weight_unconstrained``."""
    group, _, rest = name.removesuffix("_unconstrained").partition(".")
    return group, rest

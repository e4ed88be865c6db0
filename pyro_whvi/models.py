r"""Ready-made Pyro models used by the tests, benchmarks and tutorials.

They are ordinary Pyro: ``PyroModule`` layers with ``PyroSample`` priors, usable with any guide.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch import Tensor, nn

__all__ = ["BayesianMLP"]


class BayesianMLP(PyroModule):
    r"""Fully connected Bayesian network with a Gaussian likelihood and a learned noise scale.

    A weight with ``fan_in`` inputs has the prior :math:`\mathcal{N}(0, \text{prior\_scale}^2 / \text{fan\_in})`
    (the scaling under which a wide network's prior stays finite, and the one WHVI's default prior
    on ``g`` induces on ``W``); biases have :math:`\mathcal{N}(0, \text{prior\_scale}^2)`. The
    observation noise scale is a point estimate (``PyroParam``), as in the WHVI paper's regression
    experiments (App. D.1).

    :param widths: ``[D_in, hidden..., D_out]``; ``D_out = 1`` gives targets of shape ``(N,)``.
    :param activation: applied between layers (default ReLU).
    :param prior_scale: prior standard deviation of the biases, and of the weights times ``sqrt(fan_in)``.
    :param noise_scale: (initial) observation noise standard deviation.
    :param learn_noise: learn the noise scale (a point estimate) or keep it fixed.

    Shape letters: ``N`` examples, ``D_in`` inputs, ``D_out`` outputs.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §3.1–3.2 and App. D.1 (architectures, likelihood).
    """

    def __init__(
        self,
        widths: Sequence[int],
        activation: Callable[[Tensor], Tensor] = torch.relu,
        prior_scale: float = 1.0,
        noise_scale: float = 0.1,
        learn_noise: bool = True,
    ):
        super().__init__()
        if len(widths) < 2 or any(int(w) < 1 for w in widths):
            raise ValueError(f"BayesianMLP: widths must list at least two positive sizes, got {list(widths)}.")
        self.widths = [int(w) for w in widths]
        self.activation = activation
        layers = []
        for d_in, d_out in zip(self.widths[:-1], self.widths[1:]):
            layer = PyroModule[nn.Linear](d_in, d_out)  # type: ignore[arg-type,call-arg]
            weight_scale = prior_scale / math.sqrt(d_in)
            layer.weight = PyroSample(dist.Normal(0.0, weight_scale).expand([d_out, d_in]).to_event(2))
            layer.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([d_out]).to_event(1))
            layers.append(layer)
        self.layers = PyroModule[nn.ModuleList](layers)  # type: ignore[arg-type]
        if learn_noise:
            self.noise_scale = PyroParam(torch.tensor(float(noise_scale)), dist.constraints.positive)
        else:
            self.register_buffer("noise_scale", torch.tensor(float(noise_scale)))

    def predict(self, x: Tensor) -> Tensor:
        """The network output ``f(x)``: ``(N,)`` for one output, else ``(N, D_out)``."""
        if x.dim() != 2 or x.shape[-1] != self.widths[0]:
            raise ValueError(f"BayesianMLP: x must have shape (N, {self.widths[0]}), got {tuple(x.shape)}.")
        h = x
        for k, layer in enumerate(self.layers):
            h = layer(h)
            if k < len(self.layers) - 1:
                h = self.activation(h)
        return h.squeeze(-1) if self.widths[-1] == 1 else h

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        f = self.predict(x)
        pyro.deterministic("f", f)
        event_dims = 0 if self.widths[-1] == 1 else 1
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(f, cast(Tensor, self.noise_scale)).to_event(event_dims), obs=y)
        return f

r"""Ready-made Bayesian networks (Pyro models) used by the methods, tests, benchmarks and tutorials.

They are ordinary Pyro: ``PyroModule`` layers with ``PyroSample`` priors, usable with any guide.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch import Tensor, nn

from .base import CONVERSIONS

__all__ = ["BayesianCNN", "BayesianMLP", "mean_and_scale"]

LIKELIHOODS = ("gaussian", "heteroscedastic", "categorical")
#: Added to a mean-variance head's variance, ``softplus(raw) + 1e-6`` (Lakshminarayanan et al., 2017, §2.2.1).
VARIANCE_FLOOR = 1e-6


def _check_input_dtype(network: str, x: Tensor, first_layer: nn.Module) -> None:
    """Refuse a floating ``x`` of another dtype than the model's (its priors' scales, which the guide's parameters
    were drawn in), naming both and the fix, before PyTorch's operand error deep in the first layer."""
    dtype = first_layer.get_buffer("weight_prior_scale").dtype
    if x.is_floating_point() and x.dtype != dtype:
        raise TypeError(
            f"{network}: x is {x.dtype} but the model's priors are {dtype}; convert the data with "
            f"x.{CONVERSIONS.get(dtype, 'to')}(), or build the model and its guide under "
            f"torch.set_default_dtype({x.dtype})."
        )


def _bayesian_layer(layer: nn.Linear | nn.Conv2d, fan_in: int, prior_scale: float) -> nn.Module:
    """Turn an ``nn.Linear``/``nn.Conv2d`` into a ``PyroModule`` with ``N(0, prior_scale^2 / fan_in)`` weights."""
    weight_shape, bias_shape = list(layer.weight.shape), [layer.weight.shape[0]]
    pyro.nn.module.to_pyro_module_(layer)
    # The priors' scales are (non-persistent) buffers, so the priors follow the module's .to(device/dtype).
    layer.register_buffer("weight_prior_scale", torch.tensor(prior_scale / math.sqrt(fan_in)), persistent=False)
    layer.register_buffer("bias_prior_scale", torch.tensor(float(prior_scale)), persistent=False)
    setattr(layer, "weight", PyroSample(lambda m: _centered_normal(m.weight_prior_scale, weight_shape)))  # noqa: B010
    setattr(layer, "bias", PyroSample(lambda m: _centered_normal(m.bias_prior_scale, bias_shape)))  # noqa: B010
    return layer


def _centered_normal(scale: Tensor, shape: list[int]):
    """``N(0, scale^2)`` over a whole weight (one event), on ``scale``'s device and dtype."""
    return dist.Normal(torch.zeros_like(scale), scale).expand(shape).to_event(len(shape))


def mean_and_scale(h: Tensor) -> tuple[Tensor, Tensor]:
    r"""A mean-variance head's output ``h`` (``(N, 2 D)``: ``D`` means, then ``D`` raw variances) as the means and
    the standard deviations :math:`\sqrt{\operatorname{softplus}(\text{raw}) + 10^{-6}}`, each ``(N,)`` for
    ``D = 1``, else ``(N, D)``.

    References:
        B. Lakshminarayanan, A. Pritzel, C. Blundell. *Simple and Scalable Predictive Uncertainty Estimation using
        Deep Ensembles*. NeurIPS 2017, §2.2.1 (the variance's softplus and its floor).
    """
    mean, raw = h.chunk(2, dim=-1)
    scale = (F.softplus(raw) + VARIANCE_FLOOR).sqrt()
    return (mean.squeeze(-1), scale.squeeze(-1)) if mean.shape[-1] == 1 else (mean, scale)


def _observe(f: Tensor, y: Tensor | None, likelihood: str, noise_scale, num_data: int | None) -> None:
    pyro.deterministic("f", f)
    batch = f.shape[0]
    if num_data is not None and num_data < batch:
        raise ValueError(f"num_data={num_data} is smaller than the batch ({batch} examples).")
    subsample = torch.arange(batch, device=f.device) if num_data is not None else None
    with pyro.plate("data", num_data or batch, subsample=subsample, device=str(f.device)):
        if likelihood == "categorical":
            pyro.sample("obs", dist.Categorical(logits=f), obs=y)
        else:
            event_dims = 0 if f.dim() == 1 else 1
            pyro.sample("obs", dist.Normal(f, noise_scale).to_event(event_dims), obs=y)


class BayesianMLP(PyroModule):
    r"""Fully connected Bayesian network with a Gaussian (learned noise scale), heteroscedastic Gaussian or
    categorical likelihood.

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
    :param likelihood: ``"gaussian"`` (regression), ``"heteroscedastic"`` (regression with a mean-variance head:
        the last layer has ``2 D_out`` outputs, each target's mean and variance (:func:`mean_and_scale`), recorded
        as the sites ``f`` and ``noise``, its standard deviation; no ``noise_scale``), or ``"categorical"``
        (``D_out`` classes, logits ``f``, integer labels).
    :param dropout: Bernoulli dropout rate on the inputs of every layer after the first, active in
        every forward pass: with a point-estimate guide (``AutoDelta``) this is MC dropout
        (Gal & Ghahramani, 2016), the prior acting as weight decay.

    Shape letters: ``N`` examples, ``D_in`` inputs, ``D_out`` outputs.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §3.1–3.2 and App. D.1 (architectures, likelihood).
        Lakshminarayanan et al., NeurIPS 2017, §2.2.1 (the mean-variance head, ``"heteroscedastic"``).
    """

    def __init__(
        self,
        widths: Sequence[int],
        activation: Callable[[Tensor], Tensor] = torch.relu,
        prior_scale: float = 1.0,
        noise_scale: float = 0.1,
        learn_noise: bool = True,
        likelihood: str = "gaussian",
        dropout: float = 0.0,
    ):
        super().__init__()
        if len(widths) < 2 or any(int(w) < 1 for w in widths):
            raise ValueError(f"BayesianMLP: widths must list at least two positive sizes, got {list(widths)}.")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"BayesianMLP: likelihood must be one of {LIKELIHOODS}, got {likelihood!r}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"BayesianMLP: dropout must be in [0, 1), got {dropout!r}.")
        self.widths = [int(w) for w in widths]
        self.activation, self.likelihood, self.dropout = activation, likelihood, float(dropout)
        heads = 2 if likelihood == "heteroscedastic" else 1  # a mean-variance head: a mean and a variance per target
        layers = [
            _bayesian_layer(nn.Linear(d_in, d_out), d_in, prior_scale)
            for d_in, d_out in zip(self.widths[:-1], [*self.widths[1:-1], heads * self.widths[-1]])
        ]
        self.layers = PyroModule[nn.ModuleList](layers)  # type: ignore[arg-type]
        if likelihood in ("categorical", "heteroscedastic"):
            self.noise_scale = None
        elif learn_noise:
            self.noise_scale = PyroParam(torch.tensor(float(noise_scale)), dist.constraints.positive)
        else:
            self.register_buffer("noise_scale", torch.tensor(float(noise_scale)))

    def predict(self, x: Tensor) -> Tensor:
        """The network output ``f(x)``: ``(N,)`` for one output, else ``(N, D_out)``; with a mean-variance head
        (``"heteroscedastic"``) ``(N, 2 D_out)``, the means then the raw variances (:func:`mean_and_scale`)."""
        if x.dim() != 2 or x.shape[-1] != self.widths[0]:
            raise ValueError(f"BayesianMLP: x must have shape (N, {self.widths[0]}), got {tuple(x.shape)}.")
        _check_input_dtype("BayesianMLP", x, next(iter(self.layers)))
        h = x
        for k, layer in enumerate(self.layers):
            if k > 0 and self.dropout:
                h = F.dropout(h, self.dropout, training=True)
            h = layer(h)
            if k < len(self.layers) - 1:
                h = self.activation(h)
        return h.squeeze(-1) if self.widths[-1] == 1 and self.likelihood == "gaussian" else h

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Sample ``obs`` given ``x``; with ``num_data`` the batch's likelihood is scaled by ``num_data / N``."""
        f = self.predict(x)
        if self.likelihood == "heteroscedastic":
            f, scale = mean_and_scale(f)
            pyro.deterministic("noise", scale)
            _observe(f, y, "gaussian", scale, num_data)
        else:
            _observe(f, y, self.likelihood, self.noise_scale, num_data)
        return f


class BayesianCNN(PyroModule):
    r"""A small Bayesian CNN classifier: two 3x3 conv + ReLU + 2x2 max-pool blocks, one hidden FC layer.

    Priors as :class:`BayesianMLP` (``N(0, prior_scale^2 / fan_in)``, fan-in ``C_in k^2`` for a filter);
    categorical likelihood over ``num_classes`` logits. The paper's CNN for CIFAR/SVHN has 32 and 64
    kernels and 128 hidden units (VSD paper App. I.4); the defaults are smaller for 8x8 digits.

    :param image_shape: ``(C, H, W)`` of the inputs; ``H`` and ``W`` divisible by 4.
    :param channels: output channels of the two conv layers.
    :param hidden: width of the hidden FC layer.
    :param dropout: MC dropout rate on the inputs of the two FC layers (see :class:`BayesianMLP`).

    Shape letters: ``N`` images, ``C`` channels, ``H x W`` pixels.
    """

    def __init__(
        self,
        image_shape: Sequence[int] = (1, 8, 8),
        num_classes: int = 10,
        channels: Sequence[int] = (16, 32),
        hidden: int = 64,
        prior_scale: float = 1.0,
        dropout: float = 0.0,
    ):
        super().__init__()
        in_channels, height, width = (int(v) for v in image_shape)
        if height % 4 or width % 4:
            raise ValueError(f"BayesianCNN: image height and width must be divisible by 4, got {tuple(image_shape)}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"BayesianCNN: dropout must be in [0, 1), got {dropout!r}.")
        self.image_shape, self.dropout = (in_channels, height, width), float(dropout)
        c1, c2 = (int(c) for c in channels)
        self.conv1 = _bayesian_layer(nn.Conv2d(in_channels, c1, 3, padding=1), in_channels * 9, prior_scale)
        self.conv2 = _bayesian_layer(nn.Conv2d(c1, c2, 3, padding=1), c1 * 9, prior_scale)
        features = c2 * (height // 4) * (width // 4)
        self.fc1 = _bayesian_layer(nn.Linear(features, hidden), features, prior_scale)
        self.fc2 = _bayesian_layer(nn.Linear(hidden, num_classes), hidden, prior_scale)

    def predict(self, x: Tensor) -> Tensor:
        """Logits ``(N, num_classes)`` for images ``(N, C, H, W)``."""
        if x.dim() != 4 or tuple(x.shape[1:]) != self.image_shape:
            raise ValueError(
                f"BayesianCNN: x must have shape (N, {', '.join(map(str, self.image_shape))}), got {tuple(x.shape)}."
            )
        _check_input_dtype("BayesianCNN", x, self.conv1)
        h = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = F.max_pool2d(torch.relu(self.conv2(h)), 2).flatten(1)
        if self.dropout:
            h = F.dropout(h, self.dropout, training=True)
        h = torch.relu(self.fc1(h))
        if self.dropout:
            h = F.dropout(h, self.dropout, training=True)
        return self.fc2(h)

    def forward(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Sample ``obs`` given images ``x``; with ``num_data`` the likelihood is scaled by ``num_data / N``."""
        f = self.predict(x)
        _observe(f, y, "categorical", None, num_data)
        return f

"""What I-BLM needs to know about a model: its Bayesian layers in forward order, its likelihood, and
the inputs each layer sees.

A *layer* is an ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d`` turned into a ``PyroModule`` whose
``weight`` is a latent sample site (a ``PyroSample``); its ``bias`` may be a latent site too, a fixed
tensor, or absent. Layers are ordered by tracing the model, the order in which the forward pass
samples their weights.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.nn import PyroModule
from pyro.poutine.messenger import unwrap
from torch import Tensor, nn

from ..distributions.whvi_matrix import base_distribution
from ..infer.model_transform import model_transform

__all__ = [
    "BayesianLayer",
    "Likelihood",
    "capture_layer_inputs",
    "find_layers",
    "find_likelihood",
    "patches",
    "untransformed_model",
]

SUPPORTED_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d)


@dataclass
class BayesianLayer:
    """One layer I-BLM initializes: ``out_features`` linear regressions on ``fan_in`` (+ bias) inputs each."""

    module: nn.Module
    weight_site: str
    bias_site: str | None  #: the bias's sample site, if the bias is latent
    weight_prior: dist.Distribution
    bias_prior: dist.Distribution | None
    weight_shape: torch.Size

    @property
    def out_features(self) -> int:
        return int(self.weight_shape[0])

    @property
    def fan_in(self) -> int:
        return math.prod(self.weight_shape[1:])

    @property
    def is_conv(self) -> bool:
        return isinstance(self.module, (nn.Conv1d, nn.Conv2d))

    def fixed_bias(self) -> Tensor | None:
        """The bias when it is a plain tensor (it is then subtracted from the targets), else ``None``."""
        if self.bias_site is not None:
            return None
        bias = getattr(self.module, "bias", None)
        return bias.detach() if isinstance(bias, Tensor) else None


@dataclass
class Likelihood:
    """The observed site's family: ``"gaussian"`` (``outputs`` target columns) or ``"categorical"`` (classes)."""

    site: str
    kind: str
    outputs: int


def find_likelihood(trace) -> Likelihood:
    """The model's one observed site and its family, or a ``ValueError`` naming what was found."""
    observed = [
        (name, site)
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and site["is_observed"] and not site["infer"].get("_deterministic")
    ]
    if len(observed) != 1:
        raise ValueError(
            f"iblm_: the model must observe exactly one site (its likelihood), found {[n for n, _ in observed]}; "
            "call it with the targets, e.g. model(x, y)."
        )
    name, site = observed[0]
    fn = base_distribution(site["fn"])
    if isinstance(fn, dist.Normal):
        value = site["value"]
        outputs = 1 if value.dim() <= 1 else int(value.shape[-1])
        return Likelihood(name, "gaussian", outputs)
    if isinstance(fn, (dist.Categorical, dist.OneHotCategorical)):
        return Likelihood(name, "categorical", int(fn.probs.shape[-1]))
    raise ValueError(
        f"iblm_: likelihood {type(fn).__name__} of site {name!r} is not recognized; I-BLM handles a Normal "
        "(regression) or a Categorical/OneHotCategorical (classification, through the Dirichlet transform)."
    )


def find_layers(model: nn.Module, trace) -> list[BayesianLayer]:
    """The Bayesian layers of ``model``, in the order its forward pass (``trace``) samples their weights."""
    if not isinstance(model, PyroModule):
        raise TypeError(
            f"iblm_: the model must be a PyroModule (I-BLM finds its layers from the module structure), "
            f"got {type(model).__name__}."
        )
    order = {name: k for k, name in enumerate(trace.nodes)}
    layers = []
    for module in model.modules():
        if not isinstance(module, PyroModule):
            continue
        if isinstance(module, nn.Conv3d) or (isinstance(module, (nn.Conv1d, nn.Conv2d)) and module.groups != 1):
            raise ValueError(
                f"iblm_: {type(module).__name__} {module._pyro_get_fullname('weight')!r}: only Linear, Conv1d and "
                "Conv2d with groups=1 are supported."
            )
        if not isinstance(module, SUPPORTED_LAYERS):
            continue
        weight_site = module._pyro_get_fullname("weight")
        site = trace.nodes.get(weight_site)
        if site is None or site["type"] != "sample" or site["is_observed"]:
            continue
        bias_site = module._pyro_get_fullname("bias")
        bias = trace.nodes.get(bias_site)
        latent_bias = bias is not None and bias["type"] == "sample" and not bias["is_observed"]
        layers.append(
            BayesianLayer(
                module,
                weight_site,
                bias_site if latent_bias else None,
                site["fn"],
                bias["fn"] if latent_bias else None,
                site["value"].shape,
            )
        )
    if not layers:
        raise ValueError(
            "iblm_: the model has no supported layer: I-BLM initializes PyroModule nn.Linear/nn.Conv1d/nn.Conv2d "
            "layers whose weight is a latent PyroSample site."
        )
    return sorted(layers, key=lambda layer: order[layer.weight_site])


class _Captured(Exception):
    def __init__(self, inputs: Tensor):
        super().__init__("layer inputs captured")
        self.inputs = inputs


def capture_layer_inputs(guide, layer: BayesianLayer, x: Tensor, y: Tensor, samples: int = 1) -> Tensor:
    """The inputs ``layer`` receives when the model runs on ``x`` with latents drawn from ``guide``,
    averaged over ``samples`` draws.

    The forward pass stops at the layer (a hook raises), so later layers are neither run nor needed.
    """
    if samples > 1:
        return torch.stack([capture_layer_inputs(guide, layer, x, y) for _ in range(samples)]).mean(0)

    def hook(module, args):
        raise _Captured(args[0].detach())

    handle = layer.module.register_forward_pre_hook(hook)
    try:
        if samples == 0:  # the network at q's medians
            poutine.condition(guide.model, data=guide.median())(x, y)
        else:
            guide_trace = poutine.trace(guide).get_trace(x, y)
            poutine.replay(guide.model, trace=guide_trace)(x, y)
    except _Captured as captured:
        return captured.inputs
    finally:
        handle.remove()
    raise RuntimeError(f"iblm_: the forward pass never reached layer {layer.weight_site!r}.")


def patches(layer: BayesianLayer, inputs: Tensor) -> Tensor:
    """``(N, L, fan_in)``: the rows each output of ``layer`` regresses on (``L = 1`` for a linear layer).

    For a convolution these are the unfolded patches (I-BLM §4.4), in the order of ``weight[c].flatten()``.
    """
    module = layer.module
    if not layer.is_conv:
        return inputs.reshape(inputs.shape[0], 1, -1)
    assert isinstance(module, (nn.Conv1d, nn.Conv2d))
    if module.padding_mode != "zeros":
        raise ValueError(
            f"iblm_: conv layer {layer.weight_site!r}: padding_mode={module.padding_mode!r} is not supported."
        )
    kernel, stride, dilation = module.kernel_size, module.stride, module.dilation
    padding = module.padding
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0,) * len(kernel)
        elif all(d * (k - 1) % 2 == 0 for d, k in zip(dilation, kernel)):
            padding = tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel))
        else:
            raise ValueError(f"iblm_: conv layer {layer.weight_site!r}: padding='same' with an even kernel.")
    if isinstance(module, nn.Conv1d):
        inputs = inputs.unsqueeze(-2)
        kernel, stride, dilation, padding = (1, *kernel), (1, *stride), (1, *dilation), (0, *padding)
    unfolded = F.unfold(inputs, kernel, dilation=dilation, padding=padding, stride=stride)  # (N, fan_in, L)
    return unfolded.transpose(-1, -2)


@contextlib.contextmanager
def untransformed_model(guide) -> Iterator:
    """The user's model behind ``guide.model``, run as written inside the block (Pyro's autoguides wrap
    it in an init strategy, our structured guides transform it in place)."""
    model = unwrap(guide.model)
    transform = model_transform(model)
    with transform.untransformed() if transform is not None else contextlib.nullcontext():
        yield model

"""``bayesian_``: one call that turns an existing ``nn.Module`` into a variational network, in place.

Every ``nn.Linear`` and ``nn.Conv2d`` is swapped for its variational counterpart
(:mod:`pyro_whvi.nn`), and the module gets the execution scope of its layers' noise
(:class:`~pyro_whvi.nn.ExecutionScope`). Variational layers already in the module are adopted as
they are, so a network written with them by hand goes through the same call.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..distributions.whvi_projection import project_onto_whvi
from ..infer.lazy_weight import check_example_dim
from ..infer.site_selection import named_sites
from .base import ExecutionScope, VariationalLayer
from .mean_field import MeanFieldLinear
from .vsd import VSDConv2d, VSDLinear
from .whvi import WHVIConv2d, WHVILinear

__all__ = ["METHODS", "bayesian_"]

METHODS = ("whvi", "vsd")

_WHVI_OPTIONS = {"prior_variance", "init_scale", "bias_prior_scale"}
_VSD_OPTIONS = {"reflections", "hidden_rank", "init_alpha", "bias_prior_scale", "init_scale"}
_MEAN_FIELD_OPTIONS = {"bias_prior_scale", "init_scale"}


def _factory(like: torch.Tensor) -> dict:
    return {"device": like.device, "dtype": like.dtype}


def _linear(
    layer: nn.Linear, method: str, mean_field: bool, vectors: bool, options: dict, example_dim: int
) -> VariationalLayer:
    in_features, out_features, bias = layer.in_features, layer.out_features, layer.bias is not None
    common = {"example_dim": example_dim, **_factory(layer.weight)}
    # As the guides' default selection: WHVI takes a side of one only as a vector when asked, VSD's noise
    # needs more than one input.
    vector = min(in_features, out_features) == 1
    if mean_field or (method == "whvi" and vector and not vectors) or (method == "vsd" and in_features == 1):
        kept = {key: value for key, value in options.items() if key in _MEAN_FIELD_OPTIONS}
        return MeanFieldLinear(in_features, out_features, bias, **kept, **common)
    if method == "whvi":
        return WHVILinear(in_features, out_features, bias, **options, **common)
    return VSDLinear(in_features, out_features, bias, **options, **common)


def _conv(name: str, layer: nn.Conv2d, method: str, options: dict[str, Any]) -> VariationalLayer:
    if layer.padding_mode != "zeros":
        raise ValueError(f"bayesian_: {name!r} uses padding_mode={layer.padding_mode!r}; only 'zeros' is supported.")
    arguments: dict[str, Any] = {
        "in_channels": layer.in_channels,
        "out_channels": layer.out_channels,
        "kernel_size": layer.kernel_size,
        "stride": layer.stride,
        "padding": layer.padding,
        "dilation": layer.dilation,
        "bias": layer.bias is not None,
        **options,
        **_factory(layer.weight),
    }
    if method == "vsd":
        return VSDConv2d(groups=layer.groups, **arguments)
    if layer.groups != 1 or isinstance(layer.padding, str):
        raise ValueError(
            f"bayesian_: {name!r} has groups={layer.groups}, padding={layer.padding!r}; WHVIConv2d takes groups=1 and "
            f"numeric padding. Leave it deterministic with skip=[{name!r}] or use method='vsd'."
        )
    return WHVIConv2d(**arguments)


@torch.no_grad()
def _keep_weights(old: nn.Linear | nn.Conv2d, new: VariationalLayer) -> None:
    """Start ``new``'s posterior mean at ``old``'s weight and bias (WHVI: the closest WHVI matrix, App. B)."""
    if isinstance(new, (WHVILinear, WHVIConv2d)):
        weight, start = old.weight.double(), (new.s1.double(), new.s2.double())
        s1, g, s2 = project_onto_whvi(weight, new.layout, *start, new.prior_variance)
        new.s1.copy_(s1)
        new.s2.copy_(s2)
        if g is not None:
            new.g_loc.copy_(g)
    elif isinstance(new, MeanFieldLinear):
        new.weight_loc.copy_(old.weight)
    elif isinstance(new, (VSDLinear, VSDConv2d)):
        new.theta.copy_(old.weight)
    if new.bias_loc is not None and old.bias is not None:
        new.bias_loc.copy_(old.bias)


def _adopt(module: nn.Module) -> nn.Module:
    scope = getattr(module, "_variational_execution", None)
    if scope is None:
        scope = ExecutionScope()
        scope.handles = [
            module.register_forward_pre_hook(scope.enter),
            module.register_forward_hook(scope.exit, always_call=True),
        ]
        module.__dict__["_variational_execution"] = scope
    for name, layer in module.named_modules():
        if isinstance(layer, VariationalLayer):
            layer.execution, layer.execution_key = scope, name
    return module


def bayesian_(
    module: nn.Module,
    method: str = "whvi",
    *,
    mean_field_last_layer: bool = False,
    whvi_vectors: bool = False,
    sites: str | None = None,
    preset: str | None = None,
    skip: Iterable[str] = (),
    keep_weights: bool = False,
    example_dim: int = 0,
    **options,
) -> nn.Module:
    r"""Swap the ``nn.Linear`` / ``nn.Conv2d`` layers of ``module`` for variational layers, in place.

    ``method="whvi"``: :class:`WHVILinear` / :class:`WHVIConv2d`; a linear layer with one input or one
    output becomes a :class:`MeanFieldLinear` (WHVI covers it only as a reshaped vector: ``whvi_vectors``).
    ``method="vsd"``: :class:`VSDLinear` / :class:`VSDConv2d`; a linear layer with one input becomes a
    :class:`MeanFieldLinear` (noise on a single input is not dropout). Both follow the structured
    guides' default choice of sites.

    :param module: the network (also a single layer: it is then replaced inside nothing, so pass a
        container such as ``nn.Sequential``).
    :param mean_field_last_layer: make the last ``nn.Linear`` (in the order of ``module.named_modules()``,
        the definition order) a :class:`MeanFieldLinear`, as in the paper's experiments (§3.2).
    :param whvi_vectors: WHVI also takes the linear layers with one input or one output, as reshaped
        vectors (§2.5; the guide's ``expose="all"``), instead of making them mean-field.
    :param sites: ``"paper"``: the WHVI paper's experiments (§3.2), ``whvi_vectors=True`` and
        ``mean_field_last_layer=True`` (as the guides' ``sites=``, :data:`pyro_whvi.infer.site_selection.NAMED_SITES`).
    :param preset: the deprecated name of ``sites`` (a ``DeprecationWarning``; removed in the next release).
    :param skip: names (as in ``named_modules()``) of layers to leave deterministic (also those of layers it
        cannot convert, which it otherwise names in a warning).
    :param keep_weights: start each posterior mean at the layer's current weight and bias (a
        pretrained network); otherwise the layers' own initialization (that of the structured guides).
    :param example_dim: the dimension of a linear layer's input that indexes examples.
    :param options: keyword arguments of the layers (``prior_variance``, ``init_scale``,
        ``bias_prior_scale`` for WHVI; ``reflections``, ``hidden_rank``, ``init_alpha``,
        ``bias_prior_scale``, ``init_scale`` for VSD).
    :returns: ``module``, with the execution scope of its variational layers installed.

    References:
        WHVI paper (Rossi et al., NeurIPS 2020), §3.2–3.3, App. B; VSD paper (Nguyen et al., NeurIPS
        2021), §3.4.
    """
    settings = named_sites(sites, preset, "bayesian_")
    whvi_vectors = whvi_vectors or settings.get("expose") == "all"
    mean_field_last_layer = mean_field_last_layer or settings.get("mean_field_last_layer", False)
    if method not in METHODS:
        raise ValueError(f"bayesian_: method must be one of {METHODS}, got {method!r}.")
    if not isinstance(module, nn.Module):
        raise TypeError(f"bayesian_: expected an nn.Module, got {type(module).__name__}.")
    example_dim = check_example_dim(example_dim, "bayesian_")
    allowed = _WHVI_OPTIONS if method == "whvi" else _VSD_OPTIONS
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"bayesian_: unknown option(s) {unknown} for method={method!r}; allowed: {sorted(allowed)}.")
    skip = set(skip)
    inside = [name + "." for name, layer in module.named_modules() if isinstance(layer, VariationalLayer)]
    targets = [  # a variational layer's own modules (VSD's Householder steps) are its business
        (name, layer)
        for name, layer in module.named_modules()
        if type(layer) in (nn.Linear, nn.Conv2d) and not any(name.startswith(prefix) for prefix in inside)
    ]
    target_names = {name for name, _ in targets}
    unsupported = {  # layers with a weight matrix or kernel that no variational layer replaces (Conv1d, ...)
        name: type(layer).__name__
        for name, layer in module.named_modules()
        if name not in target_names
        and not isinstance(layer, VariationalLayer)
        and not any(name.startswith(prefix) for prefix in inside)
        and any(parameter.dim() >= 2 for parameter in layer.parameters(recurse=False))
    }
    missing = skip - target_names - set(unsupported)
    if missing:
        raise ValueError(f"bayesian_: skip names {sorted(missing)} are not nn.Linear/nn.Conv2d layers of the module.")
    left = {name: kind for name, kind in unsupported.items() if name not in skip}
    if left:
        named = ", ".join(f"{name!r} ({kind})" for name, kind in left.items())
        warnings.warn(
            f"bayesian_: {named} stay deterministic (only nn.Linear and nn.Conv2d have variational counterparts); "
            f"pass skip={sorted(left)} to say that this is intended.",
            stacklevel=2,
        )
    linears = [name for name, layer in targets if type(layer) is nn.Linear and name not in skip]
    last = linears[-1] if mean_field_last_layer and linears else None
    if mean_field_last_layer and last is None:
        raise ValueError("bayesian_: mean_field_last_layer=True but the module has no nn.Linear to make mean-field.")
    if any(name == "" for name, _ in targets):
        raise ValueError(
            f"bayesian_: the module itself is an {type(module).__name__}; wrap it (e.g. nn.Sequential(layer)) so "
            "that it can be replaced inside its container."
        )
    for name, layer in targets:
        if name in skip:
            continue
        if isinstance(layer, nn.Linear):
            new = _linear(layer, method, name == last, whvi_vectors, options, example_dim)
        else:
            new = _conv(name, layer, method, options)
        if keep_weights:
            _keep_weights(layer, new)
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name), child, new)
    return _adopt(module)

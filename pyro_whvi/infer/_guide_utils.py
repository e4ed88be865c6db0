"""Small helpers of the structured guides: nested attribute access, in-place parameter writes, prior scales,
quantiles, the default WHVI site."""

from __future__ import annotations

from operator import attrgetter

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.infer.autoguide.utils import deep_setattr
from pyro.nn import PyroModule, PyroParam
from torch import nn
from torch.distributions import transform_to

from ..distributions.whvi_matrix import base_distribution, has_real_support

__all__ = [
    "assign_param_",
    "deep_getattr",
    "deep_set_param",
    "empirical_quantiles",
    "has_deep_attr",
    "is_default_whvi_weight",
    "like_tensor",
    "marginal_std",
    "normal_quantiles",
    "prior_stddev",
    "pyro_params_",
]


def deep_getattr(obj, name: str):
    """``obj.a.b.c`` for ``name = "a.b.c"`` (the counterpart of Pyro's ``deep_setattr``)."""
    return attrgetter(name)(obj)


def has_deep_attr(obj, name: str) -> bool:
    try:
        deep_getattr(obj, name)
    except AttributeError:
        return False
    return True


def deep_set_param(container: PyroModule, name: str, value: PyroParam | nn.Module) -> None:
    """``deep_setattr(container, name, value)`` for a guide's new ``PyroParam`` (or module of them), refusing
    a param-store entry of another shape under the same name.

    Pyro hands a ``PyroParam`` the store's value whenever its name is there, so a second guide of the
    same class, built for a model of another shape without :func:`pyro.clear_param_store`, would read
    the first one's tensors and fail later on a shape (Pyro's ``AutoNormal`` does, with "Model and
    guide shapes disagree"). Entries of the same shape, e.g. from a loaded param store, are used as Pyro uses them.
    """
    if isinstance(value, PyroParam) and isinstance(value.init_value, torch.Tensor):
        _refuse_stale(f"{container._pyro_name}.{name}", value.init_value.shape)
    deep_setattr(container, name, value)
    if isinstance(value, PyroModule):  # its parameters are read from the store only when first accessed
        for submodule in value.modules():
            if isinstance(submodule, PyroModule):
                for attr, (constraint, _) in submodule._pyro_params.items():
                    own = transform_to(constraint)(submodule._parameters[attr + "_unconstrained"])
                    _refuse_stale(submodule._pyro_get_fullname(attr), own.shape)


def _refuse_stale(fullname: str, shape: torch.Size) -> None:
    store = pyro.get_param_store()
    if pyro.settings.get("module_local_params") or fullname not in store:  # module-local: the store is not read
        return
    stored = store[fullname].shape
    if stored != shape:
        raise ValueError(
            f"The param store already holds {fullname!r} with shape {tuple(stored)}, left by an earlier guide of "
            f"the same class; this guide's has shape {tuple(shape)}. Call pyro.clear_param_store() before "
            "building a guide for another model."
        )


def assign_param_(container, name: str, value: torch.Tensor, what: str) -> None:
    """Overwrite the constrained value of the ``PyroParam`` ``container.<name>`` in place.

    In place, so that an optimizer already holding the parameter keeps working; the param store's
    copy, when it is another tensor, is updated too. Errors start with ``what``.
    """
    parent_name, _, attr = name.rpartition(".")
    parent = deep_getattr(container, parent_name) if parent_name else container
    if attr not in getattr(parent, "_pyro_params", {}):
        raise KeyError(f"{what}: the guide has no parameter {name!r}.")
    constraint, _ = parent._pyro_params[attr]
    unconstrained = getattr(parent, attr + "_unconstrained")
    if unconstrained.shape != value.shape:
        raise ValueError(
            f"{what}: parameter {name!r} has shape {tuple(unconstrained.shape)}, got {tuple(value.shape)}."
        )
    new = transform_to(constraint).inv(value.to(unconstrained))
    with torch.no_grad():
        unconstrained.copy_(new)
        stored = dict(pyro.get_param_store().named_parameters()).get(parent._pyro_get_fullname(attr))
        if stored is not None and stored is not unconstrained:
            stored.copy_(new)


def is_default_whvi_weight(fn) -> bool:
    """Whether ``AutoWHVIGuide`` takes a site with prior ``fn`` by default: one real matrix with both sides > 1."""
    shape = fn.event_shape
    return (
        fn.batch_shape == torch.Size()
        and len(shape) == 2
        and shape[0] > 1
        and shape[1] > 1
        and not getattr(fn.support, "is_discrete", False)
    )


def like_tensor(fn) -> torch.Tensor:
    """A tensor with ``fn``'s dtype and device (its mean where it has one), to create parameters like it."""
    try:
        return fn.mean
    except NotImplementedError:
        return torch.zeros(())


def prior_stddev(fn, like: torch.Tensor) -> torch.Tensor | float:
    """The prior's standard deviation for a real-valued site (so init scales follow e.g. a fan-in prior), else 1."""
    if not has_real_support(fn):
        return 1.0
    try:
        stddev = fn.stddev.detach()
    except (NotImplementedError, AttributeError):
        return 1.0
    # Elementwise, without a data-dependent branch: no device synchronization (and it runs on "meta").
    stddev = torch.where(torch.isfinite(stddev) & (stddev > 0), stddev, torch.ones_like(stddev))
    try:
        return stddev.expand(like.shape)
    except RuntimeError:
        return 1.0


def normal_quantiles(loc, scale, levels):
    levels = levels.to(dtype=loc.dtype, device=loc.device).reshape((-1,) + (1,) * loc.dim())
    return dist.Normal(loc, scale).icdf(levels)


def empirical_quantiles(samples, levels):
    return torch.quantile(samples, levels.to(samples.dtype), dim=0)


def marginal_std(posterior):
    return base_distribution(posterior).variance.sqrt()


def pyro_params_(module: nn.Module) -> nn.Module:
    """Turn every plain ``nn.Parameter`` of the ``PyroModule`` s in ``module`` into an unconstrained ``PyroParam``.

    With ``pyro.settings.set(module_local_params=True)`` Pyro hands a plain ``nn.Parameter`` of a
    ``PyroModule`` to ``pyro.param`` handlers as it is, without the ``unconstrained()`` accessor that
    ``SVI.step`` calls (Pyro's own ``AutoIAFNormal`` fails the same way); a ``PyroParam`` has it in
    both modes. Values and the module's behaviour are unchanged; ``state_dict`` keys gain ``_unconstrained``.
    """
    for submodule in module.modules():
        if not isinstance(submodule, PyroModule):
            continue
        for name in [name for name in submodule._parameters if not name.endswith("_unconstrained")]:
            value = submodule._parameters.pop(name)
            if value is not None:
                setattr(submodule, name, PyroParam(value.detach().clone(), constraints.real))
    return module

"""The reparameterized model that :class:`~pyro_whvi.AutoWHVIGuide` exposes as ``guide.model``.

It runs the user's model with every selected weight site replaced by WHVI's latent ``g`` and a lazy
weight, and checks on every run that the model still has the sites the guide was built for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger

from ..distributions import WHVILayout
from .reparam import check_whvi_site, g_site_name

if TYPE_CHECKING:
    from .autoguide import AutoWHVIGuide

__all__ = ["ReparameterizedModel", "SiteFilter", "select_whvi_sites"]

SiteFilter = str | Iterable[str] | Callable[[str], bool]


def _matches(site_filter: SiteFilter | None, name: str) -> bool:
    if site_filter is None:
        return False
    if callable(site_filter):
        return bool(site_filter(name))
    return name in set(site_filter)


def _is_default_weight(fn) -> bool:
    shape = fn.event_shape
    return (
        fn.batch_shape == torch.Size()
        and len(shape) == 2
        and shape[0] > 1
        and shape[1] > 1
        and not getattr(fn.support, "is_discrete", False)
    )


def _whvi_capable(name: str, fn) -> bool:
    try:
        check_whvi_site(name, fn)
    except ValueError:
        return False
    return True


def _latent_sites(trace) -> dict:
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and type(site["fn"]).__name__ != "_Subsample"
    }


def select_whvi_sites(
    model: Callable,
    args: tuple,
    kwargs: dict,
    *,
    expose: SiteFilter | None,
    hide: SiteFilter | None,
    last_mean_field: bool,
) -> tuple[dict[str, torch.Size | None], dict[str, WHVILayout]]:
    """Latent site shapes of ``model`` and the WHVI layout of each selected weight site.

    ``expose="all"`` selects every real-valued latent site with at least two entries outside plates.

    :raises ValueError: for an exposed site that does not exist or that WHVI cannot take.
    """
    with poutine.block():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    sites = _latent_sites(trace)
    if isinstance(hide, str):
        hide = [hide]
    if isinstance(expose, str) and expose != "all":
        expose = [expose]
    if expose == "all":
        expose = [name for name, site in sites.items() if _whvi_capable(name, site["fn"])]
    if expose is not None and not callable(expose):
        missing = sorted(set(expose) - set(sites))
        if missing:
            raise ValueError(
                f"AutoWHVIGuide: expose names {missing}, which are not latent sites; sites: {sorted(sites)}."
            )
    selected = [
        name
        for name, site in sites.items()
        if (_matches(expose, name) if expose is not None else _is_default_weight(site["fn"]))
        and not _matches(hide, name)
    ]
    if last_mean_field and selected:
        selected = selected[:-1]
    layouts = {name: check_whvi_site(name, sites[name]["fn"]) for name in selected}
    # Every sample site counts (observed ones may be sampled later, e.g. by Predictive); shapes are
    # checked only for latent sites outside plates, which cannot change with the data size.
    shapes = {
        name: None if site["cond_indep_stack"] or site["is_observed"] else cast(TorchDistribution, site["fn"]).shape()
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and type(site["fn"]).__name__ != "_Subsample"
    }
    return shapes, layouts


class _WHVISites(Messenger):
    def __init__(self, guide: AutoWHVIGuide):
        super().__init__()
        self.guide = guide
        self.g_sites = {g_site_name(name) for name in guide.whvi_layouts or {}}
        self.visited: set[str] = set()

    def _pyro_sample(self, msg):
        name = msg["name"]
        if type(msg["fn"]).__name__ == "_Subsample" or name in self.g_sites:
            return
        guide = self.guide
        expected = guide.model_site_shapes
        if expected is not None and name not in expected:
            raise RuntimeError(
                f"AutoWHVIGuide: the model has a latent site {name!r} that it did not have when the guide was set "
                f"up (sites then: {sorted(expected)}). The guide belongs to a different model structure; build a new "
                "AutoWHVIGuide for this model."
            )
        if expected is not None and expected[name] is not None and msg["fn"].shape() != expected[name]:
            raise RuntimeError(
                f"AutoWHVIGuide: site {name!r} now has shape {tuple(msg['fn'].shape())}, but the guide was set up "
                f"for {tuple(expected[name])}; build a new AutoWHVIGuide for the changed model."
            )
        if msg["is_observed"] or name not in (guide.whvi_layouts or {}):
            return
        new_msg = guide.reparam.apply({"name": name, "fn": msg["fn"], "value": None, "is_observed": False})
        msg["fn"], msg["value"], msg["is_observed"] = new_msg["fn"], new_msg["value"], new_msg["is_observed"]
        self.visited.add(name)


class ReparameterizedModel:
    """``guide.model``: the user's model with the guide's WHVI sites reparameterized.

    Pyro's ``SVI``, ``Predictive`` and ELBOs take it in place of the original model.
    """

    def __init__(self, model: Callable, guide: AutoWHVIGuide):
        self.original_model = model
        self._guide = (guide,)  # a tuple, so that nn.Module does not register the guide twice

    def __call__(self, *args, **kwargs):
        guide = self._guide[0]
        if guide.whvi_layouts is None:
            guide.select_sites(self.original_model, *args, **kwargs)
        sites = _WHVISites(guide)
        with InitMessenger(guide.init_loc_fn) if guide._in_setup else contextlib.nullcontext(), sites:
            result = self.original_model(*args, **kwargs)
        missing = sorted(set(guide.whvi_layouts or {}) - sites.visited)
        if missing and guide.prototype_trace is not None:
            raise RuntimeError(
                f"AutoWHVIGuide: the model no longer samples the WHVI sites {missing}; the guide belongs to a "
                "different model structure, build a new AutoWHVIGuide for this model."
            )
        return result

    def __repr__(self) -> str:
        return f"ReparameterizedModel({self.original_model!r})"

"""The reparameterized model that the structured guides expose as ``guide.model``.

It runs the user's model with every selected weight site handed to the guide's
``replace_model_site`` hook (WHVI: the latent ``g`` and a lazy weight; VSD: the empirical-Bayes
prior), and checks on every run that the model still has the sites the guide was built for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.poutine.messenger import Messenger

__all__ = ["ReparameterizedModel", "SiteFilter", "select_sites"]

SiteFilter = str | Iterable[str] | Callable[[str], bool]


def _matches(site_filter: SiteFilter | None, name: str) -> bool:
    if site_filter is None:
        return False
    if callable(site_filter):
        return bool(site_filter(name))
    return name in set(site_filter)


def _capable(check_site: Callable, name: str, fn) -> bool:
    try:
        check_site(name, fn)
    except ValueError:
        return False
    return True


def _latent_sites(trace) -> dict:
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and type(site["fn"]).__name__ != "_Subsample"
    }


def select_sites(
    model: Callable,
    args: tuple,
    kwargs: dict,
    *,
    expose: SiteFilter | None,
    hide: SiteFilter | None,
    last_mean_field: bool,
    check_site: Callable[[str, Any], Any],
    is_default: Callable[[Any], bool],
    guide_name: str,
) -> tuple[dict[str, torch.Size | None], dict[str, Any]]:
    """Sample-site shapes of ``model`` and ``check_site(name, prior)`` for each selected weight site.

    Without ``expose`` the sites whose prior passes ``is_default`` are selected; ``expose="all"``
    selects every latent site that ``check_site`` accepts.

    :raises ValueError: for an exposed site that does not exist or that ``check_site`` rejects.
    """
    with poutine.block():
        trace = poutine.trace(model).get_trace(*args, **kwargs)
    sites = _latent_sites(trace)
    if isinstance(hide, str):
        hide = [hide]
    if isinstance(expose, str) and expose != "all":
        expose = [expose]
    if expose == "all":
        expose = [name for name, site in sites.items() if _capable(check_site, name, site["fn"])]
    if expose is not None and not callable(expose):
        missing = sorted(set(expose) - set(sites))
        if missing:
            raise ValueError(
                f"{guide_name}: expose names {missing}, which are not latent sites; sites: {sorted(sites)}."
            )
    selected = [
        name
        for name, site in sites.items()
        if (_matches(expose, name) if expose is not None else is_default(site["fn"])) and not _matches(hide, name)
    ]
    if last_mean_field and selected:
        selected = selected[:-1]
    layouts = {name: check_site(name, sites[name]["fn"]) for name in selected}
    # Every sample site counts (observed ones may be sampled later, e.g. by Predictive); shapes are
    # checked only for latent sites outside plates, which cannot change with the data size.
    shapes = {
        name: None if site["cond_indep_stack"] or site["is_observed"] else cast(TorchDistribution, site["fn"]).shape()
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and type(site["fn"]).__name__ != "_Subsample"
    }
    return shapes, layouts


class _StructuredSites(Messenger):
    def __init__(self, guide):
        super().__init__()
        self.guide = guide
        self.auxiliary = guide.auxiliary_model_sites()
        self.visited: set[str] = set()

    def _pyro_sample(self, msg):
        name = msg["name"]
        if type(msg["fn"]).__name__ == "_Subsample" or name in self.auxiliary:
            return
        guide = self.guide
        guide_name = type(guide).__name__
        expected = guide.model_site_shapes
        if expected is not None and name not in expected:
            raise RuntimeError(
                f"{guide_name}: the model has a latent site {name!r} that it did not have when the guide was set "
                f"up (sites then: {sorted(expected)}). The guide belongs to a different model structure; build a new "
                f"{guide_name} for this model."
            )
        if expected is not None and expected[name] is not None and msg["fn"].shape() != expected[name]:
            raise RuntimeError(
                f"{guide_name}: site {name!r} now has shape {tuple(msg['fn'].shape())}, but the guide was set up "
                f"for {tuple(expected[name])}; build a new {guide_name} for the changed model."
            )
        if msg["is_observed"] or name not in (guide.structured_sites or {}):
            return
        guide.replace_model_site(msg)
        self.visited.add(name)


class ReparameterizedModel:
    """``guide.model``: the user's model with the guide's weight sites reparameterized.

    Pyro's ``SVI``, ``Predictive`` and ELBOs take it in place of the original model. The guide
    provides ``structured_sites``, ``select_sites``, ``auxiliary_model_sites`` and ``replace_model_site``.
    """

    def __init__(self, model: Callable, guide):
        self.original_model = model
        self._guide = (guide,)  # a tuple, so that nn.Module does not register the guide twice

    def __call__(self, *args, **kwargs):
        guide = self._guide[0]
        if guide.structured_sites is None:
            guide.select_sites(self.original_model, *args, **kwargs)
        sites = _StructuredSites(guide)
        with InitMessenger(guide.init_loc_fn) if guide._in_setup else contextlib.nullcontext(), sites:
            result = self.original_model(*args, **kwargs)
        missing = sorted(set(guide.structured_sites or {}) - sites.visited)
        if missing and guide.prototype_trace is not None:
            name = type(guide).__name__
            raise RuntimeError(
                f"{name}: the model no longer samples the weight sites {missing}; the guide belongs to a "
                f"different model structure, build a new {name} for this model."
            )
        return result

    def __repr__(self) -> str:
        return f"ReparameterizedModel({self.original_model!r})"

"""Which sites a structured guide takes: :func:`~pyro_whvi.infer.site_selection.select_sites` runs the untransformed
model once and keeps the latent sites that pass the guide's checks and its ``expose``/``hide`` filters (``SiteFilter``:
names, a predicate or ``"all"``), and, if asked, leaves the last layer mean-field (WHVI paper §3.2)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from pyro import poutine
from pyro.distributions import TorchDistribution

__all__ = ["NAMED_SITES", "PRESETS", "SiteFilter", "last_layer_sites", "layer_of", "named_sites", "select_sites"]

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


def layer_of(site_name: str) -> str:
    """The layer a site belongs to: its ``PyroModule`` path (``"layers.1"`` for ``"layers.1.weight"``).

    A site outside any submodule (a plain ``pyro.sample`` name without a dot) is a layer of its own.
    """
    return site_name.rpartition(".")[0] or site_name


def last_layer_sites(sites: dict) -> list[str]:
    """Every latent site of the last layer: the module of the last site in execution order with a
    matrix- or filter-shaped event (a weight), with its bias and any other site of that module."""
    weights = [name for name, site in sites.items() if len(cast(TorchDistribution, site["fn"]).event_shape) >= 2]
    if not weights:
        return []
    last = layer_of(weights[-1])
    return [name for name in sites if layer_of(name) == last]


def select_sites(
    model: Callable,
    args: tuple,
    kwargs: dict,
    *,
    expose: SiteFilter | None,
    hide: SiteFilter | None,
    mean_field_last_layer: bool,
    check_site: Callable[[str, Any], Any],
    is_default: Callable[[Any], bool],
    guide_name: str,
) -> tuple[dict[str, torch.Size | None], dict[str, Any]]:
    """Sample-site shapes of ``model`` and ``check_site(name, prior)`` for each selected weight site.

    Without ``expose`` the sites whose prior passes ``is_default`` are selected; ``expose="all"``
    selects every latent site that ``check_site`` accepts. ``mean_field_last_layer`` leaves out
    every site of the last layer (:func:`last_layer_sites`): its weight and its bias together.

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
    excluded = set(last_layer_sites(sites)) if mean_field_last_layer else set()
    selected = [
        name
        for name, site in sites.items()
        if (_matches(expose, name) if expose is not None else is_default(site["fn"]))
        and not _matches(hide, name)
        and name not in excluded
    ]
    layouts = {name: check_site(name, sites[name]["fn"]) for name in selected}
    # Every sample site counts (observed ones may be sampled later, e.g. by Predictive); shapes are
    # checked only for latent sites outside plates, which cannot change with the data size.
    shapes = {
        name: None if site["cond_indep_stack"] or site["is_observed"] else cast(TorchDistribution, site["fn"]).shape()
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and type(site["fn"]).__name__ != "_Subsample"
    }
    return shapes, layouts


#: Named site selections (``sites=``): ``"paper"`` is the set-up of the WHVI paper's UCI and classification
#: experiments (§3.2): every weight and bias on WHVI blocks, the last layer (weight and bias) mean-field.
NAMED_SITES: dict[str, dict] = {"paper": {"expose": "all", "mean_field_last_layer": True}}
#: The name of :data:`NAMED_SITES` before ``preset=`` became ``sites=``; kept for one release.
PRESETS = NAMED_SITES


def named_sites(sites: str | None, preset: str | None, owner: str) -> dict:
    """The settings of the named selection ``sites`` (or of ``preset``, its deprecated name), else ``{}``."""
    if preset is not None:
        warnings.warn(
            f"{owner}: preset= is now sites= (the same names); preset= will be removed in the next release.",
            DeprecationWarning,
            stacklevel=3,
        )
        if sites is not None and sites != preset:
            raise ValueError(f"{owner}: pass sites= alone (preset= is its deprecated name), got both.")
        sites = preset
    if sites is not None and sites not in NAMED_SITES:
        raise ValueError(f"{owner}: sites must be one of {sorted(NAMED_SITES)} or None, got {sites!r}.")
    return NAMED_SITES[sites] if sites is not None else {}

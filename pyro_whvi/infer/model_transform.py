"""How a structured guide transforms its model: in place, so that one model object goes everywhere.

A structured guide (:class:`~pyro_whvi.AutoWHVIGuide`, :class:`~pyro_whvi.AutoVSDGuide`) changes
the model it is built for: each selected weight site is handed to the guide's ``replace_model_site``
hook (WHVI: the latent ``g`` and a lazy weight; VSD: the empirical-Bayes prior). This is Pyro's
``poutine.reparam`` with a strategy, applied by forward hooks on the user's ``nn.Module`` instead
of a wrapper function, so that the object the user holds *is* the transformed model: the same
``model`` goes to ``SVI``, ``Trace_ELBO()(model, guide)``, ``Predictive`` and ``iblm_``, it keeps
its parameters, ``state_dict`` and ``.to()``, and no call can reach the untransformed model by
mistake. (``poutine.reparam`` itself would return a function, and it validates each weight value
against the original prior, which forms the dense WHVI weight on every step.)

Plain model functions are wrapped once in :class:`ModelModule`. A model carries one structured
guide at a time: building another one on it moves the transformation to the new guide, and the
old guide then refuses to run. :func:`remove_transform` gives the model back untransformed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, cast

import torch
from pyro import poutine
from pyro.distributions import TorchDistribution
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.replay_messenger import ReplayMessenger
from pyro.poutine.runtime import _PYRO_STACK
from torch import nn

from .guide_contract import TransformingGuide

__all__ = ["GUIDE_KEY", "ModelModule", "ModelTransform", "SiteFilter", "remove_transform", "select_sites"]

#: ``infer`` key with which a structured guide marks the sites it samples for a weight.
GUIDE_KEY = "pyro_whvi_guide"

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
        self._check_replayed_guide(name)
        guide.replace_model_site(msg)
        self.visited.add(name)

    def _check_replayed_guide(self, name: str) -> None:
        """Refuse a replayed guide trace that another guide (e.g. ``AutoNormal``) made for this weight:
        it would train the transformed model, not the one the user wrote, without a word."""
        guide_site = self.guide.guide_site(name)
        for messenger in reversed(_PYRO_STACK):
            trace = getattr(messenger, "trace", None) if isinstance(messenger, ReplayMessenger) else None
            if trace is None or guide_site not in trace:
                continue
            if not trace.nodes[guide_site]["infer"].get(GUIDE_KEY):
                guide_name = type(self.guide).__name__
                raise RuntimeError(
                    f"Weight site {name!r}: the model is transformed in place for an {guide_name}, but another "
                    f"guide sampled {guide_site!r}. Give the model back first with "
                    "pyro_whvi.infer.remove_transform(model), or build the other guide on a fresh model."
                )
            return


class ModelModule(PyroModule):
    """A Pyro model function as a ``PyroModule``, so that a structured guide can transform it in place.

    ``model = ModelModule(model_fn)`` once, then use ``model`` everywhere (guide, ``SVI``, ``Predictive``).
    """

    def __init__(self, fn: Callable):
        super().__init__()
        if not callable(fn):
            raise TypeError(f"ModelModule: expected a model function, got {type(fn).__name__}.")
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ModelModule({getattr(self.fn, '__qualname__', self.fn)!r})"


# The transforms suspended in this thread/task (ids), by ModelTransform.untransformed.
_SUSPENDED: ContextVar[frozenset[int]] = ContextVar("pyro_whvi_untransformed", default=frozenset())


class _PreHook:
    def __init__(self, transform: ModelTransform):
        self.transform = transform

    def __call__(self, module, args, kwargs):
        self.transform._enter(args, kwargs)


class _PostHook:
    def __init__(self, transform: ModelTransform):
        self.transform = transform

    def __call__(self, module, args, kwargs, output):
        self.transform._exit()


class ModelTransform:
    """A structured guide's transformation of its model, installed on the model by forward hooks.

    What it needs of the guide is :class:`~pyro_whvi.infer.guide_contract.TransformingGuide`, and nothing more.

    :param model: the user's ``nn.Module`` (a ``PyroModule`` model, or a :class:`ModelModule`).
    :param guide: the structured guide it belongs to.
    """

    def __init__(self, model: nn.Module, guide: TransformingGuide):
        self._guide = (guide,)  # a tuple, so that nn.Module does not register the guide twice
        if not isinstance(model, nn.Module):
            name = type(guide).__name__
            raise TypeError(
                f"{name}: the model must be an nn.Module (a PyroModule, say), which the guide transforms in place "
                f"so that the same object goes to SVI, Predictive and iblm_; got {type(model).__name__}. Wrap a "
                f"model function once: model = pyro_whvi.infer.ModelModule(model), then {name}(model)."
            )
        self.model = model
        self._open: list[list] = []
        self.attached = True
        remove_transform(model)
        self._handles = [
            model.register_forward_pre_hook(_PreHook(self), with_kwargs=True),
            model.register_forward_hook(_PostHook(self), with_kwargs=True, always_call=True),
        ]

    def detach(self) -> None:
        """Take the hooks off the model; the guide refuses to run afterwards."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.attached = False

    def check_attached(self) -> None:
        if not self.attached:
            name = type(self._guide[0]).__name__
            raise RuntimeError(
                f"{name}: its model was transformed for another structured guide since, or given back with "
                f"remove_transform(); a model serves one structured guide at a time. Build a new {name}(model)."
            )

    @contextlib.contextmanager
    def untransformed(self):
        """Run the model as the user wrote it inside this block (site selection, I-BLM's layer search)."""
        token = _SUSPENDED.set(_SUSPENDED.get() | {id(self)})
        try:
            yield self.model
        finally:
            _SUSPENDED.reset(token)

    def select(self, args, kwargs) -> None:
        """Let the guide choose its sites from one run of the untransformed model."""
        # Inside the model's own call (a pre-hook) its PyroModule context is already open and would keep
        # the selection run's samples in its cache: the real run would then record no sample site.
        context = getattr(self.model, "_pyro_context", None)
        cached = dict(context.cache) if context is not None else {}
        with self.untransformed():
            self._guide[0].select_sites(self.model, *args, **kwargs)
        if context is not None:
            context.cache.clear()
            context.cache.update(cached)

    def _enter(self, args, kwargs) -> None:
        # Pushed first: if anything below raises, the always-called post-hook still finds its entry.
        entry: list = [contextlib.ExitStack(), None]
        self._open.append(entry)
        if id(self) in _SUSPENDED.get():
            return
        guide = self._guide[0]
        if guide.structured_sites is None:
            self.select(args, kwargs)
        if guide.in_setup:
            entry[0].enter_context(InitMessenger(guide.init_loc_fn))
        entry[1] = _StructuredSites(guide)
        entry[0].enter_context(entry[1])

    def _exit(self) -> None:
        stack, sites = self._open.pop()
        failed = sys.exc_info()[0] is not None  # always_call: the hook also runs while an error propagates
        stack.__exit__(*sys.exc_info())
        if failed or sites is None:
            return
        guide = self._guide[0]
        missing = sorted(set(guide.structured_sites or {}) - sites.visited)
        if missing and guide.prototype_trace is not None:
            name = type(guide).__name__
            raise RuntimeError(
                f"{name}: the model no longer samples the weight sites {missing}; the guide belongs to a "
                f"different model structure, build a new {name} for this model."
            )

    def __repr__(self) -> str:
        return f"ModelTransform({type(self._guide[0]).__name__} on {type(self.model).__name__})"


def model_transform(model) -> ModelTransform | None:
    """The structured guide's transformation installed on ``model``, if any."""
    hooks = getattr(model, "_forward_pre_hooks", {})
    for hook in hooks.values():
        if isinstance(hook, _PreHook):
            return hook.transform
    return None


def remove_transform(model) -> None:
    """Give ``model`` back untransformed (its structured guide, if any, refuses to run afterwards)."""
    transform = model_transform(model)
    if transform is not None:
        transform.detach()

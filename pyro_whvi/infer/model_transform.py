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
from collections.abc import Callable
from contextvars import ContextVar

from pyro.infer.autoguide.initialization import InitMessenger
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.replay_messenger import ReplayMessenger
from pyro.poutine.runtime import _PYRO_STACK
from torch import nn

from .guide_contract import TransformingGuide
from .site_selection import SiteFilter, select_sites

# SiteFilter and select_sites are re-exported here, where they were defined before site_selection.py.
__all__ = ["GUIDE_KEY", "ModelModule", "ModelTransform", "SiteFilter", "remove_transform", "select_sites"]

#: ``infer`` key with which a structured guide marks the sites it samples for a weight.
GUIDE_KEY = "pyro_whvi_guide"


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

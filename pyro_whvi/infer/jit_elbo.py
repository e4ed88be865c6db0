r"""Pyro's JIT-compiled ELBOs with three of their flaws fixed (Pyro 1.9): the fast path for every guide.

:class:`JitTrace_ELBO` and :class:`JitTraceMeanField_ELBO` are Pyro's classes of the same names with:

* **The ``ELBOModule`` gradient.** Pyro's ``JitTrace_ELBO.differentiable_loss`` (what ``elbo(model, guide)``
  calls) returns ``loss + (surrogate - surrogate.detach())`` where the compiled ``loss`` carries a gradient
  too, so every gradient is twice the ELBO's. Here the loss is detached first, as in ``Trace_ELBO``.
* **One compilation.** Pyro's ``JitTraceMeanField_ELBO`` looks for its compiled function under another
  attribute than the one it stores it in, so it traces the model and guide again on every call: three
  executions per step, slower than ``TraceMeanField_ELBO``, and three times the random draws. Here it
  compiles once.
* **Clear refusals.** A compiled ELBO is bound to the model and guide of its first call (Pyro's silently
  keeps using them with another pair), and reads the parameters from Pyro's param store (with
  ``module_local_params=True`` Pyro fails on a ``KeyError``); both raise a one-line error naming the fix.

Through ``SVI`` (``loss_and_grads``) Pyro's ``JitTrace_ELBO`` is already right; these classes give the same
numbers there. What the JIT cannot trace in a guide (:func:`~pyro_whvi.infer.example_seeds`) raises at
compilation, see :func:`refuse_under_trace`.
"""

from __future__ import annotations

import pyro
import pyro.infer
import torch
from pyro.util import warn_if_nan

__all__ = ["JitTraceMeanField_ELBO", "JitTrace_ELBO", "refuse_under_trace"]


def refuse_under_trace(what: str, fix: str) -> None:
    """Raise a one-line ``RuntimeError`` if ``torch.jit.trace`` (a ``JitTrace*_ELBO``) is recording now."""
    if torch.jit.is_tracing():
        raise RuntimeError(f"{what} cannot be compiled by the JIT (JitTrace_ELBO and kin); {fix}")


class _BoundToOnePair:
    """What the two ELBOs share: one model and guide per instance, Pyro's global param store, and
    ``ignore_jit_warnings=True`` by default (the ``TracerWarning`` s of shape checks, which the trace keeps
    as they were; pass ``False`` to see them)."""

    _bound: tuple | None = None

    def __init__(self, *args, ignore_jit_warnings: bool = True, **kwargs):
        super().__init__(*args, ignore_jit_warnings=ignore_jit_warnings, **kwargs)  # type: ignore[call-arg]

    def _check_call(self, model, guide) -> None:
        name = type(self).__name__
        if pyro.settings.get("module_local_params"):
            raise RuntimeError(
                f"{name} reads the parameters from Pyro's param store, which module_local_params=True bypasses; "
                f"turn it off (pyro.settings.set(module_local_params=False): {name}()(model, guide) and a torch "
                "optimizer over its parameters() still work) or use Trace_ELBO."
            )
        if self._bound is None:
            self._bound = (model, guide)
        elif self._bound[0] is not model or self._bound[1] is not guide:
            raise RuntimeError(
                f"This {name} was compiled for another model and guide (its first call's); build a new {name}() "
                "for each model and guide pair."
            )


class JitTrace_ELBO(_BoundToOnePair, pyro.infer.JitTrace_ELBO):
    """Pyro's :class:`~pyro.infer.JitTrace_ELBO`; ``differentiable_loss`` (the ``ELBOModule`` path) has the
    ELBO's gradient, not twice it, and misuse raises (see the module docstring)."""

    def loss_and_surrogate_loss(self, model, guide, *args, **kwargs):
        self._check_call(model, guide)
        return super().loss_and_surrogate_loss(model, guide, *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        loss, surrogate_loss = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        loss = warn_if_nan(loss.detach(), "loss")
        return loss + (surrogate_loss - surrogate_loss.detach())


class JitTraceMeanField_ELBO(_BoundToOnePair, pyro.infer.JitTraceMeanField_ELBO):
    """Pyro's :class:`~pyro.infer.JitTraceMeanField_ELBO`, compiled once instead of on every call, and misuse
    raises (see the module docstring)."""

    def differentiable_loss(self, model, guide, *args, **kwargs):
        self._check_call(model, guide)
        compiled = getattr(self, "_differentiable_loss", None)
        if compiled is None:  # Pyro's method builds it (and stores it where it never looks again)
            return super().differentiable_loss(model, guide, *args, **kwargs)
        return compiled(*args, **kwargs, _pyro_model_id=id(model), _pyro_guide_id=id(guide))

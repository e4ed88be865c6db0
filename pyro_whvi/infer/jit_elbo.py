r"""Pyro's JIT-compiled ELBOs with three of their flaws fixed (Pyro 1.9), and compiled by ``torch.compile`` on
request: the fast path for every guide.

:class:`JitTrace_ELBO` and :class:`JitTraceMeanField_ELBO` are Pyro's classes of the same names with:

* **The ``ELBOModule`` gradient.** Pyro's ``JitTrace_ELBO.differentiable_loss`` (what ``elbo(model, guide)``
  calls) returns ``loss + (surrogate - surrogate.detach())`` where the compiled ``loss`` carries a gradient
  too, so every gradient is twice the ELBO's. Here the loss is detached first, as in ``Trace_ELBO``.
* **One compilation.** Pyro's ``JitTraceMeanField_ELBO`` looks for its compiled function under another
  attribute than the one it stores it in, so it traces the model and guide again on every call: three
  executions per step, slower than ``TraceMeanField_ELBO``, and three times the random draws. Here it
  compiles once.
* **The constraints in the compiled graph.** Pyro's compiled-function wrapper calls ``pyro.param`` for every
  parameter on every call, outside the graph (a handler-stack round trip and a constraint transform each, only
  to find the unconstrained tensor). Here the graph takes the unconstrained tensors, applies the constraints
  inside and returns the constrained values too; the wrapper reads the tensors from the param store and reports
  each one to the active handlers (``SVI``'s parameter trace) as a ``pyro.param`` site with that value.
* **Clear refusals.** A compiled ELBO is bound to the model and guide of its first call (Pyro's silently
  keeps using them with another pair), and reads the parameters from Pyro's param store (with
  ``module_local_params=True`` Pyro fails on a ``KeyError``); both raise a one-line error naming the fix.

**Backends.** ``backend="torchscript"`` (the default) is Pyro's ``torch.jit.trace``: a fraction of a second to
compile, one graph for every batch size, each op still run one by one. Any ``torch.compile`` backend, e.g.
``JitTrace_ELBO(backend="inductor")``, records the same function at the aten level (``make_fx``, which bakes
Python-side values as ``torch.jit.trace`` does, and the shapes: one graph per batch shape) and compiles it,
forward and backward, into fused kernels. At D = 128 on one CPU thread a step of ``SVI`` + ``AutoWHVIGuide``
took about 1.2 ms against 1.8 ms with TorchScript (``benchmarks/svi_step.py``), but compiling took 4 s with
Inductor's cache warm and 10-30 s cold (its C++ compiler runs), against under a second: Inductor pays back over
thousands of steps, not over hundreds. Inductor draws its random numbers with eager's generator, so a seed gives
the eager ELBO's numbers; ``"aot_eager"`` compiles in about a second without fusing (for tests).

Through ``SVI`` (``loss_and_grads``) Pyro's ``JitTrace_ELBO`` is already right; these classes give the same
numbers there. What the JIT cannot trace in a guide (:func:`~pyro_whvi.infer.example_seeds`) raises at
compilation, see :func:`~pyro_whvi.infer.tracing.refuse_under_trace`.
"""

from __future__ import annotations

import weakref

import pyro
import pyro.infer
import torch
from pyro import poutine
from pyro.ops.jit import CompiledFunction, _hashable_args_kwargs
from pyro.poutine.runtime import Message, am_i_wrapped, apply_stack
from pyro.util import get_rng_state, ignore_jit_warnings, set_rng_state, warn_if_nan
from torch.distributions import constraints

from .annealing import active_annealing_factors, scale_latents
from .tracing import TORCHSCRIPT, check_backend, input_signature, record_for_compile, refuse_under_trace

__all__ = ["JitTraceMeanField_ELBO", "JitTrace_ELBO", "refuse_under_trace"]


class _CompiledOnParams:
    """What ``pyro.ops.jit.trace`` returns (``CompiledFunction``), with the parameters' constraints applied inside
    the compiled graph: built from Pyro's (its ``fn`` and options) the first time Pyro stores one.

    ``backend="torchscript"`` records with ``torch.jit.trace`` (one graph for every batch size, as Pyro's); any
    other is a ``torch.compile`` backend fed an aten-level recording (``make_fx``), one graph per input shape.
    """

    def __init__(self, pyro_compiled: CompiledFunction, backend: str = TORCHSCRIPT):
        self.fn = pyro_compiled.fn
        self.backend = backend
        self.ignore_warnings = pyro_compiled.ignore_warnings
        self.jit_options = {key: value for key, value in pyro_compiled.jit_options.items() if key != "time_compilation"}
        #: ``{(number of args, kwargs[, input signature]), factors): (graph, parameter names, returns a tuple)}``
        self.compiled: dict = {}

    def __call__(self, *args, **kwargs):
        # A KLAnnealing scope around the call is blocked from the compiled graph: it is applied inside, and each
        # factor gets its own graph.
        factors = active_annealing_factors()
        key = _hashable_args_kwargs(args, kwargs)
        if self.backend != TORCHSCRIPT:
            key = (*key, input_signature(args))
        key = (key, factors)
        if key not in self.compiled:
            self.compiled[key] = self._compile(args, kwargs, factors)
        graph, names, returns_tuple = self.compiled[key]
        stored = dict(pyro.get_param_store().named_parameters())
        try:
            unconstrained = [stored[name] for name in names]
        except KeyError as missing:
            raise RuntimeError(
                f"The compiled ELBO reads parameter {missing}, no longer in Pyro's param store (cleared?); build "
                "a new JitTrace_ELBO() after pyro.clear_param_store()."
            ) from None
        outputs = graph(*unconstrained, *args)
        results = outputs[: len(outputs) - len(names)]
        if am_i_wrapped():
            _report_params(names, outputs[len(results) :], unconstrained)
        return results if returns_tuple else results[0]

    def _compile(self, args: tuple, kwargs: dict, factors: tuple[float, ...]) -> tuple:
        # Recording runs the function (twice for torch.jit.trace); the random state is put back, so that the first
        # compiled call draws what an eager first call draws (seed for seed, where the graph drops no draw).
        rng_state = get_rng_state()
        try:
            return self._trace(args, kwargs, factors)
        finally:
            set_rng_state(rng_state)

    def _trace(self, args: tuple, kwargs: dict, factors: tuple[float, ...]) -> tuple:
        with poutine.block(), poutine.trace(param_only=True) as capture:
            self.fn(*args, **kwargs)
        names = list(capture.trace.nodes)
        store = pyro.get_param_store()
        returns_tuple: list[bool] = []

        def on_params(*params_and_args):
            # store[name] is the constrained value of the unconstrained input (the same tensor), traced.
            constrained = {name: store[name] for name in names}
            annealed = scale_latents(self.fn, factors)
            out = poutine.replay(annealed, params=constrained)(*params_and_args[len(names) :], **kwargs)
            returns_tuple.append(isinstance(out, tuple))
            return (*(out if isinstance(out, tuple) else (out,)), *constrained.values())

        stored = dict(store.named_parameters())
        inputs = (*(stored[name] for name in names), *args)
        if self.backend == TORCHSCRIPT:
            traced = ignore_jit_warnings()(on_params) if self.ignore_warnings else on_params
            with poutine.block(), pyro.validation_enabled(False):
                graph = torch.jit.trace(traced, inputs, **self.jit_options)
        else:
            with poutine.block(), pyro.validation_enabled(False):
                graph = record_for_compile(on_params, inputs, self.backend)
        return graph, names, returns_tuple[0]


def _report_params(names: list[str], constrained: tuple, unconstrained: list[torch.Tensor]) -> None:
    """Send a ``pyro.param(name)`` message with each (already computed) constrained value through the handlers."""
    get_param = pyro.get_param_store().get_param
    for name, value, param in zip(names, constrained, unconstrained):
        value.unconstrained = weakref.ref(param)
        msg = Message(
            type="param",
            name=name,
            fn=get_param,
            is_observed=False,
            args=(name,),
            kwargs={"constraint": constraints.real, "event_dim": None},  # pyro.param(name)'s defaults
            value=value,
            scale=1.0,
            mask=None,
            cond_indep_stack=(),
            done=False,
            stop=False,
            continuation=None,
            infer={},
        )
        apply_stack(msg)


class _BoundToOnePair:
    """What the two ELBOs share: one model and guide per instance, Pyro's global param store, the backend, and
    ``ignore_jit_warnings=True`` by default (the ``TracerWarning`` s of shape checks, which the trace keeps
    as they were; pass ``False`` to see them)."""

    _bound: tuple | None = None
    _compiled: _CompiledOnParams | None = None

    def __init__(self, *args, backend: str = TORCHSCRIPT, ignore_jit_warnings: bool = True, **kwargs):
        self.backend = check_backend(backend, type(self).__name__)
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

    def _get_compiled(self) -> _CompiledOnParams | None:
        return self._compiled

    def _set_compiled(self, pyro_compiled: CompiledFunction) -> None:
        self._compiled = _CompiledOnParams(pyro_compiled, self.backend)


class JitTrace_ELBO(_BoundToOnePair, pyro.infer.JitTrace_ELBO):
    """Pyro's :class:`~pyro.infer.JitTrace_ELBO`; ``differentiable_loss`` (the ``ELBOModule`` path) has the
    ELBO's gradient, not twice it, the constraints run in the compiled graph, and misuse raises (see the module
    docstring).

    :param backend: ``"torchscript"`` (Pyro's ``torch.jit.trace``) or a ``torch.compile`` backend such as
        ``"inductor"`` (fused kernels: the fastest steps, seconds to compile; see the module docstring).
    :param ignore_jit_warnings: hide the ``TracerWarning`` s of ``torch.jit.trace`` (default ``True``).

    Pyro's other arguments (``num_particles``, ``jit_options``, ...) are passed on.
    """

    # Where Pyro's method stores (and reads) its compiled function: ours wraps what it stores.
    _loss_and_surrogate_loss = property(_BoundToOnePair._get_compiled, _BoundToOnePair._set_compiled)

    def loss_and_surrogate_loss(self, model, guide, *args, **kwargs):
        self._check_call(model, guide)
        return super().loss_and_surrogate_loss(model, guide, *args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        loss, surrogate_loss = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        loss = warn_if_nan(loss.detach(), "loss")
        return loss + (surrogate_loss - surrogate_loss.detach())


class JitTraceMeanField_ELBO(_BoundToOnePair, pyro.infer.JitTraceMeanField_ELBO):
    """Pyro's :class:`~pyro.infer.JitTraceMeanField_ELBO`, compiled once instead of on every call, with the
    constraints in the compiled graph, and misuse raises (see the module docstring); ``backend`` as in
    :class:`JitTrace_ELBO`."""

    _differentiable_loss = property(_BoundToOnePair._get_compiled, _BoundToOnePair._set_compiled)

    def differentiable_loss(self, model, guide, *args, **kwargs):
        self._check_call(model, guide)
        compiled = self._differentiable_loss
        if compiled is None:  # Pyro's method builds it (and stores it where it never looks again)
            return super().differentiable_loss(model, guide, *args, **kwargs)
        return compiled(*args, **kwargs, _pyro_model_id=id(model), _pyro_guide_id=id(guide))

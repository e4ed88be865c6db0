"""How a compiled ELBO records the model and guide: ``torch.jit.trace`` (Pyro's JIT, ``backend="torchscript"``) or
an aten-level recording (``make_fx``) handed to ``torch.compile`` (any other backend, e.g. ``"inductor"``).

Code that a recording would get silently wrong (it bakes a Python-side value, or drops a side effect such as
seeding a generator) asks :func:`recording` and refuses with :func:`refuse_under_trace`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

__all__ = [
    "INDUCTOR_OPTIONS",
    "TORCHSCRIPT",
    "check_backend",
    "input_signature",
    "record_for_compile",
    "recording",
    "refuse_under_trace",
]

#: The backend of Pyro's own JIT: ``torch.jit.trace``, one graph for every batch size.
TORCHSCRIPT = "torchscript"

#: Inductor's options: the random draws are eager's ``torch.normal``, so that a seed gives the eager ELBO's numbers
#: (Inductor's own generator draws other numbers, element by element: slower on the CPU).
INDUCTOR_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {"fallback_random": True}

_RECORDING_FOR_COMPILE: ContextVar[bool] = ContextVar("pyro_whvi_recording_for_compile", default=False)


@contextlib.contextmanager
def _recording_for_compile() -> Iterator[None]:
    token = _RECORDING_FOR_COMPILE.set(True)
    try:
        yield
    finally:
        _RECORDING_FOR_COMPILE.reset(token)


def recording() -> bool:
    """Whether a compiled ELBO records the model and guide now (``torch.jit.trace``, or ``make_fx`` for
    ``torch.compile``)."""
    return torch.jit.is_tracing() or _RECORDING_FOR_COMPILE.get()


def refuse_under_trace(what: str, fix: str) -> None:
    """Raise a one-line ``RuntimeError`` if a compiled ELBO (``JitTrace_ELBO`` and kin) is recording now."""
    if recording():
        raise RuntimeError(f"{what} cannot be compiled by the JIT (JitTrace_ELBO and kin); {fix}")


def check_backend(backend: str, owner: str) -> str:
    """``backend`` if it is ``"torchscript"`` or a backend ``torch.compile`` knows, else a one-line ``ValueError``."""
    if backend == TORCHSCRIPT:
        return backend
    import torch._dynamo  # only for a torch.compile backend: it takes a second or two to import

    if not isinstance(backend, str) or backend not in torch._dynamo.list_backends(exclude_tags=()):
        common = ", ".join(repr(name) for name in sorted(torch._dynamo.list_backends()))  # without debug/experimental
        raise ValueError(
            f"{owner}: backend must be {TORCHSCRIPT!r} (torch.jit.trace, Pyro's) or a torch.compile backend "
            f"({common}, ...), got {backend!r}."
        )
    return backend


def input_signature(args: tuple) -> tuple:
    """What a graph recorded by :func:`record_for_compile` depends on in its inputs (it bakes their shapes): each
    tensor's shape, dtype, device and ``requires_grad``, other arguments' types, and the grad mode."""
    return torch.is_grad_enabled(), tuple(
        (tuple(a.shape), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor) else type(a) for a in args
    )


def record_for_compile(fn: Callable, inputs: tuple, backend: str) -> Callable:
    """``fn(*inputs)`` recorded at the aten level (Python-side values baked, as ``torch.jit.trace`` bakes them, and
    the shapes too) and handed to ``torch.compile(backend=backend)``, which compiles it on its first call."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with _recording_for_compile():
        # A Python-side read of a value (`.item()`) is baked into the graph, as torch.jit.trace bakes it: Pyro reads
        # some (TraceMeanField_ELBO's float loss, which the compiled function does not return).
        recorded = make_fx(fn, _error_on_data_dependent_ops=False)(*inputs)
    options = INDUCTOR_OPTIONS if backend == "inductor" else None
    return torch.compile(recorded, backend=backend, fullgraph=True, dynamic=False, options=options)

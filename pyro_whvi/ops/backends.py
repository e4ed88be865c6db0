"""Choice of the kernels behind :mod:`pyro_whvi.ops`.

Two backends implement the same contract:

* ``"reference"`` — pure PyTorch (:mod:`pyro_whvi.ops.reference`): always available, any device.
* ``"compiled"`` — the C++ kernels in the package's kernel sources (top-level ``cuda/cpu/`` in a
  checkout), built on first use and cached under ``$TORCH_EXTENSIONS_DIR`` (default
  ``~/.cache/torch_extensions``; see :mod:`pyro_whvi.ops.build`). They serve CPU tensors in
  float32/float64; other devices and dtypes use the reference.

The default, ``"auto"``, uses the compiled kernels when they build and otherwise falls back to
the reference with a single warning. The environment variable ``PYRO_WHVI_BACKEND``
(``auto``, ``compiled`` or ``reference``) sets the choice; it is read on the first use of an op,
and any other value raises :class:`BackendEnvironmentError` there (the ``whvi`` command checks it first
and prints it as one line). :func:`set_backend` and
:func:`use_backend` change the choice at run time. ``python -m pyro_whvi.ops.build`` builds ahead of time.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "BackendEnvironmentError",
    "compiled_available",
    "compiled_error",
    "get_backend",
    "kernel_source_dir",
    "load_compiled",
    "set_backend",
    "use_backend",
]

ENV_VAR = "PYRO_WHVI_BACKEND"
BACKENDS = ("auto", "compiled", "reference")


class BackendEnvironmentError(ValueError):
    """``$PYRO_WHVI_BACKEND`` names no backend (the message says the allowed values and the fix).

    Raised on the first use of an op, not at import: importing a library should not fail (or, as a
    ``SystemExit`` would, end an interactive session) because of a setting it has not used yet.
    """


def _parse_backend(name: str, where: str) -> str:
    value = name.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{where}: unknown backend {name!r}; expected one of {', '.join(BACKENDS)}.")
    return value


def _backend_from_environment() -> str:
    try:
        return _parse_backend(os.environ.get(ENV_VAR) or "auto", f"${ENV_VAR}")
    except ValueError as error:
        raise BackendEnvironmentError(
            f"pyro_whvi: {error} Fix: unset {ENV_VAR} or set it to one of them, e.g. `export {ENV_VAR}=auto`."
        ) from None


class _State:
    requested: str | None = None  # None: $PYRO_WHVI_BACKEND not read yet
    compiled: bool | None = None  # None: not tried yet
    error: str | None = None


def get_backend() -> str:
    """The requested backend: ``"auto"``, ``"compiled"`` or ``"reference"`` (reads ``$PYRO_WHVI_BACKEND`` once)."""
    if _State.requested is None:
        _State.requested = _backend_from_environment()
    return _State.requested


def set_backend(name: str) -> None:
    """Select the backend for all later calls (see the module docstring)."""
    _State.requested = _parse_backend(name, "set_backend")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager form of :func:`set_backend`; restores the previous choice on exit."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        _State.requested = previous


def kernel_source_dir() -> Path:
    """Directory holding the C++ CPU kernel sources (installed copy or the checkout's ``cuda/cpu/``)."""
    from .build import kernel_source_dir as find

    return find()


def load_compiled(verbose: bool = False) -> None:
    """Build (if needed) and load the compiled CPU kernels; raise with the reason on failure.

    See :func:`pyro_whvi.ops.build.load_kernels`.
    """
    if _State.compiled:
        return
    # Imported here, not at the top: `python -m pyro_whvi.ops.build` runs that module as __main__,
    # and runpy warns when the package import has already imported it.
    from .build import load_kernels

    load_kernels(verbose=verbose)
    _State.compiled = True
    _State.error = None


def compiled_available() -> bool:
    """Whether the compiled CPU kernels are loaded, trying the build once if not yet tried.

    Under ``torch.compile`` tracing no build is attempted: call any op once eagerly (or
    :func:`load_compiled`) before compiling to have the compiled kernels in the graph.
    """
    if _State.compiled is None:
        if torch.compiler.is_compiling():
            return False
        try:
            load_compiled()
        except Exception as error:  # any build failure means "fall back"
            _State.compiled = False
            _State.error = f"{type(error).__name__}: {error}".strip()
            if get_backend() == "auto":
                warnings.warn(
                    "pyro_whvi: the compiled CPU kernels could not be built, so the pure-PyTorch "
                    f"reference is used (slower). Reason: {_State.error[-2000:]}\n"
                    f"Set {ENV_VAR}=reference to skip the build and silence this warning.",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return bool(_State.compiled)


def compiled_error() -> str | None:
    """Why the compiled kernels are unavailable, or ``None``."""
    return _State.error


def use_compiled_kernels(x: torch.Tensor) -> bool:
    """Whether an op on ``x`` runs the compiled kernel (hot path: keep it cheap)."""
    requested = _State.requested or get_backend()
    if requested == "reference" or x.device.type != "cpu" or x.dtype not in _COMPILED_DTYPES:
        return False
    if _State.compiled:
        return True
    available = compiled_available()
    if not available and requested == "compiled":
        raise RuntimeError(
            f"pyro_whvi: backend 'compiled' was requested (set_backend or ${ENV_VAR}) but the "
            f"compiled kernels are unavailable: {_State.error}"
        )
    return available


_COMPILED_DTYPES = frozenset({torch.float32, torch.float64})


def use_gpu_kernels(x: torch.Tensor) -> bool:
    """Whether an op on ``x`` goes to the operators' CUDA kernels (Triton's, :mod:`.triton_backend`):
    CUDA tensors, unless the reference backend was requested."""
    return x.device.type == "cuda" and get_backend() != "reference"

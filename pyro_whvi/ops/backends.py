"""Choice of the kernels behind :mod:`pyro_whvi.ops`, and the build of the compiled ones.

Two backends implement the same contract:

* ``"reference"`` — pure PyTorch (:mod:`pyro_whvi.ops.reference`): always available, any device.
* ``"compiled"`` — the C++ kernels in the package's kernel sources (top-level ``cuda/`` in a
  checkout), built with :func:`torch.utils.cpp_extension.load` on first use and cached under
  ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). They serve CPU tensors in
  float32/float64; other devices and dtypes use the reference.

The default, ``"auto"``, uses the compiled kernels when they build and otherwise falls back to
the reference with a single warning. The environment variable ``PYRO_WHVI_BACKEND``
(``auto``, ``compiled`` or ``reference``) sets the choice at start-up; :func:`set_backend` and
:func:`use_backend` change it at run time. ``python -m pyro_whvi.ops.build`` builds ahead of time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import os
import platform
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = [
    "BACKENDS",
    "ENV_VAR",
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
_CPU_SOURCES = ("fwht_cpu.cpp", "structured_cpu.cpp")
_CPU_HEADERS = ("row_kernels.h",)


def _parse_backend(name: str, where: str) -> str:
    value = name.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{where}: unknown backend {name!r}; expected one of {', '.join(BACKENDS)}.")
    return value


class _State:
    requested: str = _parse_backend(os.environ.get(ENV_VAR, "auto") or "auto", f"${ENV_VAR}")
    compiled: bool | None = None  # None: not tried yet
    error: str | None = None


def get_backend() -> str:
    """The requested backend: ``"auto"``, ``"compiled"`` or ``"reference"``."""
    return _State.requested


def set_backend(name: str) -> None:
    """Select the backend for all later calls (see the module docstring)."""
    _State.requested = _parse_backend(name, "set_backend")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager form of :func:`set_backend`; restores the previous choice on exit."""
    previous = _State.requested
    set_backend(name)
    try:
        yield
    finally:
        _State.requested = previous


def kernel_source_dir() -> Path:
    """Directory holding the C++/CUDA kernel sources (installed copy or the checkout's ``cuda/``)."""
    try:
        installed = Path(str(importlib.resources.files("pyro_whvi._csrc")))
        if (installed / _CPU_SOURCES[0]).is_file():
            return installed
    except ModuleNotFoundError:
        pass
    checkout = Path(__file__).resolve().parents[2] / "cuda"
    if (checkout / _CPU_SOURCES[0]).is_file():
        return checkout
    raise FileNotFoundError(
        "pyro_whvi: the kernel sources (fwht_cpu.cpp) are missing from the installation; reinstall pyro_whvi."
    )


def _native_flags() -> tuple[list[str], str]:
    """Compiler flags for this machine and a tag that keys the build cache to the CPU."""
    flags = ["-O3", "-funroll-loops"]
    if sys.platform.startswith("linux"):
        # at::parallel_for is inline OpenMP: without -fopenmp it silently runs on one thread.
        # The soname matches the libgomp that torch has already loaded, so no second runtime.
        flags.append("-fopenmp")
    if os.environ.get("PYRO_WHVI_NATIVE", "1") != "0" and platform.machine() in ("x86_64", "aarch64"):
        flags.append("-march=native")
    flags += os.environ.get("PYRO_WHVI_EXTRA_CFLAGS", "").split()
    cpu_description = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                cpu_description += line
    # The kernel files are part of the key: torch's own rebuild check hashes the sources, not the headers.
    kernels = b"".join((kernel_source_dir() / name).read_bytes() for name in (*_CPU_SOURCES, *_CPU_HEADERS))
    tag = hashlib.sha1(f"{cpu_description}|{torch.__version__}|{flags}".encode() + kernels).hexdigest()[:10]
    return flags, tag


def load_compiled(verbose: bool = False) -> None:
    """Build (if needed) and load the compiled CPU kernels; raise with the reason on failure."""
    if _State.compiled:
        return
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler found (looked for {compiler!r}; set $CXX to choose one)")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    flags, tag = _native_flags()
    name = f"pyro_whvi_cpu_{tag}"
    sources = [str(kernel_source_dir() / source) for source in _CPU_SOURCES]
    build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
    if not (build_dir / f"{name}.so").exists():
        print(
            f"pyro_whvi: compiling the CPU kernels into {build_dir} (first use only, about a minute)...",
            file=sys.stderr,
            flush=True,
        )
    cpp_extension.load(
        name=name,
        sources=sources,
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"] if "-fopenmp" in flags else [],
        is_python_module=False,
        verbose=verbose,
    )
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
            if _State.requested == "auto":
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
    requested = _State.requested
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

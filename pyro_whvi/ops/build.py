"""Build, cache and load the compiled CPU kernels; ``python -m pyro_whvi.ops.build`` builds ahead of time.

The kernels are built with :func:`torch.utils.cpp_extension.load` into
``$TORCH_EXTENSIONS_DIR/pyro_whvi_cpu_<tag>`` (default root ``~/.cache/torch_extensions/<python>_<device>``),
where ``<tag>`` keys the build to the kernel sources, the compiler flags, torch and the CPU.

* **Verified cache.** A successful build writes the SHA-256 of the library next to it
  (``<library>.sha256``). A process that finds a library matching its digest loads it directly:
  no compiler, no ninja and no lock, so a cached build also works without a compiler and on a
  read-only file system. A library without a matching digest (an interrupted or older build) is
  never loaded: it is rebuilt, as loading a truncated library can crash the process.
* **No hang on a killed build.** Builds are serialized by an advisory lock (:func:`fcntl.flock`) on
  ``pyro_whvi.lock`` in the build directory, which the kernel releases when its holder dies. Torch's
  own lock file there (``lock``, which torch waits on without a timeout) is therefore stale when the
  holder of ours finds it: it is removed once no process is left working in the directory (the
  compiler of a killed build may still be running). All waiting is bounded by
  ``$PYRO_WHVI_BUILD_TIMEOUT`` seconds (default 600); past it the build fails with
  :class:`TimeoutError`, and the ``auto`` backend falls back to the reference with its single warning.
  Every wait says once on stderr, as it begins, what it waits for (the processes, the folder and the cap).
* Every compile is announced on stderr before it starts.

The command exits non-zero with the compiler's reason when the build fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.resources
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["TIMEOUT_ENV_VAR", "kernel_source_dir", "load_kernels", "main"]

TIMEOUT_ENV_VAR = "PYRO_WHVI_BUILD_TIMEOUT"
_DEFAULT_TIMEOUT_S = 600.0
_CPU_SOURCES = ("fwht_cpu.cpp", "structured_cpu.cpp", "planar_cpu.cpp")
_CPU_HEADERS = ("row_kernels.h",)
_LOCK_NAME = "pyro_whvi.lock"
_TORCH_LOCK_NAME = "lock"  # torch.utils.file_baton.FileBaton in cpp_extension._jit_compile
# A torch lock younger than this may belong to a live process that has not started ninja yet.
_TORCH_LOCK_GRACE_S = 2.0


def kernel_source_dir() -> Path:
    """Directory holding the C++ CPU kernel sources: ``cpu/`` of the package ``pyro_whvi._csrc``.

    ``pyro_whvi._csrc`` is the checkout's top-level ``cuda/`` folder (``pyproject.toml`` maps it; an
    editable install maps it the same way), so the C++ and the Triton kernels are found through this one
    package, installed or not (``cuda/README.md``).
    """
    try:
        sources = Path(str(importlib.resources.files("pyro_whvi._csrc"))) / "cpu"
    except ModuleNotFoundError:
        sources = None
    if sources is None or not (sources / _CPU_SOURCES[0]).is_file():
        raise FileNotFoundError(
            "pyro_whvi: the kernel sources (pyro_whvi._csrc/cpu/fwht_cpu.cpp, the checkout's cuda/cpu/) are missing "
            "from the installation; reinstall pyro_whvi (`pip install -e .` in a checkout)."
        )
    return sources


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


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV_VAR, "").strip()
    try:
        return float(text) if text else _DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"${TIMEOUT_ENV_VAR}={text!r} is not a number of seconds") from None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _is_verified(library: Path, stamp: Path) -> bool:
    """Whether ``library`` is the complete output of a successful build (its digest matches ``stamp``)."""
    try:
        return stamp.read_text().strip() == _digest(library)
    except OSError:  # either file missing or unreadable
        return False


def _processes_in(directory: Path) -> list[int]:
    """Ids of other processes whose working directory is ``directory`` (ninja and the compiler run
    there); empty where ``/proc`` is unavailable."""
    target = os.path.realpath(directory)
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry.name}/cwd") == target:
                        found.append(int(entry.name))
    return found


def _cap() -> str:
    return f"at most {_timeout():g} s; ${TIMEOUT_ENV_VAR} sets it"


def _wait(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TimeoutError(f"{what} for more than {_timeout():g} s; set ${TIMEOUT_ENV_VAR} to wait longer")
    time.sleep(0.2)


@contextlib.contextmanager
def _build_lock(directory: Path, deadline: float) -> Iterator[str]:
    """Hold the advisory build lock of ``directory``; released by the kernel if this process dies.

    Yields the pid of its previous holder (``"?"`` if unknown): the build a stale torch lock is left from.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): torch's own lock only
        yield "?"
        return
    path = directory / _LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced:
                    owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    message = f"waiting for process {owner}, which is building the CPU kernels in {directory}"
                    print(f"pyro_whvi: {message} ({_cap()})...", file=sys.stderr, flush=True)
                    announced = True
                _wait(deadline, f"another process has held the build lock {path}")
        previous = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield previous
    finally:
        os.close(fd)  # also releases the flock


def _clear_stale_torch_lock(directory: Path, deadline: float, holder: str = "?") -> None:
    """Remove torch's lock file left by a killed build, once its compiler processes are gone.

    Called with the build lock held, so no live pyro_whvi build owns torch's lock; ``holder`` is the pid of
    the build that left it, named in the one line that says what the wait is for.
    """
    lock = directory / _TORCH_LOCK_NAME
    announced = False
    while lock.exists():
        try:
            young = time.time() - lock.stat().st_mtime < _TORCH_LOCK_GRACE_S
        except FileNotFoundError:
            return
        running = _processes_in(directory)
        if not young and not running:
            lock.unlink(missing_ok=True)
            print(f"pyro_whvi: removed the stale lock {lock} of an interrupted build.", file=sys.stderr, flush=True)
            return
        if running and not announced:
            pids = ", ".join(map(str, running))
            print(
                f"pyro_whvi: waiting for process {pids}, left running in {directory} by the interrupted build of "
                f"process {holder}, to finish before building there ({_cap()})...",
                file=sys.stderr,
                flush=True,
            )
            announced = True
        _wait(deadline, f"processes of an earlier build are still running in {directory}")


def load_kernels(verbose: bool = False) -> None:
    """Load the compiled CPU kernels, building them first unless a verified build is cached.

    :param verbose: show the compiler's commands and output.
    :raises RuntimeError: no compiler or no ninja when a build is needed, or a failed build.
    :raises TimeoutError: another build held the directory longer than ``$PYRO_WHVI_BUILD_TIMEOUT``.
    :raises OSError: the build directory cannot be used (e.g. read-only without a verified build).
    """
    from torch.utils import cpp_extension

    flags, tag = _native_flags()
    name = f"pyro_whvi_cpu_{tag}"
    directory = Path(cpp_extension._get_build_directory(name, verbose=False))
    library = directory / f"{name}{cpp_extension.LIB_EXT}"
    stamp = library.with_name(library.name + ".sha256")
    if _is_verified(library, stamp):
        torch.ops.load_library(str(library))
        return
    if library.exists() and not os.access(directory, os.W_OK):
        raise OSError(
            f"the cached build {library} is not verified (no matching {stamp.name}) and its directory is "
            "read-only; run `python -m pyro_whvi.ops.build` where it is writable"
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler found (looked for {compiler!r}; set $CXX to choose one)")
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("ninja is not installed (pip install ninja)")
    deadline = time.monotonic() + _timeout()
    with _build_lock(directory, deadline) as previous_holder:
        if _is_verified(library, stamp):  # built by the process we waited for
            torch.ops.load_library(str(library))
            return
        _clear_stale_torch_lock(directory, deadline, previous_holder)
        # Unverified: possibly cut short by a kill, and ninja would trust its timestamp. Relink.
        library.unlink(missing_ok=True)
        print(
            f"pyro_whvi: compiling the CPU kernels into {directory} (about a minute; later runs reuse it)...",
            file=sys.stderr,
            flush=True,
        )
        cpp_extension.load(
            name=name,
            sources=[str(kernel_source_dir() / source) for source in _CPU_SOURCES],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"] if "-fopenmp" in flags else [],
            is_python_module=False,
            verbose=verbose,
        )
        with contextlib.suppress(OSError):  # the kernels are loaded; without a stamp the next run relinks
            stamp.write_text(_digest(library) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pyro_whvi.ops.build``."""
    parser = argparse.ArgumentParser(
        prog="python -m pyro_whvi.ops.build", description="Build the compiled CPU kernels of pyro_whvi.ops."
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands and output")
    args = parser.parse_args(argv)
    try:
        load_kernels(verbose=args.verbose)
    except Exception as error:  # report any build failure in one line
        print(f"pyro_whvi: building the compiled kernels failed: {error}", file=sys.stderr)
        return 1
    print("pyro_whvi: compiled CPU kernels ready.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

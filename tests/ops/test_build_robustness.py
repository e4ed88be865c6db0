"""The compiled-kernel build never hangs and never silently skips a usable cache (pyro_whvi.ops.build),
and a garbage ``$PYRO_WHVI_BACKEND`` is a one-line error.

Every build runs in a subprocess with its own ``$TORCH_EXTENSIONS_DIR``; one real build (module
fixture) is copied for the tests that need a cached build.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest

from ..helpers import ROOT

pytestmark = pytest.mark.slow  # real compiler builds in subprocesses (one shared by the module)

BUILD_TIMEOUT_S = 300  # a real build takes some tens of seconds here; the old code hung forever

# Runs one op and reports which backend ran it and the pyro_whvi warnings raised on the way.
CHECK = """
import json, warnings, torch
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from pyro_whvi import ops
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    y = ops.fwht(x)
torch.testing.assert_close(y, ops.reference.fwht(x))
messages = [str(w.message) for w in caught if "pyro_whvi" in str(w.message)]
print(json.dumps({"compiled": ops.backends._State.compiled, "warnings": messages}))
"""


# Every build here is unoptimized: a third faster to compile, and what is tested is the caching and the locks.
UNOPTIMIZED = {"PYRO_WHVI_EXTRA_CFLAGS": "-O0"}


def _env(extensions: Path | None = None, **overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYRO_WHVI_BACKEND", "PYRO_WHVI_BUILD_TIMEOUT", "TORCH_EXTENSIONS_DIR"):
        env.pop(name, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if extensions is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(extensions)
    env.update(UNOPTIMIZED)
    env.update(overrides)
    return env


def _run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
        pytest.fail(f"{argv[-1][:60]!r} hung for {timeout} s; stderr: {(stderr or '')[-2000:]}")


def _check(extensions: Path, timeout: float = 120, prefix: tuple[str, ...] = (), **env: str) -> tuple[dict, str]:
    """Run :data:`CHECK` against ``extensions``; its report and stderr."""
    result = _run([*prefix, sys.executable, "-c", textwrap.dedent(CHECK)], _env(extensions, **env), timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def _build_dir(extensions: Path) -> Path:
    (directory,) = extensions.glob("pyro_whvi_cpu_*")
    return directory


def _build_dir_name() -> str:
    """The name of the build folder a child process uses here (keyed to the sources, flags, torch and CPU)."""
    from pyro_whvi.ops.build import _native_flags

    with mock.patch.dict(os.environ, UNOPTIMIZED):
        return f"pyro_whvi_cpu_{_native_flags()[1]}"


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory) -> tuple[Path, str]:
    """An extensions directory holding one complete build, and the stderr of that build."""
    extensions = tmp_path_factory.mktemp("built") / "extensions"
    argv = [sys.executable, "-m", "pyro_whvi.ops.build"]
    result = _run(argv, _env(extensions), BUILD_TIMEOUT_S)
    if result.returncode != 0:
        reason = f"the compiled kernels do not build here: {result.stderr[-1000:]}"
        if os.environ.get("PYRO_WHVI_REQUIRE_COMPILED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return extensions, result.stderr


@pytest.fixture
def cache_copy(built_cache, tmp_path) -> Path:
    """A private copy of the built extensions directory."""
    return Path(shutil.copytree(built_cache[0], tmp_path / "extensions"))


def test_first_build_says_compiling(built_cache):
    assert "pyro_whvi: compiling the CPU kernels into" in built_cache[1]


def test_build_lock_held_too_long_falls_back_with_one_warning(tmp_path):
    """A live process holding the build lock is waited for, up to $PYRO_WHVI_BUILD_TIMEOUT only (no build needed)."""
    extensions = tmp_path / "extensions"
    directory = extensions / _build_dir_name()
    directory.mkdir(parents=True)
    with open(directory / "pyro_whvi.lock", "w") as lock:
        lock.write("424242")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        report, stderr = _check(extensions, PYRO_WHVI_BUILD_TIMEOUT="1")
        elapsed = time.monotonic() - started
    assert report["compiled"] is False
    assert len(report["warnings"]) == 1, report
    assert "TimeoutError" in report["warnings"][0] and "PYRO_WHVI_BUILD_TIMEOUT" in report["warnings"][0]
    assert "waiting for process 424242" in stderr and "at most 1 s; $PYRO_WHVI_BUILD_TIMEOUT sets it" in stderr
    assert elapsed < 60


# Waits for the kernels' build folder, reporting on stderr when it starts and what ends it.
WAIT = """
import sys
from pyro_whvi.ops import build
print("started", file=sys.stderr, flush=True)
try:
    build.load_kernels()
except TimeoutError as error:
    print(f"gave up: {error}", file=sys.stderr, flush=True)
"""


def test_wait_for_the_compiler_of_a_killed_build_says_what_it_waits_for_once_at_once(tmp_path):
    """A SIGKILLed build leaves torch's lock and its compiler running; the next process used to wait for it
    in silence, up to the cap. Now one line on stderr names the processes, the folder and the cap."""
    directory = tmp_path / "extensions" / _build_dir_name()
    directory.mkdir(parents=True)
    (directory / "pyro_whvi.lock").write_text("313131")  # the killed build's pid, its lock released
    (directory / "lock").touch()
    os.utime(directory / "lock", (time.time() - 60, time.time() - 60))
    compiler = subprocess.Popen(["sleep", "120"], cwd=directory)  # the orphaned compiler, still at work there
    env = _env(tmp_path / "extensions", PYRO_WHVI_BUILD_TIMEOUT="5")
    waiter = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WAIT)], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    try:
        assert waiter.stderr is not None
        lines, seconds = [], {}
        for line in waiter.stderr:
            lines.append(line.rstrip("\n"))
            seconds[len(lines) - 1] = time.monotonic()
        waiter.wait(timeout=60)
    finally:
        compiler.kill()
        compiler.wait()
        with contextlib.suppress(ProcessLookupError):
            waiter.kill()
    started = next(i for i, line in enumerate(lines) if line == "started")
    waiting = [i for i, line in enumerate(lines) if "waiting for" in line]
    assert len(waiting) == 1, lines
    message = lines[waiting[0]]
    for part in (f"process {compiler.pid}", str(directory), "process 313131", "at most 5 s", "PYRO_WHVI_BUILD_TIMEOUT"):
        assert part in message, message
    assert seconds[waiting[0]] - seconds[started] < 3.0, "the wait was announced late"
    assert lines[-1].startswith("gave up:") and "PYRO_WHVI_BUILD_TIMEOUT" in lines[-1], lines
    assert (directory / "lock").exists()  # a running compiler's lock is not removed under it


def _read_only_prefix(directory: Path) -> tuple[str, ...]:
    """Make ``directory`` read-only for a child process: the command prefix that runs it so.

    chmod, unless running as root (which ignores it): then a read-only bind mount in a private
    mount namespace. Skips the test when neither works.
    """
    for path in [directory, *directory.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    probe = directory / "probe"
    try:
        probe.touch()
    except PermissionError:
        return ()
    probe.unlink()
    mount_read_only = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
    prefix = ("unshare", "-m", "sh", "-c", mount_read_only, str(directory))
    if shutil.which("unshare"):
        attempt = subprocess.run([*prefix, "touch", str(probe)], capture_output=True, text=True)
        if "Read-only file system" in attempt.stderr and not probe.exists():
            return prefix
    pytest.skip("cannot make a directory read-only here (root, and no mount namespace)")


def test_cached_build_on_read_only_file_system_is_used(cache_copy):
    prefix = _read_only_prefix(cache_copy)
    try:
        report, stderr = _check(cache_copy, prefix=prefix)
    finally:
        for path in [cache_copy, *cache_copy.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert report == {"compiled": True, "warnings": []}, stderr[-3000:]
    assert "compiling" not in stderr


def test_cached_build_needs_no_compiler(cache_copy):
    report, stderr = _check(cache_copy, CXX="/nonexistent/c++", PATH="/nonexistent")
    assert report == {"compiled": True, "warnings": []}, stderr[-3000:]
    assert "compiling" not in stderr


def test_cut_short_library_is_rebuilt_and_says_compiling(cache_copy):
    """A library truncated by a killed link is not loaded (that can crash) but relinked, announced."""
    directory = _build_dir(cache_copy)
    (library,) = directory.glob("*.so")
    os.truncate(library, library.stat().st_size // 2)
    report, stderr = _check(cache_copy, timeout=BUILD_TIMEOUT_S)
    assert report == {"compiled": True, "warnings": []}, stderr[-3000:]
    assert "compiling the CPU kernels" in stderr


def test_garbage_backend_variable_is_named_at_the_first_op_and_in_one_line_by_the_command():
    env = _env(PYRO_WHVI_BACKEND="garbage")
    imported = _run([sys.executable, "-c", "import pyro_whvi; print('imported')"], env, timeout=120)
    assert imported.returncode == 0 and imported.stdout.strip() == "imported", imported.stderr  # import is fine
    op = _run([sys.executable, "-c", "import torch, pyro_whvi; pyro_whvi.ops.fwht(torch.ones(4))"], env, timeout=120)
    assert op.returncode == 1 and "BackendEnvironmentError" in op.stderr.strip().splitlines()[-1]
    command = _run([sys.executable, "-m", "pyro_whvi", "bench", "--help"], env, timeout=120)
    assert command.returncode == 2 and command.stdout == ""
    lines = command.stderr.strip().splitlines()
    assert len(lines) == 1, command.stderr
    for message in (lines[0], op.stderr.strip().splitlines()[-1]):
        for part in ("PYRO_WHVI_BACKEND", "'garbage'", "auto, compiled, reference", "unset PYRO_WHVI_BACKEND"):
            assert part in message

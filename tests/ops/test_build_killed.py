"""A killed first build of the compiled kernels (pyro_whvi.ops.build) never hangs the next process.

In a file of their own, apart from ``test_build_robustness.py`` (which they share helpers with): the test runs
real builds, and ``make test`` distributes test files over its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyro_whvi.ops.build import _processes_in

from ..helpers import require_compiled_kernels
from .test_build_robustness import BUILD_TIMEOUT_S, _build_dir, _check, _env

pytestmark = pytest.mark.slow  # real compiler builds in subprocesses

SCRIPT = "from pyro_whvi import ops; ops.load_compiled()"


def _start_build(extensions: Path, log: Path) -> subprocess.Popen:
    """A process that loads the compiled kernels (building them), in a session of its own, stderr to ``log``."""
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            env=_env(extensions),  # unoptimized, as every build of these tests
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def _kill_job(build: subprocess.Popen, directory: Path) -> None:
    """SIGKILL ``build`` as a job scheduler kills a job: every process of it, the compilers included. Ninja starts
    each compiler in a process group of its own, so killing the build's group leaves them running (for 85 s here);
    they are found by their working directory, the build folder, as :mod:`pyro_whvi.ops.build` finds them."""
    os.killpg(build.pid, signal.SIGKILL)
    build.wait()
    _kill_processes_in(directory)


def _kill_processes_in(directory: Path) -> None:
    """SIGKILL every process working in ``directory`` (ninja and the compilers of a build there) until none is left."""
    deadline = time.monotonic() + 30
    while running := _processes_in(directory):  # a compiler driver may start its next step meanwhile
        assert time.monotonic() < deadline, f"processes {running} in {directory} outlived SIGKILL"
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _wait_for(condition, build: subprocess.Popen, log: Path, what: str) -> None:
    # A build's own time limit: with the other test worker busy, a step of a build took over 120 s here (2026-12-05).
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while not condition():
        assert build.poll() is None, f"the build ended before {what}: {log.read_text()[-2000:]!r}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def test_killed_builds_do_not_hang_the_next_process(tmp_path):
    """SIGKILL a real build while its compiler runs, twice, then the next process must still get kernels.

    The first build is killed whole, as a job scheduler kills a job, and leaves torch's lock behind; the second
    removes that stale lock and is killed alone, so its ninja and compilers go on as orphans; the third waits for
    them, says so, removes the stale lock and builds (a link: the orphans compiled). Both kinds of kill in one test,
    and one compile in all: the first build's compilers are killed with it, not left to finish for nothing.
    """
    require_compiled_kernels()
    extensions = tmp_path / "extensions"
    logs = [tmp_path / f"build{k}.log" for k in range(2)]
    builds: list[subprocess.Popen] = []
    try:
        builds.append(_start_build(extensions, logs[0]))
        # torch writes build.ninja after taking its lock and before starting the compiler
        _wait_for(
            lambda: list(extensions.glob("pyro_whvi_cpu_*/lock")) and list(extensions.glob("*/build.ninja")),
            builds[0],
            logs[0],
            "torch's lock and build.ninja",
        )
        directory = _build_dir(extensions)
        _wait_for(lambda: len(_processes_in(directory)) > 1, builds[0], logs[0], "ninja and a compiler")
        _kill_job(builds[0], directory)
        # A first build says so before its compiler starts (a killed one too: the line names the folder it used).
        assert f"pyro_whvi: compiling the CPU kernels into {directory}" in logs[0].read_text(), logs[0].read_text()
        assert (directory / "lock").exists()  # the situation that used to hang every later process

        builds.append(_start_build(extensions, logs[1]))
        _wait_for(lambda: "compiling the CPU kernels" in logs[1].read_text(), builds[1], logs[1], "a second build")
        _wait_for(lambda: len(_processes_in(directory)) > 1, builds[1], logs[1], "ninja and a compiler")
        builds[1].kill()  # Python alone: its ninja and compilers go on
        builds[1].wait()
        second = logs[1].read_text()
        assert "removed the stale lock" in second and "waiting for process" not in second, second
        assert _processes_in(directory), "the second build's compilers did not outlive it: nothing to wait for"

        report, stderr = _check(extensions, timeout=BUILD_TIMEOUT_S)
        assert report == {"compiled": True, "warnings": []}, stderr[-3000:]
        assert f"left running in {directory} by the interrupted build of process {builds[1].pid}" in stderr, stderr
        assert "removed the stale lock" in stderr
        assert "compiling the CPU kernels" in stderr
        assert not (directory / "lock").exists()
    finally:
        for build in builds:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGKILL)  # orphans left by a failed run
            build.wait()
        for folder in extensions.glob("pyro_whvi_cpu_*"):
            _kill_processes_in(folder)  # and their compilers

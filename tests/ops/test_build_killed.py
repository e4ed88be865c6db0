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


def _wait_for(condition, build: subprocess.Popen, log: Path, what: str) -> None:
    # A build's own time limit: the second build waits for the first's orphaned compilers before it says
    # "compiling", and with the other test worker busy they took over 120 s here (2026-12-05).
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while not condition():
        assert build.poll() is None, f"the build ended before {what}: {log.read_text()[-2000:]!r}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)


def test_killed_builds_do_not_hang_the_next_process(tmp_path):
    """SIGKILL a real build while its compiler runs, twice, then the next process must still get kernels.

    The first build is killed with its process group, as a job scheduler kills a job; the second, which finds the
    first's stale lock (and waits for the first's compilers where they outlive the kill, as they did here), is
    killed alone, so its ninja and compiler go on as orphans; the third waits for them, removes the stale lock and
    builds. Both kinds of kill in one test: two tests took a full build each after the kill (42-64 s apiece).
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
        time.sleep(1.0)  # the compiler is running now
        os.killpg(builds[0].pid, signal.SIGKILL)
        builds[0].wait()
        directory = _build_dir(extensions)
        # A first build says so before its compiler starts (a killed one too: the line names the folder it used).
        assert f"pyro_whvi: compiling the CPU kernels into {directory}" in logs[0].read_text(), logs[0].read_text()
        assert (directory / "lock").exists()  # the situation that used to hang every later process

        builds.append(_start_build(extensions, logs[1]))
        _wait_for(lambda: "compiling the CPU kernels" in logs[1].read_text(), builds[1], logs[1], "a second build")
        time.sleep(1.0)
        builds[1].kill()  # Python alone: its ninja and compiler go on
        builds[1].wait()
        assert "removed the stale lock" in logs[1].read_text(), logs[1].read_text()

        report, stderr = _check(extensions, timeout=BUILD_TIMEOUT_S)
        assert report == {"compiled": True, "warnings": []}, stderr[-3000:]
        assert "removed the stale lock" in stderr
        assert "compiling the CPU kernels" in stderr
        assert not (directory / "lock").exists()
    finally:
        for build in builds:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGKILL)  # orphans left by a failed run
            build.wait()

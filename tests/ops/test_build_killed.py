"""A killed first build of the compiled kernels (pyro_whvi.ops.build) never hangs the next process.

In a file of their own, apart from ``test_build_robustness.py`` (which they share helpers with): each runs two
real builds, and ``make test`` distributes test files over its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from ..helpers import require_compiled_kernels
from .test_build_robustness import BUILD_TIMEOUT_S, _build_dir, _check, _env

pytestmark = pytest.mark.slow  # real compiler builds in subprocesses


@pytest.mark.parametrize("victim", ["process", "process_group"])
def test_killed_first_build_does_not_hang(tmp_path, victim):
    """SIGKILL a real first build once torch's lock exists; the next process must still get kernels.

    ``process`` kills Python alone, so its ninja and compiler finish as orphans; ``process_group``
    also kills them, as a job scheduler does.
    """
    require_compiled_kernels()
    extensions = tmp_path / "extensions"
    script = "from pyro_whvi import ops; ops.load_compiled()"
    unoptimized = {"PYRO_WHVI_EXTRA_CFLAGS": "-O0"}  # a third faster to compile; the locks are what is tested
    first = subprocess.Popen(
        [sys.executable, "-c", script],
        env=_env(extensions, **unoptimized),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        # torch writes build.ninja after taking its lock and before starting the compiler
        while not list(extensions.glob("pyro_whvi_cpu_*/lock")) or not list(extensions.glob("*/build.ninja")):
            assert first.poll() is None, f"the first build ended on its own: {first.communicate()[1][-2000:]!r}"
            assert time.monotonic() < deadline, "the first build never took torch's lock"
            time.sleep(0.05)
        time.sleep(1.0)  # the compiler is running now
        if victim == "process":
            first.kill()
        else:
            os.killpg(first.pid, signal.SIGKILL)
        _, first_stderr = first.communicate()
        # A first build says so before its compiler starts (a killed one too: the line names the folder it used).
        assert f"pyro_whvi: compiling the CPU kernels into {_build_dir(extensions)}" in first_stderr, first_stderr
        assert (_build_dir(extensions) / "lock").exists()  # the situation that used to hang every later process

        report, stderr = _check(extensions, timeout=BUILD_TIMEOUT_S, **unoptimized)
        assert report == {"compiled": True, "warnings": []}, stderr[-3000:]
        assert "removed the stale lock" in stderr
        assert "compiling the CPU kernels" in stderr
        assert not (_build_dir(extensions) / "lock").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # orphans left by a failed run
        if first.stderr is not None and not first.stderr.closed:  # not yet read (a failure before the kill)
            first.communicate()

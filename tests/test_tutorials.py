"""Every tutorial runs end to end in its fast mode (figures go to a temporary folder).

Each runs as ``python tutorials/NAME.py``, as a user runs it: Lightning's ``"ddp"`` strategy starts its
other ranks by re-running ``sys.argv``, which depends on how the script was started (under a bare
``python -c`` the second rank would try to run a file named ``-c``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, checkout_environment

TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))
TIMEOUT = 600  # seconds: a hung run (e.g. a DDP rank waiting on a dead peer) fails instead of hanging
NEEDS = {"lightning_ddp": "lightning"}  # optional extras a tutorial imports


def run_script(path: Path, cwd: Path, timeout: float = TIMEOUT, **env_overrides: str) -> subprocess.CompletedProcess:
    """Run ``python path`` in a fresh interpreter that imports this checkout (PYRO_WHVI_BACKEND unset
    unless given, as :func:`tests.helpers.run_python`). On a timeout the whole process group (the
    script and any processes it started) is killed and the test fails."""
    env = checkout_environment(**env_overrides)
    command = [sys.executable, str(path)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"{path.name} did not finish in {timeout} s; stderr:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_every_tutorial_takes_the_fast_mode_and_the_figure_folder():
    """What the test below relies on: each tutorial reads both variables, and every committed figure is a
    tutorial's (named after it), so that each one is run below."""
    for path in TUTORIALS:
        source = path.read_text()
        assert "PYRO_WHVI_TUTORIAL_FAST" in source and "PYRO_WHVI_TUTORIAL_OUT" in source, path.name
    stems = {path.stem for path in TUTORIALS}
    for figure in (ROOT / "tutorials" / "figures").glob("*.png"):
        assert any(figure.stem.startswith(stem + "_") for stem in stems), figure.name


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_in_fast_mode(path: Path, tmp_path):
    if path.stem in NEEDS:
        pytest.importorskip(NEEDS[path.stem])
    out = tmp_path / "figures"
    # One torch thread, as the test processes have (conftest.py): with torch's default of one per core, a tutorial
    # and the other `make test` worker oversubscribe the cores (OpenMP threads waiting on each other).
    # Measured here, two cores, the other core busy: random_features 38 s with the default, 8 s with one thread;
    # iblm 29 s / 11 s, vsd_cnn 24 s / 9 s, nf_whvi 20 s / 8 s. Nothing a tutorial checks depends on it.
    result = run_script(
        path,
        cwd=tmp_path,
        PYRO_WHVI_TUTORIAL_FAST="1",
        PYRO_WHVI_TUTORIAL_OUT=str(out),
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # Into the folder it was given: the figures committed for it (tutorials/figures), no more and no fewer.
    committed = {figure.name for figure in (ROOT / "tutorials" / "figures").glob(f"{path.stem}_*.png")}
    assert committed and {figure.name for figure in out.glob("*.png")} == committed

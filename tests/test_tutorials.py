"""Every tutorial runs end to end in its fast mode (figures go to a temporary folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import ROOT, run_python

TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))


def test_there_are_tutorials():
    assert TUTORIALS


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_in_fast_mode(path: Path, tmp_path):
    script = f"import runpy; runpy.run_path({str(path)!r}, run_name='__main__')"
    result = run_python(script, PYRO_WHVI_TUTORIAL_FAST="1", PYRO_WHVI_TUTORIAL_OUT=str(tmp_path), MPLBACKEND="Agg")
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(tmp_path.glob("*.png")), "a tutorial saves its figures"

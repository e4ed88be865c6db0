"""The I-BLM benchmark runs end to end, as a command, on tiny settings and writes its outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ..helpers import ROOT, run_python, uci_directory


@pytest.mark.slow
def test_iblm_benchmark(tmp_path):
    data = uci_directory(tmp_path)
    argv = [str(ROOT / "benchmarks" / "iblm_init.py"), "--data-dir", str(data), "--seeds", "1", "--steps", "4"]
    argv += [
        "--eval-every",
        "2",
        "--samples",
        "3",
        "--width",
        "8",
        "--depth",
        "2",
        "--iblm-batch",
        "32",
        "--batch",
        "16",
    ]
    argv += ["--out", str(tmp_path), "--stem", "smoke"]
    script = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    result = run_python(script)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "smoke.json").read_text())
    summary = record["meta"]["summary"]
    assert {(e["task"], e["guide"], e["init"]) for e in summary} == {
        (t, g, i) for t in ("concrete", "digits") for g in ("mfg", "whvi") for i in ("default", "xavier", "iblm")
    }
    assert all(e["steps"] == [0, 2, 4] and all(np.isfinite(e["mnll_curve"])) for e in summary)
    assert (tmp_path / "smoke.png").is_file()
    assert "init time / SVI time" in (tmp_path / "smoke.md").read_text()

"""The I-BLM benchmark runs end to end, in the test's process (:mod:`.in_process`), on tiny settings and writes its
outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ..helpers import uci_directory
from .in_process import run_main


@pytest.mark.slow
def test_iblm_benchmark(tmp_path):
    data = uci_directory(tmp_path)
    argv = ["--data-dir", str(data), "--seeds", "1", "--steps", "4"]
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
    status, _, stderr = run_main("iblm_init", argv)
    assert status == 0, stderr[-3000:]
    record = json.loads((tmp_path / "smoke.json").read_text())
    summary = record["meta"]["summary"]
    assert {(e["task"], e["guide"], e["init"]) for e in summary} == {
        (t, g, i) for t in ("concrete", "digits") for g in ("mfg", "whvi") for i in ("default", "xavier", "iblm")
    }
    assert all(e["steps"] == [0, 2, 4] and all(np.isfinite(e["mnll_curve"])) for e in summary)
    assert (tmp_path / "smoke.png").is_file()
    assert "init time / SVI time" in (tmp_path / "smoke.md").read_text()

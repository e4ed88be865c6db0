"""The I-BLM benchmark runs end to end, as a command, on tiny settings and writes its outputs."""

from __future__ import annotations

import json

import numpy as np

from .helpers import ROOT, run_python


def _uci_directory(path):
    """A small dataset in the UCI split format (3 features, target in the last column)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    data = np.column_stack([x, np.sin(x[:, 0]) + 0.1 * rng.normal(size=60)])
    np.savetxt(path / "data.txt", data)
    np.savetxt(path / "index_features.txt", [0, 1, 2], fmt="%d")
    np.savetxt(path / "index_target.txt", [3], fmt="%d")
    np.savetxt(path / "index_train_0.txt", np.arange(50), fmt="%d")
    np.savetxt(path / "index_test_0.txt", np.arange(50, 60), fmt="%d")
    return path


def test_iblm_benchmark(tmp_path):
    data = _uci_directory(tmp_path)
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

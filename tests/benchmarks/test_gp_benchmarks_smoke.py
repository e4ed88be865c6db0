"""The GP benchmarks run end to end on tiny settings and write their outputs: GPflow's comparison as a command
(TensorFlow stays out of the test's process), the others in it (:mod:`.in_process`)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from ..helpers import ROOT, run_python
from .in_process import run_main


def _run(argv: list[str]):
    script = f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    return run_python(script)


@pytest.mark.slow
def test_gp_rf_vs_inducing_benchmark(tmp_path):
    if importlib.util.find_spec("gpflow") is None:  # importing it here would cost seconds and load TensorFlow
        pytest.skip("needs the [baselines] extra (gpflow, tensorflow)")
    argv = [str(ROOT / "benchmarks" / "gp_rf_vs_inducing.py"), "--functions", "otlcircuit"]
    argv += ["--num-points", "120", "--steps", "6", "--blocks", "4,8", "--batch-size", "32"]
    argv += ["--out", str(tmp_path), "--stem", "smoke"]
    result = _run(argv)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "smoke.json").read_text())["results"]
    methods = {"rf", "rf-whvi", "svgp-gpytorch", "svgp-gpflow"}
    assert {(r["function"], r["covariance"], r["whvi_block"], r["method"]) for r in rows} == {
        (f, c, b, m) for f in ("otlcircuit",) for c in ("diagonal", "full") for b in (4, 8) for m in methods
    }
    assert all(np.isfinite(r["rmse"]) and np.isfinite(r["mnll"]) for r in rows)
    for row in rows:  # matched budgets: RF at or below RF-WHVI's count, SVGP at or above (rounded up)
        if row["method"] == "rf":
            assert row["parameters"] <= row["budget"]
        elif row["method"].startswith("svgp"):
            assert row["parameters"] >= row["budget"]
        else:
            assert row["parameters"] == row["budget"]
    assert (tmp_path / "smoke.png").is_file()
    assert "RF-WHVI better in" in (tmp_path / "smoke.md").read_text()


def test_gp_rf_vs_inducing_rejects_unknown_names(tmp_path):
    status, _, stderr = run_main("gp_rf_vs_inducing", ["--functions", "branin", "--out", str(tmp_path)])
    assert status == 2 and "--functions: unknown ['branin']" in stderr


@pytest.mark.slow
def test_gp_speed_benchmark(tmp_path):
    argv = ["--dims", "4,40", "--num-features", "64", "--num-points", "32"]
    argv += ["--blocks", "4", "--batch-size", "16", "--iterations", "1", "--repeats", "1"]
    argv += ["--out", str(tmp_path), "--stem", "speed"]
    status, _, stderr = run_main("gp_speed", argv)
    assert status == 0, stderr[-3000:]
    rows = json.loads((tmp_path / "speed.json").read_text())["results"]
    assert {(r["d"], r["projection"]) for r in rows if r["kind"] == "features"} == {
        (d, p) for d in (4, 40) for p in ("dense", "fastfood", "sorf")
    }
    steps = [r for r in rows if r["kind"] == "step"]
    assert {(r["covariance"], r["projection"]) for r in steps} == {
        (c, p) for c in ("diagonal", "full") for p in ("dense", "sorf")
    }
    for r in steps:  # SVGP at or above RF-WHVI's parameter budget; the ratio is of the two step times
        assert r["svgp_parameters"] >= r["parameters"], r
        assert r["svgp_over_rf_whvi"] == pytest.approx(r["svgp_ms"] / r["rf_whvi_ms"]), r
    assert (tmp_path / "speed.png").is_file()

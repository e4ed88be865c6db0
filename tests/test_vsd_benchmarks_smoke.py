"""The VSD benchmark scripts run end to end, as commands, on tiny settings and write their outputs."""

from __future__ import annotations

import json

from .helpers import ROOT, run_python, uci_directory


def _run(script: str, argv: list[str]):
    argv = [str(ROOT / "benchmarks" / script), *argv]
    result = run_python(f"import runpy, sys; sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')")
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_digits_benchmark(tmp_path):
    argv = ["--models", "mlp,cnn", "--seeds", "1", "--steps", "4", "--eval-every", "2", "--samples", "3"]
    _run("vsd_digits.py", [*argv, "--kl-weights", "0.01,0.1", "--dropouts", "0.2", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_digits_mlp-cnn.json").read_text())
    assert {(r["model"], r["method"]) for r in record["rows"]} == {
        (m, k) for m in ("mlp", "cnn") for k in ("vsd", "mcd", "mfg")
    }
    assert all(0 <= r["error"] <= 1 and r["nll"] > 0 and r["setting"] in (0.01, 0.1, 0.2) for r in record["rows"])
    assert (tmp_path / "vsd_digits_mlp-cnn.png").is_file()


def test_digits_benchmark_iblm_init(tmp_path):
    argv = ["--models", "mlp", "--seeds", "1", "--steps", "2", "--eval-every", "1", "--samples", "3", "--init", "iblm"]
    _run("vsd_digits.py", [*argv, "--kl-weights", "0.01", "--dropouts", "0.2", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_digits_mlp.json").read_text())
    assert record["config"]["init"] == "iblm"
    assert {r["method"] for r in record["rows"]} == {"vsd", "mcd", "mfg"}


def test_uci_benchmark(tmp_path):
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    argv = ["--data-dir", str(data), "--splits", "1", "--steps", "4", "--eval-every", "2", "--fixed-noise-steps", "2"]
    _run("vsd_uci.py", [*argv, "--samples", "3", "--val-samples", "3", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_uci_toyuci.json").read_text())
    assert [r["method"] for r in record["summary"]] == ["vsd", "mcd"]
    assert all(r["fixed_noise"] is None for r in record["rows"])
    assert "test log-likelihood" in (tmp_path / "vsd_uci_toyuci.md").read_text()


def test_uci_benchmark_iblm_and_fixed_noise_grid(tmp_path):
    """``--noise-scales``: the noise std is a held-fixed candidate chosen with the method's setting."""
    (tmp_path / "toyuci").mkdir()
    data = uci_directory(tmp_path / "toyuci")
    argv = ["--data-dir", str(data), "--splits", "1", "--steps", "4", "--eval-every", "2", "--init", "iblm"]
    argv += ["--noise-scales", "0.2,0.3", "--kl-weights", "0.1", "--dropouts", "0.05"]
    _run("vsd_uci.py", [*argv, "--samples", "3", "--val-samples", "3", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "vsd_uci_toyuci.json").read_text())
    y_std = float(record["rows"][0]["noise_scale"]) / float(record["rows"][0]["fixed_noise"])
    for row in record["rows"]:
        assert row["fixed_noise"] in (0.2, 0.3)
        assert abs(row["noise_scale"] - row["fixed_noise"] * y_std) < 1e-9 * y_std  # held fixed: not trained
    assert "fixed noise std from [0.2, 0.3]" in (tmp_path / "vsd_uci_toyuci.md").read_text()


def test_speed_benchmark(tmp_path):
    _run("vsd_speed.py", ["--networks", "mlp 400x2", "--repeats", "1", "--batch-size", "400", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "vsd_speed.json").read_text())["results"]
    assert {r["method"] for r in rows} >= {"deterministic", "vsd T=1", "vsd T=2"}
    assert all(r["epoch_seconds"] > 0 for r in rows)

"""The ``whvi`` command line: ``whvi demo`` end to end on tiny settings, ``--help``, one-line errors."""

from __future__ import annotations

import json

import pytest

from ..helpers import run_python


def _whvi(*args: str):
    return run_python(
        f"import sys; from pyro_whvi.experiments.cli import main; sys.exit(main({list(args)!r}))", MPLBACKEND="Agg"
    )


@pytest.mark.slow
def test_demo_writes_its_table_and_plots(tmp_path):
    out = tmp_path / "demo"
    result = _whvi("demo", "--out", str(out), "--toy-steps", "20", "--digits-steps", "20", "--samples", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    record = {row["method"]: row for row in json.loads((out / "demo_results.json").read_text())["results"]}
    assert set(record) == {"whvi", "nf-whvi", "mfg", "mcd"}
    table = (out / "demo_results.md").read_text()
    for metrics in record.values():
        assert metrics["toy_sd_in_gap"] > 0  # predictions vary in the gap, for MC dropout too
        # The table shows the saved numbers (one row per method holds both).
        cells = (f"| {metrics['toy_sd_in_gap']:.3f} |", f"| {metrics['digits_error']:.3f} |")
        assert any(all(cell in line for cell in cells) for line in table.splitlines()), (metrics, table)
    assert (out / "demo_toy_bands.png").is_file() and (out / "demo_reliability.png").is_file()
    assert "| WHVI |" in (out / "demo_results.md").read_text() and "| WHVI |" in result.stdout
    # Each method's digits KL weight is the candidate with the lowest validation NLL.
    assert all(metrics["digits_kl_weight"] in (1.0, 0.1, 0.01) for metrics in record.values())


@pytest.mark.slow
def test_demo_numbers_do_not_depend_on_the_number_of_processes(tmp_path):
    """Every run is seeded on its own and trains in one thread: one process and two give the same table."""
    tables = {}
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        argv = ("demo", "--out", str(out), "--methods", "whvi,mcd", "--toy-steps", "15", "--digits-steps", "15")
        result = _whvi(*argv, "--samples", "4", "--jobs", jobs)
        assert result.returncode == 0, result.stderr[-3000:]
        rows = json.loads((out / "demo_results.json").read_text())["results"]
        tables[jobs] = [{k: v for k, v in row.items() if not k.endswith("seconds")} for row in rows]
    assert tables["1"] == tables["2"]


@pytest.mark.slow
def test_python_dash_m_and_help():
    result = run_python("import runpy; runpy.run_module('pyro_whvi', run_name='__main__')")
    assert result.returncode == 2 and "COMMAND" in result.stderr  # a command is required
    result = _whvi("demo", "--help")
    assert result.returncode == 0 and "--toy-steps" in result.stdout


@pytest.mark.slow
def test_bad_arguments_get_one_line_errors(tmp_path):
    for args, message in (
        (("demo", "--methods", "whvi,bbb"), "unknown methods ['bbb']"),
        (("demo", "--toy-steps", "0"), "expected a positive integer"),
        (("frobnicate",), "invalid choice"),
    ):
        result = _whvi(*args)
        assert result.returncode == 2 and message in result.stderr
        assert "Traceback" not in result.stderr
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    result = _whvi("demo", "--out", str(not_a_folder))
    assert result.returncode == 2 and "is not a folder" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_gp_runs_the_gp_experiment(tmp_path):
    result = _whvi(
        "gp",
        "--functions",
        "otlcircuit",
        "--methods",
        "rf,rf-whvi,svgp-gpytorch",
        "--covariances",
        "diagonal",
        "--blocks",
        "4",
        "--num-points",
        "100",
        "--steps",
        "3",
        "--batch-size",
        "16",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "gp_rf_vs_inducing.json").read_text())["results"]
    assert {r["method"] for r in rows} == {"rf", "rf-whvi", "svgp-gpytorch"}
    assert (tmp_path / "gp_rf_vs_inducing.png").is_file() and "RF-WHVI better in" in result.stdout
    result = _whvi("gp", "--blocks", "6")
    assert result.returncode == 2 and "--blocks must be powers of two" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_bench_runs_each_script_with_its_quick_flags(tmp_path):
    from pyro_whvi.experiments.bench import BENCHMARKS, QUICK_FLAGS

    for script in BENCHMARKS.values():  # stand-ins that record how they were called
        (tmp_path / script).write_text(
            "import json, sys, pathlib\n"
            "pathlib.Path(sys.argv[0]).with_suffix('.called').write_text(json.dumps(sys.argv[1:]))\n"
        )
    result = _whvi("bench", "all", "--quick", "--benchmarks", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    for name, script in BENCHMARKS.items():
        called = json.loads((tmp_path / script).with_suffix(".called").read_text())
        assert called == [*QUICK_FLAGS[name], "--out", str(tmp_path / "out")]
    result = _whvi("bench", "fwht", "--benchmarks", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "no benchmark scripts in" in result.stderr and "Traceback" not in result.stderr


def test_bench_finds_the_checkout_scripts():
    from pyro_whvi.experiments.bench import find_benchmarks

    assert (find_benchmarks() / "fwht.py").is_file()

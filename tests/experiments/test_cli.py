"""The ``whvi`` command line: ``whvi demo`` end to end on tiny settings, ``--help``, one-line errors."""

from __future__ import annotations

import json

import pytest

from ..helpers import run_python, whvi_in_process


def _whvi(*args: str):
    """``whvi ARGS`` in a fresh interpreter (what a user runs: worker processes, exit status, stdout/stderr)."""
    return run_python(
        f"import sys; from pyro_whvi.experiments.cli import main; sys.exit(main({list(args)!r}))", MPLBACKEND="Agg"
    )


DEMO_ARGUMENTS = ("--toy-steps", "15", "--digits-steps", "15", "--samples", "4")


@pytest.fixture(scope="module")
def demo_in_two_processes(tmp_path_factory):
    """``whvi demo`` as a user runs it: a fresh interpreter, every method, two worker processes."""
    out = tmp_path_factory.mktemp("demo")
    result = _whvi("demo", "--out", str(out), *DEMO_ARGUMENTS, "--jobs", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def _rows_without_seconds(out) -> dict[str, dict]:
    rows = json.loads((out / "demo_results.json").read_text())["results"]
    return {row["method"]: {k: v for k, v in row.items() if not k.endswith("seconds")} for row in rows}


@pytest.mark.slow
def test_demo_writes_its_table_and_plots(demo_in_two_processes):
    out, result = demo_in_two_processes
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
    assert all(metrics["digits_kl_weight"] in (0.1, 0.01) for metrics in record.values())


@pytest.mark.slow
def test_demo_numbers_do_not_depend_on_the_number_of_processes(demo_in_two_processes, tmp_path, monkeypatch):
    """Every run is seeded on its own and trains in one thread: one process (here, two methods: each method's row
    depends on its own runs only) gives the rows of the two-process run above."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    argv = ("demo", "--out", str(tmp_path), "--methods", "whvi,mcd", *DEMO_ARGUMENTS, "--jobs", "1")
    status, _, stderr = whvi_in_process(*argv)
    assert status == 0, stderr[-3000:]
    two_processes = _rows_without_seconds(demo_in_two_processes[0])
    assert _rows_without_seconds(tmp_path) == {method: two_processes[method] for method in ("whvi", "mcd")}


@pytest.mark.slow
def test_python_dash_m_and_help():
    result = run_python("import runpy; runpy.run_module('pyro_whvi', run_name='__main__')")
    assert result.returncode == 2 and "COMMAND" in result.stderr  # a command is required
    result = _whvi("demo", "--help")
    assert result.returncode == 0 and "--toy-steps" in result.stdout


def test_bad_arguments_get_one_line_errors(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    for args, message in (
        (("demo", "--methods", "whvi,bbb"), "unknown methods ['bbb']"),
        (("demo", "--toy-steps", "0"), "expected a positive integer"),
        (("frobnicate",), "invalid choice"),
        (("demo", "--out", str(not_a_folder)), "is not a folder"),
        (("gp", "--blocks", "6"), "--blocks must be powers of two"),
    ):
        status, _, stderr = whvi_in_process(*args)
        assert status == 2 and message in stderr and len(stderr.strip().splitlines()) <= 3, (args, stderr)
        assert "Traceback" not in stderr


@pytest.mark.slow
def test_a_bad_argument_exits_2_with_one_line_from_a_fresh_interpreter():
    """The whole path a user takes (the entry point, a real exit status, nothing imported before)."""
    result = _whvi("demo", "--methods", "whvi,bbb")
    assert result.returncode == 2 and "unknown methods ['bbb']" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_gp_runs_the_gp_experiment(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    status, stdout, stderr = whvi_in_process(
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
    assert status == 0, stderr[-3000:]
    rows = json.loads((tmp_path / "gp_rf_vs_inducing.json").read_text())["results"]
    assert {r["method"] for r in rows} == {"rf", "rf-whvi", "svgp-gpytorch"}
    assert (tmp_path / "gp_rf_vs_inducing.png").is_file() and "RF-WHVI better in" in stdout


@pytest.mark.slow
def test_bench_runs_each_script_with_its_quick_flags(tmp_path):
    from pyro_whvi.experiments.bench import BENCHMARKS, QUICK_FLAGS

    for script in BENCHMARKS.values():  # stand-ins that record how they were called
        (tmp_path / script).write_text(
            "import json, sys, pathlib\n"
            "pathlib.Path(sys.argv[0]).with_suffix('.called').write_text(json.dumps(sys.argv[1:]))\n"
        )
    argv = ("bench", "all", "--quick", "--benchmarks", str(tmp_path), "--out", str(tmp_path / "out"))
    status, _, stderr = whvi_in_process(*argv)
    assert status == 0, stderr[-3000:]
    for name, script in BENCHMARKS.items():
        called = json.loads((tmp_path / script).with_suffix(".called").read_text())
        assert called == [*QUICK_FLAGS[name], "--out", str(tmp_path / "out")]
    status, _, stderr = whvi_in_process("bench", "fwht", "--benchmarks", str(tmp_path / "nowhere"))
    assert status == 2 and "no benchmark scripts in" in stderr and "Traceback" not in stderr


def test_bench_finds_the_checkout_scripts():
    from pyro_whvi.experiments.bench import find_benchmarks

    assert (find_benchmarks() / "fwht.py").is_file()

"""The SVI-step benchmark script runs end to end, in the test's process (:mod:`.in_process`), on a tiny sweep and
writes its outputs."""

from __future__ import annotations

import json

import pytest
import torch

from .in_process import run_main


@pytest.mark.slow
def test_svi_step_benchmark_quick(tmp_path):
    argv = ["--quick", "--max-log2-d", "7", "--batch", "8", "--rounds", "1", "--min-run-time", "0.01"]
    argv += ["--threads", "1", "--device", "cpu", "--out", str(tmp_path)]  # --device cpu: the default, explicit
    # Inductor takes seconds per graph: tests/infer/test_jit_elbo.py and tests/nn/test_nn_layers.py run it.
    argv += ["--compile-backend", "aot_eager"]
    status, _, stderr = run_main("svi_step", argv)
    assert status == 0, stderr[-3000:]
    for suffix in ("json", "csv", "md", "png"):
        assert (tmp_path / f"svi_step_quick.{suffix}").is_file(), suffix
    data = json.loads((tmp_path / "svi_step_quick.json").read_text())
    assert data["meta"]["validation"] is False and data["meta"]["threads"] == 1 and data["meta"]["clock"] == "wall"
    assert data["meta"]["device"] == "CPU, 1 threads" and data["meta"]["compile_backend"] == "aot_eager"
    rows = {row["D"]: row for row in data["results"]}
    assert sorted(rows) == [128]
    for size, row in rows.items():
        assert row["batch"] == 8
        cases = ("plain", "plain_compiled", "layers", "layers_compiled", "autonormal", "whvi")
        cases += ("autonormal_jit", "whvi_jit", "whvi_module")  # the fast path: JitTrace_ELBO, one optimizer
        cases += ("autonormal_jit_compile", "whvi_jit_compile")  # the same compiled by torch.compile
        assert {f"{case}_ms_per_step" for case in cases} <= set(row), sorted(row)
        assert all(row[f"{case}_ms_per_step"] > 0 and row[f"{case}_setup_s"] > 0 for case in cases)
        assert row["whvi_jit_over_plain"] == pytest.approx(row["whvi_jit_ms_per_step"] / row["plain_ms_per_step"])
        assert row["whvi_jit_over_autonormal_jit"] == pytest.approx(
            row["whvi_jit_ms_per_step"] / row["autonormal_jit_ms_per_step"]
        )
        assert row["whvi_jit_compile_over_autonormal_jit_compile"] == pytest.approx(
            row["whvi_jit_compile_ms_per_step"] / row["autonormal_jit_compile_ms_per_step"]
        )
        assert row["layers_over_plain"] == pytest.approx(row["layers_ms_per_step"] / row["plain_ms_per_step"])
        assert row["whvi_over_autonormal"] == pytest.approx(row["whvi_ms_per_step"] / row["autonormal_ms_per_step"])
        # AutoNormal: a loc and a scale per weight and bias of the [D, D, D, 1] network.
        assert row["autonormal_params"] == 2 * (2 * size * size + 3 * size + 1)
        assert 0 < row["whvi_params"] < row["autonormal_params"]
        # The layers: the guide's WHVI and mean-field parameters, plus the learned noise scale (a point estimate).
        assert row["layers_params"] == row["whvi_params"] + 1
    table = (tmp_path / "svi_step_quick.md").read_text()
    assert "| D | plain PyTorch | plain PyTorch, compiled |" in table and "wall time" in table
    assert "| SVI AutoNormal, JIT | SVI AutoWHVIGuide, JIT | SVI AutoNormal, JIT torch.compile |" in table
    assert "| SVI AutoWHVIGuide, JIT torch.compile | AutoWHVIGuide, JIT ELBOModule |" in table
    assert "torch.compile's backend: 'aot_eager'" in table and "Set-up of each case, wall seconds" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_svi_step_benchmark_device_cuda_without_cuda_is_a_clear_error(tmp_path):
    status, _, stderr = run_main("svi_step", ["--device", "cuda", "--out", str(tmp_path)])  # an exception propagates
    assert status == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert "error: --device cuda: PyTorch sees no CUDA GPU here" in stderr and "--device cpu" in stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("backend", ["torchscript", "fast"])
def test_svi_step_benchmark_names_a_bad_compile_backend(tmp_path, backend):
    status, _, stderr = run_main("svi_step", ["--compile-backend", backend, "--out", str(tmp_path)])
    assert status == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert "--compile-backend" in stderr and not list(tmp_path.iterdir())

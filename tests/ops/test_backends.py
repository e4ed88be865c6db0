"""Backend selection: run-time switch, environment variable, fallback with a single warning."""

from __future__ import annotations

import pytest
import torch

from pyro_whvi import ops

from ..helpers import require_compiled_kernels, run_python


def test_set_and_use_backend():
    previous = ops.get_backend()
    with ops.use_backend("reference"):
        assert ops.get_backend() == "reference"
        ops.set_backend("compiled")
        assert ops.get_backend() == "compiled"
    assert ops.get_backend() == previous
    with pytest.raises(ValueError, match=r"unknown backend 'fast'.*auto, compiled, reference"):
        ops.set_backend("fast")


def test_backends_agree():
    require_compiled_kernels()
    x = torch.randn(6, 256)
    s1, g, s2 = torch.randn(3, 256).unbind(0)
    results = {}
    for name in ("reference", "compiled"):
        with ops.use_backend(name):
            inplace, out = x.clone(), torch.empty_like(x)
            ops.fwht_(inplace, normalized=False)
            ops.fwht(x, out=out)
            results[name] = (ops.fwht(x), ops.whvi_matvec(x, s1, g, s2), inplace, out)
    for a, b in zip(results["reference"], results["compiled"]):
        torch.testing.assert_close(a, b)


def test_missing_compiler_falls_back_with_one_warning(tmp_path):
    result = run_python(
        """
        import warnings, torch
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import pyro_whvi
            from pyro_whvi import ops
            x = torch.randn(3, 8)
            y1 = ops.fwht(x); y2 = ops.fwht(x); ops.whvi_matvec(x, x[0], x[1], x[2])
        assert torch.allclose(y1, ops.reference.fwht(x))
        messages = [str(w.message) for w in caught if "compiled CPU kernels could not be built" in str(w.message)]
        assert len(messages) == 1, messages
        assert "no C++ compiler" in messages[0]
        print("ok")
        """,
        CXX="/nonexistent/c++",
        TORCH_EXTENSIONS_DIR=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_env_var_forces_reference(tmp_path):
    result = run_python(
        """
        import warnings, torch
        warnings.simplefilter("error")
        from pyro_whvi import ops
        assert ops.get_backend() == "reference"
        ops.fwht(torch.randn(2, 16))
        assert ops.backends._State.compiled is None
        print("ok")
        """,
        PYRO_WHVI_BACKEND="reference",
        CXX="/nonexistent/c++",
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_env_var_forcing_compiled_raises_when_unavailable(tmp_path):
    result = run_python(
        """
        import torch
        from pyro_whvi import ops
        try:
            ops.fwht(torch.randn(2, 16))
        except RuntimeError as error:
            assert "backend 'compiled' was requested" in str(error), error
            print("ok")
        """,
        PYRO_WHVI_BACKEND="compiled",
        CXX="/nonexistent/c++",
        TORCH_EXTENSIONS_DIR=str(tmp_path),
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_bad_env_var_is_reported():
    result = run_python("import torch, pyro_whvi; pyro_whvi.ops.fwht(torch.ones(2))", PYRO_WHVI_BACKEND="cuda-please")
    assert result.returncode != 0
    assert "$PYRO_WHVI_BACKEND: unknown backend 'cuda-please'" in result.stderr


def test_kernel_sources_are_found():
    assert (ops.backends.kernel_source_dir() / "fwht_cpu.cpp").is_file()

"""torch.library registration: opcheck, fake kernels and torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

from pyro_whvi import ops

from ..helpers import require_compiled_kernels, run_python


def _samples():
    size = 16
    x = torch.randn(3, size, requires_grad=True)
    s1, g, s2 = (torch.randn(size, requires_grad=True) for _ in range(3))
    g_rows = torch.randn(3, size, requires_grad=True)
    return [
        (torch.ops.pyro_whvi.fwht.default, (x, True)),
        (torch.ops.pyro_whvi.fwht.default, (torch.randn(2, 4, 8), False)),
        (torch.ops.pyro_whvi.whvi_matvec.default, (x, s1, g, s2)),
        (torch.ops.pyro_whvi.whvi_matvec.default, (x, s1, g_rows, s2)),
        (torch.ops.pyro_whvi.whvi_design.default, (torch.randn(3, size, size, requires_grad=True), s1, s2)),
        (
            torch.ops.pyro_whvi.whvi_fourier_design_backward.default,
            (torch.randn(3, size), torch.randn(3, 2 * size), s1.detach(), s2.detach()),
        ),
        (torch.ops.pyro_whvi.fastfood.default, (x, *_fastfood_buffers(size))),
        (torch.ops.pyro_whvi.fastfood_transpose.default, (torch.randn(3, 2, size), *_fastfood_buffers(size))),
        (torch.ops.pyro_whvi.planar.default, (x, s1, g, torch.randn(1, requires_grad=True))),
        (torch.ops.pyro_whvi.planar.default, (torch.randn(2, 3, size), s1, g, torch.randn(1))),
    ]


def _fastfood_buffers(size: int, blocks: int = 2):
    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (blocks, size), generator=generator).double() * 2 - 1
    permutation = torch.argsort(torch.rand(blocks, size, generator=generator), dim=-1)
    gaussian, scale = torch.randn(2, blocks, size, generator=generator).unbind(0)
    return signs, permutation, gaussian, scale


def test_opcheck_compiled_kernels():
    require_compiled_kernels()
    for op, args in _samples():
        torch.library.opcheck(op, args)


@pytest.mark.slow
def test_opcheck_reference_kernels_in_a_fresh_process():
    """With the compiled library never loaded, the ops run their registered reference kernels."""
    script = """
        import torch
        torch.set_default_dtype(torch.float64)
        from pyro_whvi import ops
        from tests.ops.test_registration import _samples
        for op, args in _samples():
            torch.library.opcheck(op, args)
        x, s1, g, s2 = (torch.randn(2, 8, requires_grad=True) for _ in range(4))
        assert torch.autograd.gradgradcheck(torch.ops.pyro_whvi.whvi_matvec, (x, s1[0], g, s2[0]))
        assert torch.autograd.gradgradcheck(torch.ops.pyro_whvi.fwht, (x, True))
        assert torch.autograd.gradgradcheck(torch.ops.pyro_whvi.planar, (x, s1[0], g[0], s2[0, :1]))
        assert ops.backends._State.compiled is None  # nothing was built or loaded
        print("ok")
        """
    result = run_python(script, PYRO_WHVI_BACKEND="reference")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok" in result.stdout


def _model(x, s1, g, s2):
    h = ops.whvi_matvec(x, s1, g, s2)
    return ops.fwht(torch.tanh(h)).sum(-1)


@pytest.mark.parametrize("compile_backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_fullgraph(backend, compile_backend):
    torch._dynamo.reset()
    size = 32
    x = torch.randn(4, size, requires_grad=True)
    s1, s2 = (torch.randn(size, requires_grad=True) for _ in range(2))
    g = torch.randn(4, size, requires_grad=True)
    compiled = torch.compile(_model, fullgraph=True, backend=compile_backend)
    out = compiled(x, s1, g, s2)
    expected = _model(x, s1, g, s2)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (x, s1, g, s2))
    expected_grads = torch.autograd.grad(expected.sum(), (x, s1, g, s2))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)


def test_fake_kernels_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, 64)
        s = torch.empty(64)
        assert torch.ops.pyro_whvi.fwht(x, True).shape == (5, 7, 64)
        assert torch.ops.pyro_whvi.whvi_matvec(x, s, x, s).shape == (5, 7, 64)
        grads = torch.ops.pyro_whvi.whvi_matvec_backward(x, x, s, x, s)
        assert [t.shape for t in grads] == [x.shape, s.shape, x.shape, s.shape]
        matrices = torch.empty(5, 8, 8)
        d = torch.empty(8)
        assert torch.ops.pyro_whvi.whvi_design(matrices, d, d).shape == (5, 8)
        grads = torch.ops.pyro_whvi.whvi_fourier_design_backward(torch.empty(5, 8), torch.empty(5, 40), d, d)
        assert [t.shape for t in grads] == [(5, 20), (8,), (8,), (5,)]
        blocks = torch.empty(3, 64)
        permutation = torch.empty(3, 64, dtype=torch.int64)
        assert torch.ops.pyro_whvi.fastfood(x, blocks, permutation, blocks, blocks).shape == (5, 7, 3, 64)
        transposed = torch.ops.pyro_whvi.fastfood_transpose(torch.empty(5, 3, 64), blocks, permutation, blocks, blocks)
        assert transposed.shape == (5, 64)
        y, log_det = torch.ops.pyro_whvi.planar(x, s, s, torch.empty(1))
        assert (y.shape, log_det.shape) == ((5, 7, 64), (5, 7))
        grads = torch.ops.pyro_whvi.planar_backward(None, torch.empty(5, 7), x, s, s, torch.empty(1))
        assert [t.shape for t in grads] == [x.shape, s.shape, s.shape, (1,)]

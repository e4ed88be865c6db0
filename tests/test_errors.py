"""Bad input fails early, saying what was expected and how to fix it."""

from __future__ import annotations

import pytest
import torch

from pyro_whvi import ops

from .helpers import require_compiled_kernels


@pytest.mark.parametrize("size", [3, 12, 1000])
def test_fwht_not_a_power_of_two(backend, size):
    with pytest.raises(ValueError, match=rf"size {size}, which is not a power of two.*pad_to_power_of_two"):
        ops.fwht(torch.randn(2, size))


def test_fwht_empty_last_dimension(backend):
    with pytest.raises(ValueError, match="size 0"):
        ops.fwht(torch.randn(2, 0))


@pytest.mark.parametrize(
    ("dtype", "kind"),
    [(torch.int64, "integer"), (torch.int32, "integer"), (torch.bool, "boolean"), (torch.complex64, "complex")],
)
def test_fwht_bad_dtypes(backend, dtype, kind):
    x = torch.zeros(2, 8, dtype=dtype)
    with pytest.raises(TypeError, match=rf"{kind} dtype.*\.float\(\)"):
        ops.fwht(x)


def test_fwht_not_a_tensor_or_scalar(backend):
    with pytest.raises(TypeError, match=r"must be a torch\.Tensor, got list"):
        ops.fwht([1.0, 2.0])
    with pytest.raises(ValueError, match="at least one dimension"):
        ops.fwht(torch.tensor(1.0))


def _diagonals(size=8):
    return torch.randn(3, size).unbind(0)


def test_whvi_matvec_mismatched_last_dimension(backend):
    x = torch.randn(4, 8)
    s1, g, s2 = _diagonals()
    with pytest.raises(ValueError, match=r"g has shape \(16,\) but x has shape \(4, 8\)"):
        ops.whvi_matvec(x, s1, torch.randn(16), s2)
    with pytest.raises(ValueError, match="s1 has shape"):
        ops.whvi_matvec(x, torch.randn(4), g, s2)


def test_whvi_matvec_batch_does_not_broadcast(backend):
    s1, _, s2 = _diagonals()
    with pytest.raises(ValueError, match="batch shapes do not broadcast"):
        ops.whvi_matvec(torch.randn(4, 8), s1, torch.randn(5, 8), s2)


def test_whvi_matvec_not_power_of_two(backend):
    with pytest.raises(ValueError, match="not a power of two"):
        ops.whvi_matvec(torch.randn(2, 6), *torch.randn(3, 6).unbind(0))


def test_whvi_matvec_dtype_mismatch(backend):
    s1, g, s2 = _diagonals()
    with pytest.raises(TypeError, match=r"g has dtype torch\.float32 but x has torch\.float64"):
        ops.whvi_matvec(torch.randn(2, 8), s1, g.float(), s2)
    with pytest.raises(TypeError, match="integer dtype"):
        ops.whvi_matvec(torch.randn(2, 8), s1, torch.ones(8, dtype=torch.long), s2)


def test_whvi_matvec_devices(backend):
    s1, g, s2 = _diagonals()
    with pytest.raises(ValueError, match="g is on meta but x is on cpu"):
        ops.whvi_matvec(torch.randn(2, 8), s1, g.to("meta"), s2)


def test_compiled_kernels_reject_bad_input_on_direct_calls():
    require_compiled_kernels()
    with pytest.raises(RuntimeError, match="power of two"):
        torch.ops.pyro_whvi.fwht(torch.randn(2, 6), True)
    with pytest.raises(RuntimeError, match="trailing dimensions"):
        torch.ops.pyro_whvi.whvi_matvec(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), torch.randn(8))

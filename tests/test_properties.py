"""Hypothesis property tests over shapes, sizes and values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_whvi import ops

from .conftest import BACKENDS
from .helpers import require_compiled_kernels

log2_sizes = st.integers(min_value=0, max_value=11)
batch_shapes = st.lists(st.integers(min_value=1, max_value=4), min_size=0, max_size=3)
seeds = st.integers(min_value=0, max_value=2**31 - 1)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(log2_size=log2_sizes, batch=batch_shapes, seed=seeds)
def test_fwht_is_an_orthonormal_involution(backend, log2_size, batch, seed):
    if backend == "compiled":
        require_compiled_kernels()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, 2**log2_size, generator=generator, dtype=torch.float64)
    with ops.use_backend(backend):
        y = ops.fwht(x)
        torch.testing.assert_close(ops.fwht(y), x)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y, ops.reference.fwht(x))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(log2_size=log2_sizes, batch=batch_shapes, seed=seeds, per_example=st.booleans())
def test_whvi_matvec_factorizes(backend, log2_size, batch, seed, per_example):
    """W x = s1 * H(g * H(s2 * x)) equals composing the separate ops, and W^T is the same op with s1, s2 swapped."""
    if backend == "compiled":
        require_compiled_kernels()
    size = 2**log2_size
    generator = torch.Generator().manual_seed(seed)
    x, z = torch.randn(2, *batch, size, generator=generator, dtype=torch.float64).unbind(0)
    s1, s2 = torch.randn(2, size, generator=generator, dtype=torch.float64).unbind(0)
    g = torch.randn(*(batch if per_example else []), size, generator=generator, dtype=torch.float64)
    with ops.use_backend(backend):
        y = ops.whvi_matvec(x, s1, g, s2)
        torch.testing.assert_close(y, s1 * ops.fwht(g * ops.fwht(s2 * x)))
        # <W x, z> = <x, W^T z>
        back = ops.whvi_matvec(z, s2, g, s1)
    torch.testing.assert_close((y * z).sum(-1), (x * back).sum(-1))

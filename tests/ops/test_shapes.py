"""Padding and WHVI Algorithm 1 (stacked blocks for any weight shape)."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_whvi import ops

from ..helpers import dense_weight


@pytest.mark.parametrize(
    ("n", "expected"), [(0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024), (1024, 1024), (1025, 2048)]
)
def test_next_power_of_two(n, expected):
    assert ops.next_power_of_two(n) == expected


def test_pad_to_power_of_two():
    x = torch.randn(3, 5)
    padded = ops.pad_to_power_of_two(x)
    assert padded.shape == (3, 8)
    torch.testing.assert_close(padded[:, :5], x)
    assert padded[:, 5:].abs().sum() == 0
    assert ops.pad_to_power_of_two(torch.randn(4, 8)).shape == (4, 8)
    assert ops.pad_to_power_of_two(torch.randn(6, 3), dim=0).shape == (8, 3)
    with pytest.raises(ValueError, match="at least one dimension"):
        ops.pad_to_power_of_two(torch.tensor(1.0))


@pytest.mark.parametrize(
    ("d_in", "d_out", "block", "padding", "blocks"),
    [
        (8, 8, 8, 0, 1),  # square power of two: a single block
        (5, 3, 8, 3, 1),  # pad the input, drop 5 output rows
        (100, 300, 128, 28, 3),
        (784, 100, 1024, 240, 1),
        (1, 10, 1, 0, 10),
        (64, 1, 64, 0, 1),
    ],
)
def test_setup_dimensions(d_in, d_out, block, padding, blocks):
    dims = ops.setup_dimensions(d_in, d_out)
    assert (dims.block_size, dims.padding, dims.num_blocks) == (block, padding, blocks)
    assert dims.padded_out_features == block * blocks >= d_out
    assert dims.num_variational_parameters == 3 * block * blocks
    assert dims.block_size == 2 ** math.ceil(math.log2(d_in))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_setup_dimensions_rejects(bad):
    with pytest.raises(ValueError, match="positive integer"):
        ops.setup_dimensions(bad, 4)


@pytest.mark.parametrize(("d_in", "d_out"), [(5, 3), (6, 20), (16, 16), (3, 1)])
def test_stacked_matvec_equals_dense_weight(backend, d_in, d_out):
    dims = ops.setup_dimensions(d_in, d_out)
    shape = (dims.num_blocks, dims.block_size)
    s1, g, s2 = torch.randn(3, *shape).unbind(0)
    x = torch.randn(7, d_in)
    weight = ops.stacked_whvi_weight(s1, g, s2, d_out, d_in)
    assert weight.shape == (d_out, d_in)
    torch.testing.assert_close(ops.stacked_whvi_matvec(x, s1, g, s2, d_out), x @ weight.T)
    # each block is S1 H diag(g) H S2 with H from scipy
    blocks = torch.cat([dense_weight(s1[k], g[k], s2[k]) for k in range(dims.num_blocks)])
    torch.testing.assert_close(weight, blocks[:d_out, :d_in])


def test_stacked_matvec_per_example_g(backend):
    dims = ops.setup_dimensions(6, 20)
    s1, s2 = torch.randn(2, dims.num_blocks, dims.block_size).unbind(0)
    x = torch.randn(5, 6)
    g = torch.randn(5, dims.num_blocks, dims.block_size)
    y = ops.stacked_whvi_matvec(x, s1, g, s2, 20)
    for i in range(5):
        weight = ops.stacked_whvi_weight(s1, g[i], s2, 20, 6)
        torch.testing.assert_close(y[i], weight @ x[i])


def test_stacked_errors():
    s1 = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"g must have shape \(..., K, D\)"):
        ops.stacked_whvi_matvec(torch.randn(3, 8), s1, torch.randn(8), s1, 10)
    with pytest.raises(ValueError, match="at most 8"):
        ops.stacked_whvi_matvec(torch.randn(3, 9), s1, s1, s1, 10)
    with pytest.raises(ValueError, match=r"out_features must be in \[1, 16\]"):
        ops.stacked_whvi_matvec(torch.randn(3, 8), s1, s1, s1, 17)

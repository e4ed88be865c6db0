"""``pyro_whvi.train.denormals``: subnormal floats flushed to zero while the engine trains, and only then."""

from __future__ import annotations

import pytest
import torch
from pyro.infer.autoguide import AutoDelta

from pyro_whvi.nn import BayesianMLP
from pyro_whvi.train.denormals import flush_denormals, flushing_denormals
from pyro_whvi.train.engine import Schedule, train

from ..helpers import regression_data

SUBNORMAL = 1e-40  # below float32's smallest normal 1.18e-38


@pytest.fixture(autouse=True)
def not_flushing():
    torch.set_flush_denormal(False)  # the process default; a failed test must not leave the mode on
    yield
    torch.set_flush_denormal(False)


def test_within_the_block_subnormals_are_zero_and_after_it_they_are_back():
    x = torch.full((4,), SUBNORMAL, dtype=torch.float32)
    assert not flushing_denormals() and bool((x * 1).ne(0).all())
    with flush_denormals() as supported:
        if not supported:
            pytest.skip("this CPU cannot flush subnormals (neither x86 with SSE3 nor ARM64)")
        assert flushing_denormals()
        assert bool((x * 1).eq(0).all())  # an operand that is subnormal reads as zero
        assert (
            float(torch.tensor([torch.finfo(torch.float32).tiny], dtype=torch.float32) / 4) == 0.0
        )  # a subnormal result is zero
        assert float(torch.tensor([2e-38], dtype=torch.float32) * 2) == pytest.approx(
            4e-38
        )  # normal numbers are untouched
        assert float(torch.tensor([1e-300]) * 1e-10) == 0.0  # float64's subnormals too (the tests' default dtype)
    assert not flushing_denormals() and bool((x * 1).ne(0).all())


def test_a_mode_the_caller_set_is_kept():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    with flush_denormals():
        assert flushing_denormals()
    assert flushing_denormals()  # the caller's setting, not the default


def test_the_engine_trains_with_subnormals_flushed_and_restores_the_mode_after():
    x, y = regression_data(32)
    model = BayesianMLP([5, 8, 1])
    seen = []
    supported = torch.set_flush_denormal(False)
    schedule = Schedule(steps=3, batch_size=16)
    train(model, AutoDelta(model), x, y, schedule, callback=lambda _: seen.append(flushing_denormals()), progress=False)
    assert seen == [supported] * 3
    assert not flushing_denormals()

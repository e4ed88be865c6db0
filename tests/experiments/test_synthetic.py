"""The synthetic GP benchmark functions (known values, hand computations, ranges) and the dataset generator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_whvi.data.synthetic import (
    ANALOGUE_FUNCTIONS,
    BENCH_FUNCTIONS,
    SYNTHETIC_FUNCTIONS,
    borehole,
    hartmann4,
    hartmann6,
    latin_hypercube,
    make_synthetic_dataset,
    otl_circuit,
    rastrigin,
    robot_arm,
    wing_weight,
)

NAMES = ("borehole", "hartmann6", "rastrigin5", "robot", "otlcircuit")


def _midpoint(name: str) -> np.ndarray:
    spec = BENCH_FUNCTIONS[name]
    return np.array([[(lo + hi) / 2 for lo, hi in zip(spec.lower, spec.upper)]])


def _sample(name: str, num: int = 20_000) -> np.ndarray:
    spec = BENCH_FUNCTIONS[name]
    return spec(spec.from_unit(np.random.default_rng(123).random((num, spec.dim))))


def test_registry():
    assert tuple(SYNTHETIC_FUNCTIONS) == NAMES
    sizes = {name: spec.paper_size for name, spec in SYNTHETIC_FUNCTIONS.items()}
    expected = {"borehole": 200_000, "hartmann6": 30_000, "rastrigin5": 10_000, "robot": 150_000, "otlcircuit": 20_000}
    assert sizes == expected
    assert [SYNTHETIC_FUNCTIONS[n].dim for n in NAMES] == [8, 6, 5, 8, 6]
    for spec in SYNTHETIC_FUNCTIONS.values():
        assert all(lo < hi for lo, hi in zip(spec.lower, spec.upper))


def test_analogue_registry():
    # stand-ins for power (4 inputs, 9,568 rows) and protein (9 inputs, 45,730 rows), after the paper's five
    assert {name: (spec.dim, spec.paper_size) for name, spec in ANALOGUE_FUNCTIONS.items()} == {
        "hartmann4": (4, 9_568),
        "wingweight": (10, 45_730),
    }
    assert tuple(BENCH_FUNCTIONS) == (*NAMES, "hartmann4", "wingweight")


def test_hartmann4_is_the_rescaled_truncation_of_hartmann6():
    # Picheny et al.'s minimum (DiceOptim's hartman4): -3.135474 at (0.1873, 0.1906, 0.5566, 0.2647)
    assert hartmann4(np.array([[0.1873, 0.1906, 0.5566, 0.2647]]))[0] == pytest.approx(-3.135474, abs=2e-3)
    values = _sample("hartmann4")
    assert values.min() > -3.1356
    # rescaled to about zero mean and unit variance on the unit cube (20,000 uniform points; the rescaling is
    # Picheny's, fitted to their own design, so 0.1 is allowed)
    assert abs(values.mean()) < 0.1 and abs(values.std() - 1) < 0.1
    # the first four columns of hartmann6's inner sum, by hand at one point
    x = np.array([[0.3, 0.6, 0.1, 0.9]])
    alpha = [1.0, 1.2, 3.0, 3.2]
    a = [[10, 3, 17, 3.5], [0.05, 10, 17, 0.1], [3, 3.5, 1.7, 10], [17, 8, 0.05, 10]]
    p = [[0.1312, 0.1696, 0.5569, 0.0124], [0.2329, 0.4135, 0.8307, 0.3736]]
    p += [[0.2348, 0.1451, 0.3522, 0.2883], [0.4047, 0.8828, 0.8732, 0.5743]]
    total = sum(alpha[i] * math.exp(-sum(a[i][j] * (x[0, j] - p[i][j]) ** 2 for j in range(4))) for i in range(4))
    assert hartmann4(x)[0] == pytest.approx((1.1 - total) / 0.839, rel=1e-12)


def test_wing_weight_by_hand_and_its_physics():
    sw, wfw, aspect, _sweep, q, taper, tc, nz, wdg, wp = 175, 260, 8, 0, 30.5, 0.75, 0.13, 4.25, 2100, 0.0525
    # the domain's midpoint has sweep 0, so cos(sweep) = 1
    wing = 0.036 * sw**0.758 * wfw**0.0035 * aspect**0.6 * q**0.006 * taper**0.04 * (100 * tc) ** -0.3
    by_hand = wing * (nz * wdg) ** 0.49 + sw * wp
    assert wing_weight(_midpoint("wingweight"))[0] == pytest.approx(by_hand, rel=1e-12)
    # the sweep enters as cos(degrees): +-10 degrees give the same weight
    swept = _midpoint("wingweight").repeat(2, axis=0)
    swept[:, 3] = (10.0, -10.0)
    assert swept[0, 3] == 10 and wing_weight(swept)[0] == pytest.approx(wing_weight(swept)[1], rel=1e-14)
    # heavier with more wing area, load factor and gross weight
    for column in (0, 7, 8):
        more = _midpoint("wingweight")
        more[0, column] *= 1.1
        assert wing_weight(more)[0] > by_hand
    values = _sample("wingweight")
    assert 100 < values.min() and values.max() < 500  # the published range is about 123-463 lb


def test_hartmann6_global_minimum():
    x_star = np.array([[0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573]])
    assert hartmann6(x_star)[0] == pytest.approx(-3.32237, abs=1e-4)
    # No sampled point beats the minimum, and the function is negative everywhere.
    values = _sample("hartmann6")
    assert values.min() > -3.32237 - 1e-6
    assert values.max() < 0


def test_hartmann6_midpoint_by_hand():
    alpha = [1.0, 1.2, 3.0, 3.2]
    a = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
    p = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ]
    expected = 0.0
    for i in range(4):
        exponent = sum(a[i][j] * (0.5 - p[i][j]) ** 2 for j in range(6))
        expected -= alpha[i] * math.exp(-exponent)
    assert hartmann6(_midpoint("hartmann6"))[0] == pytest.approx(expected, rel=1e-12)


def test_rastrigin_values():
    assert rastrigin(np.zeros((1, 5)))[0] == 0.0
    # cos(pi) = -1: each coordinate at 0.5 contributes 0.25 + 10, on top of 10 per dimension.
    assert rastrigin(np.full((1, 5), 0.5))[0] == pytest.approx(50 + 5 * 10.25, abs=1e-12)
    # cos(2 pi) = 1: each coordinate at 1 contributes 1 - 10.
    assert rastrigin(np.ones((1, 5)))[0] == pytest.approx(5.0, abs=1e-12)
    assert rastrigin(np.ones((1, 3)))[0] == pytest.approx(3.0, abs=1e-12)  # any dimension
    values = _sample("rastrigin5")
    assert values.min() >= 0
    assert values.max() <= 5 * (5.12**2 + 20)


def test_robot_arm_values():
    assert robot_arm(np.array([[0, 0, 0, 0, 0.1, 0.2, 0.3, 0.4]]))[0] == pytest.approx(1.0, abs=1e-14)
    # A right angle at the first joint only: segment 1 along x, segments 2..4 along y.
    half_pi = math.pi / 2
    assert robot_arm(np.array([[0, half_pi, 0, 0, 0.3, 0.1, 0.1, 0.2]]))[0] == pytest.approx(0.5, abs=1e-14)
    # Midpoint: all angles pi fold the arm back and forth (pi, 2pi, 3pi, 4pi) with equal lengths 0.5.
    assert robot_arm(_midpoint("robot"))[0] == pytest.approx(0.0, abs=1e-12)
    values = _sample("robot")
    assert values.min() >= 0
    assert values.max() <= 4.0  # the sum of the lengths


def test_borehole_midpoint_by_hand():
    rw, r, tu, hu, tl, hl, length, kw = 0.1, 25050.0, 89335.0, 1050.0, 89.55, 760.0, 1400.0, 10950.0
    log_ratio = math.log(r) - math.log(rw)
    numerator = 2 * math.pi * tu * (hu - hl)
    leakage = 2 * length * tu / (log_ratio * rw * rw * kw)
    denominator = log_ratio * (1 + leakage + tu / tl)
    expected = numerator / denominator
    assert expected == pytest.approx(70.87, abs=0.01)
    assert borehole(_midpoint("borehole"))[0] == pytest.approx(expected, rel=1e-12)
    values = _sample("borehole")
    assert values.min() > 0
    assert values.max() < 310


def test_otl_circuit_midpoint_by_hand():
    rb1, rb2, rf, rc1, rc2, beta = 100.0, 47.5, 1.75, 1.85, 0.725, 175.0
    vb1 = 12 * rb2 / (rb1 + rb2)
    term1 = (vb1 + 0.74) * beta * (rc2 + 9) / (beta * (rc2 + 9) + rf)
    term2 = 11.35 * rf / (beta * (rc2 + 9) + rf)
    term3 = 0.74 * rf * beta * (rc2 + 9) / ((beta * (rc2 + 9) + rf) * rc1)
    expected = term1 + term2 + term3
    assert expected == pytest.approx(5.3106, abs=1e-4)
    assert otl_circuit(_midpoint("otlcircuit"))[0] == pytest.approx(expected, rel=1e-12)
    # Since beta (Rc2 + 9) >> Rf, Vm ~ Vb1 + 0.74 + 0.74 Rf / Rc1, between about 1.71 + 0.74 + 0.15 (Vb1 and
    # Rf / Rc1 smallest) and 7 + 0.74 + 1.85 (largest).
    values = _sample("otlcircuit")
    assert values.min() > 2.5
    assert values.max() < 9.7


def test_functions_check_shapes():
    with pytest.raises(ValueError, match=r"\(N, 8\)"):
        borehole(np.zeros((3, 7)))
    with pytest.raises(ValueError, match="hartmann6"):
        hartmann6(np.zeros(6))
    assert robot_arm(np.zeros((4, 8))).shape == (4,)


def test_latin_hypercube_strata():
    u = latin_hypercube(37, 3, np.random.default_rng(0))
    assert u.shape == (37, 3)
    for column in u.T:
        assert sorted(np.floor(column * 37).astype(int)) == list(range(37))


@pytest.mark.parametrize("name", NAMES)
def test_dataset_shapes_and_standardization(name):
    spec = SYNTHETIC_FUNCTIONS[name]
    data = make_synthetic_dataset(name, num_points=500, seed=3)
    assert data.name == name
    assert data.train_x.shape == (400, spec.dim)
    assert data.test_x.shape == (100, spec.dim)
    assert data.train_y.shape == (400,)
    assert data.test_y.shape == (100,)
    for tensor in (data.train_x, data.train_y, data.test_x, data.test_y):
        assert tensor.dtype == torch.float64
    x = torch.cat([data.train_x, data.test_x])
    assert x.min() >= 0 and x.max() <= 1
    assert float(data.train_y.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(data.train_y.std(unbiased=False)) == pytest.approx(1.0, abs=1e-12)
    # Targets are the function at the rescaled inputs, in standardized units.
    raw = spec(spec.from_unit(data.test_x.numpy()))
    np.testing.assert_allclose(data.test_y.numpy() * data.y_std + data.y_mean, raw, rtol=1e-12, atol=1e-12)
    # Space filling: every 1-D margin of the whole design has one point per stratum.
    for column in x.T.numpy():
        assert sorted(np.floor(column * 500).astype(int)) == list(range(500))


def test_dataset_seeding():
    first = make_synthetic_dataset("hartmann6", num_points=200, seed=7)
    again = make_synthetic_dataset("hartmann6", num_points=200, seed=7)
    other = make_synthetic_dataset("hartmann6", num_points=200, seed=8)
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(first, field), getattr(again, field))
    assert first.y_mean == again.y_mean and first.y_std == again.y_std
    assert not torch.equal(first.train_x, other.train_x)
    assert not torch.equal(first.test_y, other.test_y)


def test_dataset_defaults_and_options():
    for name in NAMES:
        data = make_synthetic_dataset(name)
        size = SYNTHETIC_FUNCTIONS[name].paper_size
        assert data.train_x.shape[0] == size - round(0.2 * size)
        assert data.test_x.shape[0] == round(0.2 * size)
    data = make_synthetic_dataset("otlcircuit", num_points=101, test_fraction=0.3, dtype=torch.float32)
    assert (data.train_x.shape[0], data.test_x.shape[0]) == (71, 30)
    assert data.train_x.dtype == torch.float32 and data.test_y.dtype == torch.float32


def test_dataset_errors():
    with pytest.raises(ValueError, match=r"borehole.*hartmann6.*otlcircuit.*rastrigin5.*robot"):
        make_synthetic_dataset("branin")
    for bad in (0, 2, -5, 10.5, True):
        with pytest.raises(ValueError, match="num_points"):
            make_synthetic_dataset("robot", num_points=bad)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="test_fraction"):
            make_synthetic_dataset("robot", num_points=100, test_fraction=bad)
    with pytest.raises(ValueError, match="test_fraction"):
        make_synthetic_dataset("robot", num_points=10, test_fraction=0.01)  # rounds to no test point

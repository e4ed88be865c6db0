r"""The closed-form test functions of the WHVI paper's GP experiment (App. D.4, Table 5) and a seeded
train/test dataset generator over a space-filling design.

Each function takes an ``(N, D)`` array in its *natural* input domain (the physical units of the
Virtual Library of Simulation Experiments) and returns ``(N,)``. :func:`make_synthetic_dataset` draws a
Latin hypercube design on :math:`[0, 1]^D`, maps it affinely onto the domain to evaluate the function,
and returns the ``[0, 1]`` design as inputs with targets standardized by the training split.

Glossary of shape letters:

* ``N`` -- points (rows); ``N_train`` / ``N_test`` after the split.
* ``D`` -- input dimension of the function (8 borehole, 6 hartmann6, 5 rastrigin5, 8 robot,
  6 otlcircuit; the analogues 4 hartmann4, 10 wingweight).

:data:`SYNTHETIC_FUNCTIONS` are the paper's five; :data:`ANALOGUE_FUNCTIONS` stand in for two UCI sets of the
paper's Table 3 that are not shipped (power: 4 inputs, 9,568 rows; protein: 9 inputs, 45,730 rows) with a
function of about as many inputs; :data:`BENCH_FUNCTIONS` is both, what ``whvi synthetic`` writes.

References
----------
* S. Rossi, S. Marmin, M. Filippone. "Walsh-Hadamard Variational Inference for Bayesian Deep Learning",
  NeurIPS 2020, App. D.4 and Table 5 (functions and dataset sizes).
* S. Surjanovic, D. Bingham. "Virtual Library of Simulation Experiments: Test Functions and Datasets",
  https://www.sfu.ca/~ssurjano/ (formulas and input domains).
* M. D. Morris, T. J. Mitchell, D. Ylvisaker. "Bayesian design and analysis of computer experiments: use of
  derivatives in surface prediction", Technometrics 35(3), 1993 (borehole).
* J. An, A. Owen. "Quasi-regression", Journal of Complexity 17(4), 2001 (robot arm).
* E. N. Ben-Ari, D. M. Steinberg. "Modeling data from computer experiments: an empirical comparison of
  kriging with MARS and projection pursuit regression", Quality Engineering 19(4), 2007 (OTL circuit).
* J. K. Hartmann. "Some experiments in global optimization", Naval Research Logistics Quarterly 20, 1972;
  V. Picheny, T. Wagner, D. Ginsbourger. "A benchmark of kriging-based infill criteria for noisy
  optimization", Structural and Multidisciplinary Optimization 48(3), 2013 (hartmann6; hartmann4, their
  rescaled 4-D form).
* A. Forrester, A. Sóbester, A. Keane. "Engineering Design via Surrogate Modelling", Wiley 2008 (wing weight).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "ANALOGUE_FUNCTIONS",
    "BENCH_FUNCTIONS",
    "SYNTHETIC_FUNCTIONS",
    "SyntheticDataset",
    "SyntheticFunction",
    "borehole",
    "hartmann4",
    "hartmann6",
    "latin_hypercube",
    "make_synthetic_dataset",
    "otl_circuit",
    "rastrigin",
    "robot_arm",
    "wing_weight",
]


def _rows(x: np.ndarray, dim: int | None, name: str) -> np.ndarray:
    """``x`` as a float64 ``(N, D)`` array, checking ``D`` when the function fixes it."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
        expected = f"(N, {dim})" if dim is not None else "(N, D)"
        raise ValueError(f"{name}: x must have shape {expected}, got {x.shape}.")
    return x


def borehole(x: np.ndarray) -> np.ndarray:
    r"""Water flow rate through a borehole (m³/yr), columns ``rw, r, Tu, Hu, Tl, Hl, L, Kw``:

    .. math:: f = \frac{2\pi T_u (H_u - H_l)}{\ln(r/r_w)\left(1 + \frac{2 L T_u}{\ln(r/r_w) r_w^2 K_w}
              + \frac{T_u}{T_l}\right)}
    """
    rw, r, tu, hu, tl, hl, length, kw = _rows(x, 8, "borehole").T
    log_ratio = np.log(r / rw)
    return 2 * np.pi * tu * (hu - hl) / (log_ratio * (1 + 2 * length * tu / (log_ratio * rw**2 * kw) + tu / tl))


_HARTMANN_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])
_HARTMANN_A = np.array(
    [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ]
)
_HARTMANN_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)


def hartmann6(x: np.ndarray) -> np.ndarray:
    r"""The 6-D Hartmann function on :math:`[0, 1]^6`,
    :math:`f = -\sum_{i=1}^4 \alpha_i \exp(-\sum_{j=1}^6 A_{ij} (x_j - P_{ij})^2)`;
    global minimum :math:`-3.32237` at :math:`x^* = (0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573)`.
    """
    x = _rows(x, 6, "hartmann6")
    inner = (_HARTMANN_A * (x[:, None, :] - _HARTMANN_P) ** 2).sum(-1)  # (N, 4)
    return -(np.exp(-inner) @ _HARTMANN_ALPHA)


def hartmann4(x: np.ndarray) -> np.ndarray:
    r"""The 4-D Hartmann function of Picheny et al. on :math:`[0, 1]^4`, rescaled to about zero mean and unit
    variance: the 6-D one's first four columns,
    :math:`f = (1.1 - \sum_{i=1}^4 \alpha_i \exp(-\sum_{j=1}^4 A_{ij} (x_j - P_{ij})^2)) / 0.839`;
    global minimum about :math:`-3.1355` near :math:`x^* = (0.1873, 0.1906, 0.5566, 0.2647)`.
    """
    x = _rows(x, 4, "hartmann4")
    inner = (_HARTMANN_A[:, :4] * (x[:, None, :] - _HARTMANN_P[:, :4]) ** 2).sum(-1)  # (N, 4)
    return (1.1 - np.exp(-inner) @ _HARTMANN_ALPHA) / 0.839


def wing_weight(x: np.ndarray) -> np.ndarray:
    r"""Weight (lb) of a light aircraft's wing, columns ``Sw, Wfw, A, Lambda (degrees), q, lambda, tc, Nz, Wdg,
    Wp``:

    .. math:: f = 0.036 S_w^{0.758} W_{fw}^{0.0035} \left(\frac{A}{\cos^2 \Lambda}\right)^{0.6} q^{0.006}
              \lambda^{0.04} \left(\frac{100\, t_c}{\cos \Lambda}\right)^{-0.3} (N_z W_{dg})^{0.49} + S_w W_p
    """
    sw, wfw, aspect, sweep, q, taper, tc, nz, wdg, wp = _rows(x, 10, "wing_weight").T
    cos_sweep = np.cos(np.deg2rad(sweep))
    wing = 0.036 * sw**0.758 * wfw**0.0035 * (aspect / cos_sweep**2) ** 0.6 * q**0.006 * taper**0.04
    return wing * (100 * tc / cos_sweep) ** -0.3 * (nz * wdg) ** 0.49 + sw * wp


def rastrigin(x: np.ndarray) -> np.ndarray:
    r"""The Rastrigin function in any dimension ``D`` on :math:`[-5.12, 5.12]^D`,
    :math:`f = 10 D + \sum_i (x_i^2 - 10 \cos(2\pi x_i))`; global minimum 0 at the origin.
    """
    x = _rows(x, None, "rastrigin")
    return 10.0 * x.shape[1] + (x**2 - 10 * np.cos(2 * np.pi * x)).sum(-1)


def robot_arm(x: np.ndarray) -> np.ndarray:
    r"""Distance of a 4-segment planar robot arm's end from the origin, columns
    ``theta1..theta4, L1..L4``: :math:`f = \sqrt{u^2 + v^2}` with
    :math:`u = \sum_i L_i \cos(\sum_{j \le i} \theta_j)` and :math:`v` the same with :math:`\sin`.
    """
    x = _rows(x, 8, "robot_arm")
    angles = np.cumsum(x[:, :4], axis=1)
    lengths = x[:, 4:]
    u = (lengths * np.cos(angles)).sum(-1)
    v = (lengths * np.sin(angles)).sum(-1)
    return np.sqrt(u**2 + v**2)


def otl_circuit(x: np.ndarray) -> np.ndarray:
    r"""Midpoint voltage (V) of an output transformerless push-pull circuit, columns
    ``Rb1, Rb2, Rf, Rc1, Rc2, beta``: with :math:`V_{b1} = 12 R_{b2} / (R_{b1} + R_{b2})` and
    :math:`g = \beta (R_{c2} + 9)`,

    .. math:: V_m = \frac{(V_{b1} + 0.74) g}{g + R_f} + \frac{11.35 R_f}{g + R_f}
              + \frac{0.74 R_f g}{(g + R_f) R_{c1}}
    """
    rb1, rb2, rf, rc1, rc2, beta = _rows(x, 6, "otl_circuit").T
    vb1 = 12 * rb2 / (rb1 + rb2)
    gain = beta * (rc2 + 9)
    denominator = gain + rf
    return (vb1 + 0.74) * gain / denominator + 11.35 * rf / denominator + 0.74 * rf * gain / (denominator * rc1)


@dataclass(frozen=True)
class SyntheticFunction:
    """A test function with its box domain ``[lower, upper]`` and the WHVI paper's dataset size (Table 5; for an
    analogue, the rows of the UCI set it stands for, Table 3)."""

    name: str
    function: Callable[[np.ndarray], np.ndarray]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    paper_size: int

    @property
    def dim(self) -> int:
        """The input dimension ``D``."""
        return len(self.lower)

    def from_unit(self, u: np.ndarray) -> np.ndarray:
        """Map ``(N, D)`` points of :math:`[0, 1]^D` affinely onto the natural domain."""
        lower, upper = np.asarray(self.lower), np.asarray(self.upper)
        return lower + np.asarray(u, dtype=np.float64) * (upper - lower)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Evaluate at ``(N, D)`` points of the natural domain, giving ``(N,)``."""
        return self.function(x)


SYNTHETIC_FUNCTIONS: dict[str, SyntheticFunction] = {
    "borehole": SyntheticFunction(
        "borehole",
        borehole,
        lower=(0.05, 100.0, 63070.0, 990.0, 63.1, 700.0, 1120.0, 9855.0),
        upper=(0.15, 50000.0, 115600.0, 1110.0, 116.0, 820.0, 1680.0, 12045.0),
        paper_size=200_000,
    ),
    "hartmann6": SyntheticFunction("hartmann6", hartmann6, lower=(0.0,) * 6, upper=(1.0,) * 6, paper_size=30_000),
    "rastrigin5": SyntheticFunction("rastrigin5", rastrigin, lower=(-5.12,) * 5, upper=(5.12,) * 5, paper_size=10_000),
    "robot": SyntheticFunction(
        "robot", robot_arm, lower=(0.0,) * 8, upper=(2 * math.pi,) * 4 + (1.0,) * 4, paper_size=150_000
    ),
    "otlcircuit": SyntheticFunction(
        "otlcircuit",
        otl_circuit,
        lower=(50.0, 25.0, 0.5, 1.2, 0.25, 50.0),
        upper=(150.0, 70.0, 3.0, 2.5, 1.2, 300.0),
        paper_size=20_000,
    ),
}


#: Analogues of UCI sets that are not shipped, by input dimension and size, with a known floor once noise is added
#: (:mod:`pyro_whvi.experiments.noisy_sets`): ``hartmann4`` for power (4 inputs, 9,568 rows), ``wingweight`` for
#: protein (9 inputs, 45,730 rows; the nearest standard function has 10).
ANALOGUE_FUNCTIONS: dict[str, SyntheticFunction] = {
    "hartmann4": SyntheticFunction("hartmann4", hartmann4, lower=(0.0,) * 4, upper=(1.0,) * 4, paper_size=9_568),
    "wingweight": SyntheticFunction(
        "wingweight",
        wing_weight,
        lower=(150.0, 220.0, 6.0, -10.0, 16.0, 0.5, 0.08, 2.5, 1700.0, 0.025),
        upper=(200.0, 300.0, 10.0, 10.0, 45.0, 1.0, 0.18, 6.0, 2500.0, 0.08),
        paper_size=45_730,
    ),
}
#: Every function ``whvi synthetic`` writes: the paper's five, then the analogues.
BENCH_FUNCTIONS: dict[str, SyntheticFunction] = {**SYNTHETIC_FUNCTIONS, **ANALOGUE_FUNCTIONS}


@dataclass(frozen=True)
class SyntheticDataset:
    """A train/test split of a synthetic regression problem.

    Inputs are the design on :math:`[0, 1]^D`; targets are ``(y_raw - y_mean) / y_std`` with the training
    split's mean and (population, ``ddof=0``) standard deviation, so ``y * y_std + y_mean`` recovers the
    original units.
    """

    train_x: Tensor  #: (N_train, D)
    train_y: Tensor  #: (N_train,)
    test_x: Tensor  #: (N_test, D)
    test_y: Tensor  #: (N_test,)
    y_mean: float
    y_std: float
    name: str


def latin_hypercube(num_points: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """A random Latin hypercube on :math:`[0, 1]^D`, ``(N, D)``: in every column each of the ``N`` strata
    ``[k/N, (k+1)/N)`` holds exactly one point, placed uniformly inside it (what
    ``scipy.stats.qmc.LatinHypercube(d, optimization=None)`` draws, without needing SciPy)."""
    strata = np.argsort(rng.random((dim, num_points)), axis=1).T  # (N, D): a random permutation per column
    return (strata + rng.random((num_points, dim))) / num_points


def make_synthetic_dataset(
    name: str,
    num_points: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    dtype: torch.dtype = torch.float64,
) -> SyntheticDataset:
    """``num_points`` (default: the paper's size) Latin hypercube points for the function ``name`` (a key
    of :data:`BENCH_FUNCTIONS`), split uniformly at random into ``round(test_fraction * N)`` test
    points and the rest for training. Everything is determined by ``seed``."""
    if name not in BENCH_FUNCTIONS:
        valid = sorted(BENCH_FUNCTIONS)
        raise ValueError(f"make_synthetic_dataset: unknown name {name!r}; valid names are {valid}.")
    spec = BENCH_FUNCTIONS[name]
    if num_points is None:
        num_points = spec.paper_size
    if isinstance(num_points, bool) or not isinstance(num_points, (int, np.integer)) or num_points < 3:
        raise ValueError(f"make_synthetic_dataset: num_points must be an integer >= 3, got {num_points!r}.")
    if not 0 < test_fraction < 1:
        raise ValueError(f"make_synthetic_dataset: test_fraction must be in (0, 1), got {test_fraction!r}.")
    num_points = int(num_points)
    num_test = round(test_fraction * num_points)
    if not 1 <= num_test <= num_points - 2:
        raise ValueError(
            f"make_synthetic_dataset: test_fraction={test_fraction!r} with num_points={num_points} leaves "
            f"{num_test} test and {num_points - num_test} training points; need >= 1 and >= 2."
        )

    rng = np.random.default_rng(seed)
    u = latin_hypercube(num_points, spec.dim, rng)  # (N, D)
    y = spec(spec.from_unit(u))  # (N,)
    order = rng.permutation(num_points)
    test, train = order[:num_test], order[num_test:]
    y_mean = float(y[train].mean())
    y_std = float(y[train].std()) or 1.0
    y = (y - y_mean) / y_std

    def tensor(a: np.ndarray) -> Tensor:
        return torch.as_tensor(a, dtype=dtype)

    return SyntheticDataset(
        train_x=tensor(u[train]),
        train_y=tensor(y[train]),
        test_x=tensor(u[test]),
        test_y=tensor(y[test]),
        y_mean=y_mean,
        y_std=y_std,
        name=name,
    )

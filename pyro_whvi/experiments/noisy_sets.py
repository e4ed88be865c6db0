r"""Regression sets with a known noise level, written in the UCI split format: a bench with a known floor.

:func:`write_noisy_set` evaluates one of the closed-form functions of :mod:`pyro_whvi.data.synthetic`
on a Latin hypercube of its natural domain and adds Gaussian noise of a known standard deviation
:math:`\sigma` (``noise`` times the function's standard deviation over the design), then writes the
folder ``whvi uci --data-dir`` reads (``data.txt``, ``index_features.txt``, ``index_target.txt``,
``index_{train,test}_<k>.txt``, random 90/10 splits) and :data:`NOISE_FILE` with :math:`\sigma`. With the
``"ramp"`` profile the noise depends on the input, :math:`\sigma(x) = \sigma (0.25 + 1.5 u_1)` along the first
input's unit coordinate :math:`u_1` (from a quarter to 1.75 times :math:`\sigma`, :math:`\sigma` on average), and
:data:`NOISE_FILE` holds one :math:`\sigma(x)` per row of ``data.txt``.

No predictor can beat the noise on average: the best test RMSE is :math:`\sigma` and the best test MNLL
(the true function with the true noise) is :math:`\tfrac12 \log(2\pi\sigma^2) + \tfrac12`
(:func:`noise_floor`; per row, their root mean square and mean over the test rows); ``whvi uci`` reports each
method's distance to both, and its estimated noise scale against :math:`\sigma` (its root mean square).

References:
    WHVI paper (Rossi et al., NeurIPS 2020), App. D.4 and Table 5 (the functions), §3.2 (UCI protocol).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..data.synthetic import BENCH_FUNCTIONS, latin_hypercube
from .reporting import write_atomic

__all__ = [
    "MAX_NOISE",
    "MIN_NOISE",
    "MIN_ROWS",
    "NOISE_FILE",
    "NOISE_PROFILES",
    "noise_floor",
    "read_noise_std",
    "split_noise_std",
    "write_noisy_set",
]

NOISE_FILE = "noise_std.txt"
#: The fewest rows: each split holds a tenth out for testing, at least one row, and trains on the rest.
MIN_ROWS = 10
#: The range of ``noise`` (sigma / std(f)): outside it the function, or the noise, is below float32's resolution
#: (about 1e-7) of the standardized targets ``whvi uci`` trains on; at the extremes (1e300, 1e-300) the targets,
#: or the floor's log(sigma^2), are no longer finite.
MIN_NOISE, MAX_NOISE = 1e-6, 1e6
#: How the noise's standard deviation varies: ``"constant"``, or ``"ramp"`` along the first input (module doc).
NOISE_PROFILES = ("constant", "ramp")


def write_noisy_set(
    name: str,
    folder: str | Path,
    *,
    num_points: int = 20_000,
    noise: float = 0.2,
    splits: int = 5,
    test_fraction: float = 0.1,
    seed: int = 0,
    profile: str = "constant",
) -> float:
    r"""Write function ``name`` plus Gaussian noise as a UCI-format folder; return the noise's :math:`\sigma`.

    :param name: a key of :data:`~pyro_whvi.data.synthetic.BENCH_FUNCTIONS`.
    :param num_points: rows of ``data.txt``.
    :param noise: :math:`\sigma` as a fraction of the standard deviation of the function over the design.
        The default, 0.2, is twice the noise scale the models start from (0.1 of the standardized
        targets), so that a method that does not learn its noise scale shows it, and leaves a floor that a
        network fitting ``f`` to a fraction of :math:`\sigma` can reach with 10k-50k rows.
    :param splits: random train/test splits (``index_{train,test}_<k>.txt``); those of an earlier, larger
        ``splits`` in ``folder`` are removed (they index the earlier data).
    :param test_fraction: test rows of each split.
    :param seed: determines the design, the noise and the splits.
    :param profile: one of :data:`NOISE_PROFILES`; ``"ramp"`` writes one :math:`\sigma(x)` per row, the mean of
        which is :math:`\sigma` (the module doc).
    """
    if name not in BENCH_FUNCTIONS:
        raise ValueError(f"write_noisy_set: unknown function {name!r}; choose from {', '.join(BENCH_FUNCTIONS)}")
    num_test = round(test_fraction * num_points)
    if num_points < MIN_ROWS:
        raise ValueError(
            f"write_noisy_set: num_points (--rows) of at least {MIN_ROWS} expected (each split holds a tenth out "
            f"for testing), got {num_points}"
        )
    if not MIN_NOISE <= noise <= MAX_NOISE:
        raise ValueError(
            f"write_noisy_set: noise (--noise) from {MIN_NOISE:g} to {MAX_NOISE:g} expected (sigma / std(f): beyond, "
            f"the function or the noise is below float32's resolution of the standardized targets), got {noise!r}"
        )
    if profile not in NOISE_PROFILES:
        raise ValueError(f"write_noisy_set: profile (--noise-profile) must be one of {NOISE_PROFILES}, got {profile!r}")
    if not 1 <= num_test < num_points - 1 or splits < 1:
        raise ValueError(
            "write_noisy_set: splits >= 1 and a test_fraction leaving test and training rows expected, got "
            f"{splits}, {test_fraction}"
        )
    spec = BENCH_FUNCTIONS[name]
    rng = np.random.default_rng(seed)
    unit = latin_hypercube(num_points, spec.dim, rng)
    x = spec.from_unit(unit)  # (N, D), natural units
    f = spec(x)
    sigma = float(noise * f.std())
    row_sigma = sigma * (0.25 + 1.5 * unit[:, 0]) if profile == "ramp" else np.full(num_points, sigma)
    y = f + row_sigma * rng.standard_normal(num_points)
    folder = Path(folder)
    rows = "\n".join(" ".join(f"{v:.17g}" for v in row) for row in np.column_stack([x, y]))
    write_atomic(folder / "data.txt", rows + "\n")
    write_atomic(folder / "index_features.txt", "\n".join(map(str, range(spec.dim))) + "\n")
    write_atomic(folder / "index_target.txt", f"{spec.dim}\n")
    for split in range(splits):
        order = rng.permutation(num_points)
        for part, index in (("test", order[:num_test]), ("train", order[num_test:])):
            write_atomic(folder / f"index_{part}_{split}.txt", "\n".join(map(str, np.sort(index))) + "\n")
    for stale in _index_files(folder):  # an earlier run's extra splits index its data, not this
        if int(stale.stem.rsplit("_", 1)[1]) >= splits:
            stale.unlink()
    noise_rows = [sigma] if profile == "constant" else row_sigma
    write_atomic(folder / NOISE_FILE, "".join(f"{value:.17g}\n" for value in noise_rows))
    settings = {"function": name, "num_points": num_points, "noise_fraction": noise, "sigma": sigma, "seed": seed}
    settings["noise_profile"] = profile
    write_atomic(folder / "README.json", json.dumps(settings, indent=2) + "\n")
    return sigma


def _index_files(folder: Path) -> list[Path]:
    """The split index files that :func:`write_noisy_set` writes: ``index_{train,test}_<k>.txt``."""
    return [
        path
        for part in ("train", "test")
        for path in folder.glob(f"index_{part}_*.txt")
        if path.stem.rsplit("_", 1)[1].isdecimal()
    ]


def _noise_values(folder: str | Path) -> np.ndarray | None:
    """The values of ``folder``'s :data:`NOISE_FILE`: one, or one per row of ``data.txt``; ``None`` without one."""
    path = Path(folder) / NOISE_FILE
    if not path.is_file():
        return None
    try:
        values = np.array([float(line) for line in path.read_text().split()])
    except ValueError:
        values = np.array([])
    if not len(values):
        raise ValueError(f"{path}: one positive number (the noise standard deviation) expected, or one per row")
    if not (values > 0).all() or not np.isfinite(values).all():
        bad = values[~((values > 0) & np.isfinite(values))][0]
        raise ValueError(f"{path}: the noise standard deviation must be positive and finite, got {bad}")
    if len(values) > 1:
        data = Path(folder) / "data.txt"
        rows = sum(1 for line in data.open() if line.strip()) if data.is_file() else len(values)
        if rows != len(values):
            raise ValueError(
                f"{path}: {len(values)} values, but data.txt has {rows} rows; give one noise standard deviation, or "
                "one per row of data.txt"
            )
    return values


def read_noise_std(folder: str | Path) -> float | None:
    r"""The :math:`\sigma` in ``folder``'s :data:`NOISE_FILE` (one per row: their root mean square, the best one
    noise level's), or ``None`` if it has none; a ``ValueError`` naming the file if it is damaged."""
    values = _noise_values(folder)
    if values is None:
        return None
    return float(values[0]) if len(values) == 1 else float(np.sqrt(np.mean(values**2)))


def split_noise_std(folder: str | Path, splits: Iterable[int]) -> dict[int, float | np.ndarray]:
    r"""The noise's standard deviation on each split's test rows, by split: the one :math:`\sigma`, or one per test
    row (``index_test_<split>.txt``'s order) for a per-row :data:`NOISE_FILE`; empty without one. The file is read
    and checked once for all the splits."""
    values = _noise_values(folder)
    if values is None:
        return {}
    if len(values) == 1:
        return dict.fromkeys(splits, float(values[0]))
    index = {split: Path(folder) / f"index_test_{split}.txt" for split in splits}
    return {split: values[np.loadtxt(path, dtype=np.int64, ndmin=1)] for split, path in index.items()}


def noise_floor(sigma: float | np.ndarray) -> dict[str, float]:
    r"""The best expected test RMSE, :math:`\sigma`, and MNLL, :math:`\tfrac12\log(2\pi\sigma^2) + \tfrac12`; for
    one :math:`\sigma` per test row, the root mean square of them and the mean of the MNLL's terms."""
    if isinstance(sigma, np.ndarray):
        return {
            "rmse_floor": float(np.sqrt(np.mean(sigma**2))),
            "mnll_floor": float(np.mean(0.5 * np.log(2 * math.pi * sigma**2)) + 0.5),
        }
    return {"rmse_floor": sigma, "mnll_floor": 0.5 * math.log(2 * math.pi * sigma**2) + 0.5}

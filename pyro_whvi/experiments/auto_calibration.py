"""The rule by which ``whvi uci --calibrate-noise auto``, the command's default, calibrates a method's noise on
held-out rows (:mod:`~pyro_whvi.experiments.noise_calibration`): by the method and the split's training rows, as
``--protocol auto`` and ``--likelihood auto`` choose (:mod:`~pyro_whvi.experiments.uci_protocols`).
:class:`~.uci_config.UCIConfig` holds what it resolves to (``calibrate_noise``, ``method_calibrations``)."""

from __future__ import annotations

from typing import Any

from .uci_protocols import AUTO_PROTOCOL, AUTO_WIDE_FROM_ROWS, BY_RESIDUALS, _from_threshold, exceptions_note

__all__ = [
    "AUTO_CALIBRATION",
    "CALIBRATED_METHODS",
    "CALIBRATION_CHOICES",
    "HEAD_CALIBRATED_METHODS",
    "SPREAD_SHARE_THRESHOLD",
    "auto_calibration",
    "calibration_fields",
    "check_calibrations",
    "resolve_calibration",
]

#: ``whvi uci --calibrate-noise``: ``on`` for every method of the run, ``off``, or :data:`AUTO_CALIBRATION`.
CALIBRATION_CHOICES = ("auto", "on", "off")
#: :func:`auto_calibration` decides per method, by the training rows.
AUTO_CALIBRATION = "auto"
#: The methods :func:`auto_calibration` calibrates below :data:`AUTO_WIDE_FROM_ROWS` training rows, those measured
#: with the calibration on every split of the four small UCI sets and on synthetic sets of 2,000 rows or fewer with a
#: known floor: WHVI (``benchmarks/results/noise_recalibration/``) and, since 2026-12-06, MC dropout at the rate it
#: chooses there (``benchmarks/results/mcd_tuned/``, "MC dropout with its noise calibrated"). The other guides are
#: not measured with it.
CALIBRATED_METHODS = ("whvi", "mcd")
#: Those of :data:`CALIBRATED_METHODS` calibrated from :data:`AUTO_WIDE_FROM_ROWS` where a split chooses the
#: mean-variance head (the likelihood :data:`~.uci_protocols.BY_RESIDUALS`, WHVI's there).
HEAD_CALIBRATED_METHODS = ("whvi",)
#: The spread share (:func:`~.likelihood_choice.spread_share`: q's variance of f on the training rows over the noise
#: variance) from which a split that keeps one noise scale under :data:`~.uci_protocols.BY_RESIDUALS` has that noise
#: calibrated too (``--calibrate-noise on``, and ``auto`` for :data:`HEAD_CALIBRATED_METHODS`): where the most it can
#: gain reaches 0.01 nats. At a share :math:`s` the predictive's variance is :math:`k = (1 + s) / (1 - s)` times the
#: training residuals' mean square, which loses :math:`\tfrac12(\log k + 1/k - 1)` a row (0.0094 at 0.1) where the
#: test rows' error is theirs, and less where it is larger. Measured (``benchmarks/results/large_calibration/``, "One
#: noise scale by its spread share"), the change was 4-88% of that bound, under 0.002 at the bench's shares of
#: 0.06-0.07 (18,000 rows, borehole and OTL circuit) and 0.003-0.068 on every split at 0.184-0.42 (a power-like set,
#: near-noiseless naval-like sets, a few thousand rows); the share does not tell 0.16-0.19, where it moved nothing
#: (the bench's hartmann6 and robot arm, −0.0005 to +0.005), from 0.184-0.198, where it gained 0.003-0.030 (the
#: power-like set), so those pay the held-out fit for nothing.
SPREAD_SHARE_THRESHOLD = 0.1


def auto_calibration(
    protocol: str, train_rows: int, base: str = "whvi", iblm: bool = False, nproc: int = 1, likelihood: str = "gaussian"
) -> bool:
    """Whether ``--calibrate-noise auto`` calibrates the noise of the method ``base`` (``+iblm`` when ``iblm``) on
    ``train_rows`` training rows under ``protocol`` with ``likelihood``: under ``--protocol auto``, for the methods of
    :data:`CALIBRATED_METHODS` without I-BLM, in one process (``nproc`` 1: the held-out fit is not data-parallel),
    below :data:`AUTO_WIDE_FROM_ROWS` training rows (where it trains Table 3's network with one noise scale), and from
    there for :data:`HEAD_CALIBRATED_METHODS` under the likelihood :data:`~.uci_protocols.BY_RESIDUALS`
    (``--likelihood auto``'s there), which calibrates where a split chooses the mean-variance head or keeps one noise
    scale with a spread share of :data:`SPREAD_SHARE_THRESHOLD` or more. A fixed ``protocol`` (``--protocol
    table3``) keeps the paper's predictive.

    Measured with WHVI (``benchmarks/results/noise_recalibration/``): on the four small UCI sets (277-927 training
    rows) the test MNLL falls on 14 of 20 splits (yacht 1.228 to 0.667, energy 0.826 to 0.780, Boston 2.435 to 2.409)
    and rises on 6, by at most 0.094 (energy's split 4); concrete's mean rises by 0.005. On synthetic sets of 450-1,800
    training rows with a known floor it moves the MNLL by -0.095 to +0.022 (twelve splits). The factor chosen moves
    towards 1 with the rows (yacht 0.09-0.17, concrete 0.82-1.01, 1,800 rows 1.04-1.12), where the ELBO's noise,
    which absorbs q's spread of f on the training rows, stops being far too wide. From :data:`AUTO_WIDE_FROM_ROWS`
    (``benchmarks/results/large_calibration/``) one noise scale calibrated moved nothing at twice the time on the
    bench (18,000 training rows, splits 0 and 1: the factors 0.91-0.99, the spread shares 0.06-0.19) and gained
    0.003-0.068 nats where the share was 0.184-0.42 (a power-like set at 8,611 rows, near-noiseless sets, and
    4,050-7,373 training rows with the bench's noise), hence :data:`SPREAD_SHARE_THRESHOLD`; the head's
    noise, which counts f's spread twice under the wider networks, came down where it was too wide (sets whose noise
    grows along an input): the factors 0.78 and 0.85 at 8,611 training rows (power-like, splits 0 and 1: the test
    MNLL 0.013 lower and unchanged) and 0.99 at 41,157 (protein-like, unchanged), at 1.4 times those splits' time.

    Measured with MC dropout (``benchmarks/results/mcd_tuned/``), at the rate ``--dropout auto`` chooses on the same
    held-out rows, whose fit the calibration then reuses (no training added): over the four small UCI sets' 50
    splits (Boston and concrete 0-19, yacht and energy 0-4) the test MNLL falls by 0.027 ± 0.015 on the mean and on 27
    splits; concrete's mean by 0.032 (lower on 14 of 20), Boston's by 0.035 (9 of 20: most off the splits where MC
    dropout was overconfident), energy's by 0.007, and yacht's rises by 0.005. The factor is above 1 where its learned
    noise is too narrow (concrete 1.02-1.32). At 2,000 synthetic rows with a known floor the robot arm's falls by 0.195
    and 0.003 (factor 1.57 and 1.02), hartmann6's rises by 0.010 on both splits."""
    small = not _from_threshold(train_rows, "auto_calibration")  # and the rows checked, as auto_protocol does
    sized = small or (likelihood == BY_RESIDUALS and base in HEAD_CALIBRATED_METHODS)
    return protocol == AUTO_PROTOCOL and sized and base in CALIBRATED_METHODS and not iblm and nproc == 1


def resolve_calibration(
    protocol: str,
    train_rows: int,
    specs: dict[str, tuple[str, bool]],
    nproc: int = 1,
    likelihood: str = "gaussian",
    method_likelihoods: dict[str, str] | None = None,
) -> tuple[bool, dict[str, bool], str]:
    """``--calibrate-noise auto`` for a run of the methods ``specs`` (``{method: (base, iblm)}``) with the run's
    ``likelihood`` and the methods' own (``method_likelihoods``, as :class:`~.uci_config.UCIConfig` holds them): the
    run's setting (WHVI's, :func:`auto_calibration`), the methods that differ from it, and the header's note naming
    the calibrated methods and why the others are not."""
    owns = method_likelihoods or {}
    run = auto_calibration(protocol, train_rows, nproc=nproc, likelihood=likelihood)
    own = {
        method: auto_calibration(protocol, train_rows, base, iblm, nproc, owns.get(method, likelihood))
        for method, (base, iblm) in specs.items()
    }
    calibrated = [method for method, each in own.items() if each]
    differs = {method: each for method, each in own.items() if each != run}
    if not calibrated:
        return run, differs, ""
    where = f"below {AUTO_WIDE_FROM_ROWS:,} rows"
    if _from_threshold(train_rows, "resolve_calibration"):
        where = "where a split chooses the mean-variance head, or keeps one noise scale with a spread share of "
        where += f"{SPREAD_SHARE_THRESHOLD} or more"
    note = f"; noise calibrated on held-out rows for {', '.join(calibrated)} ({where})"
    reasons = {method: "is not measured with {}" for method, each in own.items() if not each}
    note += exceptions_note("not", "the calibration", reasons)
    return run, differs, note


def check_calibrations(
    calibrate_noise: bool, method_calibrations: tuple[tuple[str, bool], ...], methods: tuple[str, ...]
) -> None:
    """Raise a :class:`ValueError` naming the field unless ``calibrate_noise`` and each of ``method_calibrations``
    (pairs ``(method, bool)``, each method one of ``methods``) is a bool, as ``"auto"`` resolves
    (:func:`resolve_calibration`)."""
    for owner, each in (("", calibrate_noise), *method_calibrations):
        if not isinstance(each, bool):  # "auto" is resolved by UCIConfig.from_protocol, by the rows
            what = f"method_calibrations[{owner!r}]" if owner else "calibrate_noise"
            raise ValueError(f"UCIConfig: {what} must be True or False, got {each!r} (from_protocol takes 'auto')")
        if owner and owner not in methods:
            raise ValueError(f"UCIConfig: method_calibrations names {owner!r}, not one of methods {methods}.")


def calibration_fields(
    calibration: str,
    protocol: str,
    train_rows: int | None,
    specs: dict[str, tuple[str, bool]],
    nproc: int = 1,
    likelihood: str = "gaussian",
    method_likelihoods: dict[str, str] | None = None,
) -> tuple[dict[str, Any], str]:
    """The :class:`~.uci_config.UCIConfig` fields that ``whvi uci --calibrate-noise calibration`` (one of
    :data:`CALIBRATION_CHOICES`) gives the methods ``specs`` (``{method: (base, iblm)}``) under ``protocol`` on
    ``train_rows`` training rows with ``likelihood`` and ``method_likelihoods`` (needed by ``"auto"``:
    :func:`resolve_calibration`), and the header's note."""
    if calibration not in CALIBRATION_CHOICES:
        raise ValueError(f"--calibrate-noise: one of {', '.join(CALIBRATION_CHOICES)} expected, got {calibration!r}")
    if calibration != AUTO_CALIBRATION:
        return {"calibrate_noise": calibration == "on"}, ""
    if train_rows is None:
        raise TypeError(f"UCIConfig.from_protocol: calibrate_noise {AUTO_CALIBRATION!r} needs train_rows")
    run, differs, note = resolve_calibration(protocol, train_rows, specs, nproc, likelihood, method_likelihoods)
    return {"calibrate_noise": run, "method_calibrations": tuple(differs.items())}, note

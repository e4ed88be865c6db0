r"""The factor rule, ``whvi uci --choose-by noise-factor`` (with ``--protocol auto``, WHVI below
:data:`~.uci_protocols.AUTO_WIDE_FROM_ROWS` training rows): Table 3's network at Adam 3e-3 (``narrow``) where its
noise factor on the held-out rows is at most 1, else the paper's Adam 1e-3 (``table3``). :class:`~.uci_config.UCIConfig`
holds what it resolves to: the two as ``protocols``, chosen by :data:`FACTOR_RULE` (``choose_by``), and ``table3``
for the run's other methods (``method_protocols``). **Not the default**: it was for part of 2026-12-07, until a check
planned before Boston's splits 5-19 ran found it +0.016 ± 0.011 nats above ``table3`` there (higher on 6 of the 8
splits where it chose ``narrow``)
(``benchmarks/results/uci_calibrated/README.md``, "The factor rule as the default").

Below a few thousand rows Adam 1e-3 leaves WHVI's ELBO unconverged at the paper's 50,500 steps, and ``narrow`` ends
at a better ELBO on 20 of 20 splits of the four small UCI sets; but on synthetic sets with low noise it can end
overconfident, with its learned noise narrower than its errors. The noise's calibration on held-out rows
(:mod:`~pyro_whvi.experiments.noise_calibration`) trains that fit anyway: its factor :math:`c` says which case a split
is. :math:`c > 1` means the held-out rows' errors are wider than the ELBO's noise, which already absorbs q's spread of
f on the training rows, so the fit is overconfident rather than counting that spread twice (``table3``'s usual case,
:math:`c < 1`), and the refit on more rows can only take it further; there the split trains ``table3`` as before.

Measured (``benchmarks/results/uci_calibrated/README.md``, "The factor rule on fresh sets"; test MNLL, paired against
``table3`` with the calibration, composed from the two protocols' stored runs): on the four small UCI sets' 35 splits
−0.043 ± 0.019 (yacht 0.667 → 0.534, energy 0.780 → 0.644, concrete's 20 splits 3.062 → 3.043, Boston 2.409 → 2.455); on
the ten synthetic splits it was read off −0.019 ± 0.013; on ten fresh synthetic splits of 500-2,500 rows, with a bar
committed before they ran, −0.016 ± 0.012 and never higher (``narrow`` alone −0.055, the choice on the held-out MNLL
−0.056); on five more hartmann6 splits at σ 0.05, where ``narrow`` fails (+0.16 to +1.10 nats), it kept ``table3`` on
four and missed one (+0.099 at 500 rows). The cost: ``narrow``'s held-out fit is the calibration's, so where
:math:`c \le 1` a split trains two fits as before, and three where :math:`c > 1`: 1.10 times the fits of ``table3``
with the calibration on the first five splits of yacht, energy and Boston, 1.24 over the four sets' 35 splits,
1.33-1.41 times its seconds on the synthetic checks. Made with the command (the default then)
(``benchmarks/results/uci_calibrated/README.md``, "The factor rule as the default"), each split's row is its chosen
protocol's own calibrated run: yacht 0.534, energy 0.636 and Boston 2.454 over their first five splits.
"""

from __future__ import annotations

from typing import Any

from .uci_protocols import _from_threshold, protocol_settings

__all__ = [
    "CHOICE_RULES",
    "FACTOR_RULE",
    "FACTOR_RULE_METHODS",
    "FACTOR_RULE_PROTOCOLS",
    "SCORE_RULE",
    "check_choice_rule",
    "factor_rule_fields",
]

#: How a split chooses among its candidates on held-out rows (``UCIConfig.choose_by``, ``whvi uci --choose-by``):
#: the lowest validation score, every candidate trained.
SCORE_RULE = "score"
#: ... or the first candidate, in the order given, whose calibrated noise factor on the held-out rows is at most 1,
#: the last where none is; the later ones are not trained. It needs the noise calibrated (one noise scale).
FACTOR_RULE = "noise-factor"
CHOICE_RULES = (SCORE_RULE, FACTOR_RULE)
#: The methods ``--protocol auto`` gives :data:`FACTOR_RULE_PROTOCOLS` below the threshold, where their noise is
#: calibrated with one noise scale and one KL weight: WHVI, the one measured.
FACTOR_RULE_METHODS = ("whvi",)
#: The candidates in the order :data:`FACTOR_RULE` tries them.
FACTOR_RULE_PROTOCOLS = ("narrow", "table3")


def _calibrated(method: str, fields: dict[str, Any]) -> bool:
    return bool(dict(fields.get("method_calibrations", ())).get(method, fields.get("calibrate_noise", False)))


def _likelihood(method: str, fields: dict[str, Any]) -> str:
    return dict(fields.get("method_likelihoods", ())).get(method, fields.get("likelihood", "gaussian"))


def factor_rule_fields(
    train_rows: int,
    dataset: str,
    overrides: dict[str, int | float | None],
    bases: dict[str, tuple[str, bool]],
    fields: dict[str, Any],
) -> tuple[dict[str, Any], str]:
    """The fields :data:`FACTOR_RULE` adds to ``--protocol auto``'s on ``train_rows`` training rows for the methods
    ``bases`` (``{method: (base, iblm)}``), ``fields`` holding the run's resolved likelihoods, calibrations and KL
    weights: ``protocols`` (:data:`FACTOR_RULE_PROTOCOLS` with ``overrides``), ``choose_by`` and ``table3`` for the
    methods that do not choose (``method_protocols``), and the header's note; ``({}, "")`` where no method chooses
    (from the threshold; none of :data:`FACTOR_RULE_METHODS` calibrated with one noise scale; several KL weights;
    ``overrides`` that make the two candidates one)."""
    candidates = [{"name": name, **protocol_settings(name, dataset, **overrides)} for name in FACTOR_RULE_PROTOCOLS]
    weights = fields.get("kl_weight", 1.0)
    several = isinstance(weights, (tuple, list)) and len(set(weights)) > 1
    same = len({tuple(sorted((k, v) for k, v in c.items() if k != "name")) for c in candidates}) == 1
    if _from_threshold(train_rows, "factor_rule_fields") or several or same:
        return {}, ""
    choosing = [
        method
        for method, (base, iblm) in bases.items()
        if base in FACTOR_RULE_METHODS
        and not iblm
        and _calibrated(method, fields)
        and _likelihood(method, fields) == "gaussian"
    ]
    if not choosing:
        return {}, ""
    table3 = candidates[-1]
    others = tuple((method, table3) for method in bases if method not in choosing)
    first, last = FACTOR_RULE_PROTOCOLS
    note = f"; {first} for {', '.join(choosing)} where its noise factor on the held-out rows is at most 1, else {last}"
    return {"protocols": tuple(candidates), "choose_by": FACTOR_RULE, "method_protocols": others}, note


def check_choice_rule(choose_by: str, protocols: int, choosers: dict[str, tuple[bool, str]]) -> None:
    """Raise a :class:`ValueError` naming the field unless ``choose_by`` is one of :data:`CHOICE_RULES` and, for
    :data:`FACTOR_RULE`, there are ``protocols`` (candidates) and each method that chooses among them (``choosers``,
    ``{method: (its noise calibrated, its likelihood)}``) has its noise calibrated with one noise scale."""
    if choose_by not in CHOICE_RULES:
        raise ValueError(f"UCIConfig: choose_by must be one of {CHOICE_RULES}, got {choose_by!r}.")
    if choose_by != FACTOR_RULE:
        return
    if protocols < 2:
        raise ValueError(
            f"UCIConfig: choose_by {FACTOR_RULE!r} chooses among protocols; give two or more (protocols), or "
            f"choose_by {SCORE_RULE!r}."
        )
    for method, (calibrated, likelihood) in choosers.items():
        if not calibrated or likelihood != "gaussian":
            raise ValueError(
                f"UCIConfig: choose_by {FACTOR_RULE!r} reads the factor of a calibrated noise scale; {method} has "
                f"{'likelihood ' + repr(likelihood) if calibrated else 'its noise uncalibrated'}: calibrate it "
                "(calibrate_noise, --calibrate-noise on) with likelihood 'gaussian', give it its own protocol "
                f"(method_protocols), or choose_by {SCORE_RULE!r}."
            )

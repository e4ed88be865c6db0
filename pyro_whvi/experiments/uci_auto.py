"""What ``whvi uci``'s protocol and its ``auto`` settings resolve to on a data set: the fields of
:class:`~.uci_config.UCIConfig` that :meth:`~.uci_config.UCIConfig.from_protocol` builds it from. The rules
themselves are :mod:`~pyro_whvi.experiments.uci_protocols` (``--protocol auto``, ``--likelihood auto``),
:mod:`~pyro_whvi.experiments.auto_calibration` (``--calibrate-noise auto``),
:mod:`~pyro_whvi.experiments.auto_dropout` (``--dropout auto``) and :mod:`~pyro_whvi.experiments.auto_narrow`
(WHVI's protocol below the threshold)."""

from __future__ import annotations

from typing import Any

from .auto_calibration import calibration_fields
from .auto_dropout import dropout_fields
from .auto_narrow import FACTOR_RULE, SCORE_RULE, factor_rule_fields
from .methods import Schedule, parse_method
from .uci_protocols import AUTO_LIKELIHOOD, AUTO_PROTOCOL, protocol_settings, resolve_auto, resolve_likelihood

__all__ = ["protocol_fields"]


def protocol_fields(
    names: tuple[str, ...],
    dataset: str,
    overrides: dict[str, int | float | None],
    train_rows: int | None,
    fields: dict[str, Any],
    *,
    fixed_noise_steps: int = Schedule.fixed_noise_steps,
    batch_size: int | None = Schedule.batch_size,
) -> dict[str, Any]:
    """The fields of the settings of ``whvi uci --protocol names`` on ``dataset`` (a folder or bundled set's name;
    see :meth:`~.uci_config.UCIConfig.from_protocol`): ``fields`` (with ``methods`` and ``nproc``) with their
    ``auto`` values resolved on ``train_rows`` training rows, the network and schedule of the first protocol with
    ``overrides`` (``layers``, ``hidden``, ``steps``, ``lr``, ``cooldown``; ``None``: the protocol's), the
    candidates' where there are several names, and the header's ``protocol`` label unless given."""
    fields = dict(fields)
    by_factor = False
    label = shown = names[0] if len(names) == 1 else ""
    bases = {spec.name: (spec.base, spec.iblm) for spec in map(parse_method, fields["methods"])}
    if AUTO_PROTOCOL in names:
        if len(names) > 1:
            raise ValueError(f"--protocol: {AUTO_PROTOCOL} picks one protocol by the rows; give it alone")
        if train_rows is None:
            raise TypeError(f"UCIConfig.from_protocol: {AUTO_PROTOCOL!r} needs train_rows")
        by_factor = fields.pop("choose_by", SCORE_RULE) == FACTOR_RULE  # --choose-by noise-factor: the opt-in rule
        run, own, shown = resolve_auto(train_rows, {method: base for method, (base, _) in bases.items()})
        names = (run,)
        fields["method_protocols"] = tuple(
            (m, {"name": p, **protocol_settings(p, dataset, **overrides)}) for m, p in own.items() if p != run
        )
    if fields.get("likelihood") == AUTO_LIKELIHOOD:
        if train_rows is None:
            raise TypeError(f"UCIConfig.from_protocol: likelihood {AUTO_LIKELIHOOD!r} needs train_rows")
        fields["likelihood"], other, note = resolve_likelihood(label, train_rows, bases)
        fields["method_likelihoods"], shown = tuple(other.items()), shown + note
    if isinstance(calibrate := fields.get("calibrate_noise"), str):  # whvi uci's --calibrate-noise
        likelihoods = fields.get("likelihood", "gaussian"), dict(fields.get("method_likelihoods", ()))
        calibration, note = calibration_fields(calibrate, label, train_rows, bases, fields["nproc"], *likelihoods)
        fields, shown = {**fields, **calibration}, shown + note
    if isinstance(fields.get("dropout"), str):  # whvi uci's --dropout auto
        base_names = tuple(base for base, _ in bases.values())
        fields.update(dropout_fields(fields["dropout"], label, train_rows, base_names, fields["nproc"]))
    if label == AUTO_PROTOCOL and by_factor:  # WHVI's protocol below the threshold by its calibrated noise's factor
        assert train_rows is not None
        rule, note = factor_rule_fields(train_rows, dataset, overrides, bases, fields)
        fields, shown = {**fields, **rule}, shown + note
    fields.setdefault("protocol", shown)
    given = list(fields.pop("protocols", ()))
    candidates = given or [{"name": each, **protocol_settings(each, dataset, **overrides)} for each in names]
    if len(candidates) > 1:
        fields["protocols"] = tuple(candidates)
    protocol = candidates[0]
    steps, lr, cooldown = protocol["steps"], protocol["lr"], protocol["cooldown"]
    schedule = Schedule(steps, fixed_noise_steps, batch_size, lr=lr, cooldown=cooldown)
    return {**fields, "schedule": schedule, "hidden": protocol["hidden"], "layers": protocol["layers"]}

"""The fingerprint of a UCI split's settings (:meth:`~pyro_whvi.experiments.uci_config.UCIConfig.fingerprint`),
which decides whether a stored split result is still valid, and the history that keeps results stored before a
setting or a version existed valid."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .auto_narrow import SCORE_RULE
from .uci_protocols import BY_RESIDUALS

__all__ = ["ENGINE_VERSION", "METHOD_VERSIONS", "settings_fingerprint"]

#: Bumped when a method's construction changes, so that its stored splits are trained again (1 when not listed).
METHOD_VERSIONS = {name: 2 for name in ("whvi", "nf-whvi", "whvi+iblm", "nf-whvi+iblm")}
#: Bumped when the training loop changes every method's numbers. 2: :mod:`pyro_whvi.train.engine` (the noise
#: scale's Adam state no longer starts from the fixed-noise phase's summed gradient); 3: torch's fused Adam (issue
#: 50: the same update, rounded differently) and NF-WHVI's fused planar op.
ENGINE_VERSION = 3
# Run-time settings that do not change a split's numbers.
_NOT_FINGERPRINTED = ("methods", "splits", "checkpoint_every", "progress", "protocol")
# Settings added after results were stored, with the value every earlier run had: at that value they stay out of
# the fingerprint, so that those results remain valid.
_LATER_SETTINGS = dict(
    standardize_targets=True,
    kl_weight=1.0,
    device="cpu",
    protocols=(),
    likelihood="gaussian",
    method_likelihoods=(),
    method_protocols=(),
    calibrate_noise=False,
    method_calibrations=(),
    choose_by=SCORE_RULE,
)
_LATER_SCHEDULE_SETTINGS = {"cooldown": 0.0}
# What ``calibrate_noise`` does, fingerprinted in its place when set. 1 (stored as ``true``): the noise scaled alone;
# 2: the predictive keeps a weight of 1 / (n + 2) on the learned noise (noise_calibration.keep_weight); under the
# likelihood "by-residuals", 4: where the split chooses the head, or keeps one noise scale whose spread share reaches
# likelihood_choice.SPREAD_SHARE_THRESHOLD (3: only where it chooses the head; 2: every split, the head's fit chosen
# on the held-out part's own residuals).
_CALIBRATION_VERSION = 2
_HEAD_CALIBRATION_VERSION = 4


def _without_later_defaults(settings: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without the entries of ``later`` that are at their old value."""
    return {k: v for k, v in settings.items() if not (k in later and v == later[k])}


def settings_fingerprint(method: str, settings: dict[str, Any], data: str, *, holding_out: bool) -> str:
    """A short hash of ``settings`` (a :class:`~pyro_whvi.experiments.uci_config.UCIConfig` as a dict, as
    ``method`` trains with it), the method's and the engine's versions, and ``data`` (a key of the split's data).
    ``val_fraction`` enters only when the split is ``holding_out`` rows, the one case that reads it."""
    settings = {k: v for k, v in settings.items() if k not in _NOT_FINGERPRINTED}
    if not holding_out:
        del settings["val_fraction"]
    # Candidates without a cool-down are fingerprinted as before protocols had one.
    settings["protocols"] = tuple(_without_later_defaults(p, _LATER_SCHEDULE_SETTINGS) for p in settings["protocols"])
    settings = _without_later_defaults(settings, _LATER_SETTINGS)
    if "calibrate_noise" in settings:
        by_residuals = settings.get("likelihood") == BY_RESIDUALS
        settings["calibrate_noise"] = _HEAD_CALIBRATION_VERSION if by_residuals else _CALIBRATION_VERSION
    settings["schedule"] = _without_later_defaults(settings["schedule"], _LATER_SCHEDULE_SETTINGS)
    version = {"version": METHOD_VERSIONS.get(method, 1), "engine": ENGINE_VERSION}
    text = json.dumps({"method": method, **settings, **version, "data": data}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

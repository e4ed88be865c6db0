"""The settings of a UCI run (:func:`~pyro_whvi.experiments.uci.run_uci`) and the fingerprint that decides
whether a stored split result is still valid."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from .methods import Schedule, parse_method
from .schedule import shard_size

__all__ = ["ENGINE_VERSION", "UCIConfig"]

# Bumped when a method's construction changes, so that its stored splits are trained again.
_VERSIONS = {name: 2 for name in ("whvi", "nf-whvi", "whvi+iblm", "nf-whvi+iblm")}
# Bumped when the training loop changes every method's numbers. 2: pyro_whvi.experiments.engine (the noise scale's
# Adam state no longer starts from the gradient summed over the fixed-noise phase).
ENGINE_VERSION = 2
_NOT_FINGERPRINTED = ("methods", "splits", "checkpoint_every", "progress")


@dataclass(frozen=True)
class UCIConfig:
    """Settings of :func:`run_uci`; all but ``methods``, ``splits``, ``checkpoint_every`` and ``progress``
    enter the fingerprint (``nproc`` does: each process draws its own noise, so the number of processes
    is part of what makes a seeded run's numbers)."""

    methods: tuple[str, ...] = ("mfg", "mcd", "whvi")
    splits: tuple[int, ...] = (0, 1, 2, 3, 4)
    schedule: Schedule = field(default_factory=Schedule)
    hidden: int = 128
    layers: int = 2
    samples: int = 64
    noise_scale: float = 0.1
    dropout: float = 0.005
    flows: int = 3
    reflections: int = 1
    seed: int = 0
    nproc: int = 1
    checkpoint_every: int = 1000
    progress: bool = True

    def __post_init__(self) -> None:
        for method in self.methods:
            parse_method(method)
        if not self.methods or not self.splits or min(self.splits) < 0:
            raise ValueError(f"UCIConfig: at least one method and non-negative splits expected, got {self}.")
        if self.hidden < 1 or self.layers < 0 or self.samples < 2 or self.noise_scale <= 0:
            raise ValueError("UCIConfig: hidden >= 1, layers >= 0, samples >= 2 and noise_scale > 0 expected.")
        if not 0.0 < self.dropout < 1.0 or self.flows < 1 or self.reflections < 0:
            raise ValueError("UCIConfig: dropout in (0, 1), flows >= 1 and reflections >= 0 expected.")
        if self.nproc < 1 or self.checkpoint_every < 0:
            raise ValueError("UCIConfig: nproc >= 1 and checkpoint_every >= 0 (0: no checkpoints) expected.")
        if self.schedule.batch_size is not None:
            shard_size(self.schedule.batch_size, self.nproc)
        if not 0 <= self.seed + max(self.splits) < 2**32:  # each split is seeded with seed + split
            raise ValueError(f"UCIConfig: seed + split must be in [0, 2**32) (numpy's seeds), got seed {self.seed}.")

    def fingerprint(self, method: str, data: str = "") -> str:
        """A short hash of everything that changes the result of ``method`` on one split: the settings
        and ``data``, a key of the split's data (:func:`data_key`)."""
        settings = {k: v for k, v in asdict(self).items() if k not in _NOT_FINGERPRINTED}
        version = {"version": _VERSIONS.get(method, 1), "engine": ENGINE_VERSION}
        text = json.dumps(
            {"method": method, **settings, **version, "data": data},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

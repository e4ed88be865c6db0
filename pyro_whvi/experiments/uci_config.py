"""The settings of a UCI run (:func:`~pyro_whvi.experiments.uci.run_uci`) and the fingerprint that decides
whether a stored split result is still valid."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..train.schedule import shard_size
from .auto_calibration import check_calibrations
from .auto_narrow import SCORE_RULE, check_choice_rule
from .methods import Schedule, parse_method
from .uci_auto import protocol_fields
from .uci_fingerprint import ENGINE_VERSION, settings_fingerprint
from .uci_protocols import (
    AUTO_DEEP_FROM_ROWS,
    AUTO_LIKELIHOOD,
    AUTO_PROTOCOL,
    AUTO_WIDE_FROM_ROWS,
    BY_RESIDUALS,
    REGRESSION_LIKELIHOODS,
    UCI_PROTOCOLS,
    auto_likelihood,
    auto_protocol,
    check_likelihoods,
    check_method_protocols,
    check_protocols,
    protocol_settings,
)

__all__ = [
    "AUTO_DEEP_FROM_ROWS",
    "AUTO_LIKELIHOOD",
    "AUTO_PROTOCOL",
    "AUTO_WIDE_FROM_ROWS",
    "BY_RESIDUALS",
    "DEVICES",
    "ENGINE_VERSION",
    "REGRESSION_LIKELIHOODS",
    "UCI_PROTOCOLS",
    "UCIConfig",
    "auto_likelihood",
    "auto_protocol",
    "protocol_settings",
]

#: Where ``whvi uci --device`` trains.
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class UCIConfig:
    """Settings of :func:`run_uci`; all but ``methods``, ``splits``, ``checkpoint_every`` and ``progress``
    enter the fingerprint (``nproc`` does: each process draws its own noise, so the number of processes
    is part of what makes a seeded run's numbers).

    ``standardize_targets``: regression targets standardized with the training statistics (the default) or
    kept in their original units, as the WHVI paper does; metrics are reported in the original units either way.

    ``kl_weight``: :math:`\\lambda` of the tempered ELBO :math:`\\mathbb{E}_q \\log p(\\mathcal{D} \\mid W) - \\lambda
    \\mathrm{KL}` (:class:`~pyro_whvi.infer.KLAnnealing`) for every method (for ``mcd``, a point estimate, it weights
    the log prior: the weight decay). 1, the default, is the ELBO, as the WHVI paper trains; below 1 the
    posterior is tempered (as the VSD paper's regression runs are, App. I.2), which measures what the KL term
    costs on a data set. Several weights (a tuple; a number is one) are candidates: each split holds out a
    ``val_fraction`` of its training rows (seeded with ``seed + split``), trains every candidate on the rest,
    keeps the weight with the best validation MNLL (NLL for classification; ties: the first) and trains on all
    its training rows with it, as the VSD paper chooses its temperature by cross-validation (§4, App. I.2), in one
    process (``nproc`` 1).

    ``protocols``: candidate networks and schedules (each ``{"name", "layers", "hidden", "steps", "lr"}``, as
    :meth:`from_protocol` makes them from ``whvi uci --protocol table3,wide``), chosen per split the same way,
    jointly with the KL weights (every pair is a candidate); ``hidden``, ``layers`` and the schedule's steps and
    learning rate are then the candidates', the rest of the schedule is shared. Empty (the default): this
    config's own network and schedule.

    ``protocol``: the name of the network and schedule, shown in the table's header (``"table3"``, ``"auto: deep
    (8,611 training rows; wide from 3,000, deep from 6,000)"``); not fingerprinted (``hidden``, ``layers`` and the
    schedule are).

    ``device``: where the model, the data and the training go (``"cpu"``, the default, or ``"cuda"``, in one
    process); predictions and metrics come back to the CPU. Fingerprinted when not ``"cpu"`` (CUDA draws other
    random numbers and sums in another order), so results stored before the setting existed stay valid.

    ``jit``: train on the compiled ELBO (:class:`~pyro_whvi.infer.JitTrace_ELBO`, Pyro's ``torch.jit.trace`` path,
    the default since engine version 3; fingerprinted): the same loss and gradients as ``Trace_ELBO`` (``False``,
    ``whvi uci --eager``), 2.0-2.4x faster per step on the ``table3`` network (issue 50's notes).

    ``likelihood`` (regression): ``"gaussian"``, one learned noise scale as in the papers, or ``"heteroscedastic"``,
    a mean-variance head (:class:`~pyro_whvi.nn.BayesianMLP`): the last layer predicts each row's noise too, under
    the method's posterior like every other weight, or ``"by-residuals"``, one noise scale and then the head where the
    training residuals show noise that varies with the inputs, per split
    (:mod:`~pyro_whvi.experiments.likelihood_choice`). ``ensemble`` has the head either way. ``whvi uci``'s default,
    ``--likelihood auto``, resolves to one of the three per method by :func:`auto_likelihood`. ``method_likelihoods``,
    ``(method, likelihood)`` pairs, gives a method another than ``likelihood`` (:meth:`likelihood_of`), and
    ``method_protocols``, ``(method, protocol)`` pairs (as in ``protocols``), another network and schedule (as
    :func:`auto_protocol` does). A method trains with, and is fingerprinted by, its own settings (:meth:`for_method`),
    so its stored splits do not depend on the others in the run.

    ``calibrate_noise``: scale each split's noise by a factor chosen on held-out rows (``val_fraction``; regression,
    ``nproc`` 1; :mod:`~pyro_whvi.experiments.noise_calibration`); ``method_calibrations``, ``(method, bool)`` pairs,
    gives a method the other setting (:meth:`calibrates`), as ``--calibrate-noise auto`` resolves
    (:func:`~pyro_whvi.experiments.auto_calibration.auto_calibration`).

    ``choose_by``: how a split chooses among the candidates, ``"score"`` (the lowest validation score) or, among
    ``protocols``, ``"noise-factor"``: the first whose calibrated noise factor on the held-out rows is at most 1, else
    the last, the later ones not trained (:mod:`~pyro_whvi.experiments.auto_narrow`; the methods that choose need
    their noise calibrated with one noise scale). ``method_protocols`` takes a method out of the choice.

    ``dropout``: MC dropout's rate (``mcd`` alone). Several rates (a tuple) are candidates for ``mcd``, chosen per
    split on held-out rows as the KL weights are and jointly with them, as Gal's updated UCI results choose theirs
    (from 0.005, 0.01, 0.05 and 0.1, what ``whvi uci``'s default, ``--dropout auto``, gives under ``--protocol auto``
    below 3,000 training rows: :func:`~pyro_whvi.experiments.auto_dropout.auto_dropout`); every other method trains,
    and is fingerprinted, with the first.
    """

    methods: tuple[str, ...] = ("mfg", "mcd", "whvi")
    splits: tuple[int, ...] = (0, 1, 2, 3, 4)
    schedule: Schedule = field(default_factory=Schedule)
    hidden: int = 128
    layers: int = 2
    samples: int = 64
    noise_scale: float = 0.1
    dropout: float | tuple[float, ...] = 0.005
    flows: int = 3
    reflections: int = 1
    seed: int = 0
    nproc: int = 1
    standardize_targets: bool = True
    kl_weight: float | tuple[float, ...] = 1.0
    val_fraction: float = 0.2
    checkpoint_every: int = 1000
    progress: bool = True
    device: str = "cpu"
    protocols: tuple[dict[str, Any], ...] = ()
    jit: bool = True
    protocol: str = ""
    likelihood: str = "gaussian"
    method_likelihoods: tuple[tuple[str, str], ...] = ()
    method_protocols: tuple[tuple[str, dict[str, Any]], ...] = ()
    calibrate_noise: bool = False
    method_calibrations: tuple[tuple[str, bool], ...] = ()
    choose_by: str = SCORE_RULE

    def __post_init__(self) -> None:
        # Each method and split once: a repeated one would be read back and counted as another split.
        object.__setattr__(self, "methods", tuple(dict.fromkeys(self.methods)))
        object.__setattr__(self, "splits", tuple(dict.fromkeys(self.splits)))
        for method in self.methods:
            parse_method(method)
        if not self.methods or not self.splits or min(self.splits) < 0:
            raise ValueError(f"UCIConfig: at least one method and non-negative splits expected, got {self}.")
        if self.hidden < 1 or self.layers < 0 or self.samples < 2 or self.noise_scale <= 0:
            raise ValueError("UCIConfig: hidden >= 1, layers >= 0, samples >= 2 and noise_scale > 0 expected.")
        if not self.dropouts or not all(0.0 < rate < 1.0 for rate in self.dropouts):
            raise ValueError(f"UCIConfig: dropout in (0, 1) expected (several: candidates), got {self.dropout!r}.")
        if self.flows < 1 or self.reflections < 0:
            raise ValueError("UCIConfig: flows >= 1 and reflections >= 0 expected.")
        rates = tuple(dict.fromkeys(float(rate) for rate in self.dropouts))
        object.__setattr__(self, "dropout", rates if len(rates) > 1 else rates[0])  # one: a number, as kl_weight
        weights = self.kl_weights
        if not weights or not all(weight > 0 for weight in weights):
            raise ValueError(f"UCIConfig: kl_weight > 0 expected (1 is the ELBO), got {self.kl_weight!r}.")
        weights = tuple(dict.fromkeys(float(weight) for weight in weights))
        object.__setattr__(self, "kl_weight", weights if len(weights) > 1 else weights[0])  # one: a number, as stored
        # A protocol without a cooldown (as before protocols had one) has none.
        object.__setattr__(self, "protocols", tuple({"cooldown": 0.0, **protocol} for protocol in self.protocols))
        object.__setattr__(
            self, "method_protocols", tuple((str(m), {"cooldown": 0.0, **p}) for m, p in self.method_protocols)
        )
        check_method_protocols(self.method_protocols, self.methods, self.protocols)
        check_protocols(self.protocols)
        check_calibrations(self.calibrate_noise, self.method_calibrations, self.methods)
        if self.holding_out and not 0 < self.val_fraction < 1:
            raise ValueError(f"UCIConfig: val_fraction in (0, 1) expected, got {self.val_fraction!r}.")
        if self.holding_out and self.nproc > 1:
            what = "choosing among KL weights, protocols or dropout rates" if self.choosing else "calibrate_noise"
            fix = ", or one candidate." if self.choosing else " (or no --calibrate-noise)."
            raise ValueError(f"UCIConfig: {what} runs in one process; give nproc 1{fix}")
        object.__setattr__(self, "method_likelihoods", tuple((str(m), str(v)) for m, v in self.method_likelihoods))
        check_likelihoods(self.likelihood, self.method_likelihoods, self.methods)
        own = dict(self.method_protocols)  # the others choose among the protocols
        choosers = {m: (self.calibrates(m), self.likelihood_of(m)) for m in self.methods if m not in own}
        check_choice_rule(self.choose_by, len(self.protocols), choosers)
        heads = [m for m in self.methods if self.likelihood_of(m) in ("heteroscedastic", BY_RESIDUALS)]
        with_iblm = [method for method in heads if parse_method(method).iblm]
        if with_iblm:
            raise ValueError(
                f"UCIConfig: I-BLM ({with_iblm[0]}) fits the last layer to the targets and has no fit for a "
                "mean-variance head; use likelihood 'gaussian' with it, or the method without '+iblm'."
            )
        if self.device not in DEVICES:
            raise ValueError(f"UCIConfig: device must be one of {', '.join(DEVICES)}, got {self.device!r}.")
        if self.device != "cpu" and self.nproc > 1:
            raise ValueError(
                f"UCIConfig: device {self.device!r} trains in one process (nproc 1); data-parallel training runs on "
                "CPU processes (gloo)."
            )
        if self.nproc < 1 or self.checkpoint_every < 0:
            raise ValueError("UCIConfig: nproc >= 1 and checkpoint_every >= 0 (0: no checkpoints) expected.")
        if self.schedule.batch_size is not None:
            shard_size(self.schedule.batch_size, self.nproc)
        if not 0 <= self.seed + max(self.splits) < 2**32:  # each split is seeded with seed + split
            raise ValueError(f"UCIConfig: seed + split must be in [0, 2**32) (numpy's seeds), got seed {self.seed}.")

    @property
    def kl_weights(self) -> tuple[float, ...]:
        """The KL weight, or the candidates chosen from on validation (``kl_weight`` as a tuple)."""
        return tuple(self.kl_weight) if isinstance(self.kl_weight, (tuple, list)) else (self.kl_weight,)

    @property
    def dropouts(self) -> tuple[float, ...]:
        """MC dropout's rate, or the candidates chosen from on validation (``dropout`` as a tuple)."""
        return tuple(self.dropout) if isinstance(self.dropout, (tuple, list)) else (self.dropout,)

    def likelihood_of(self, method: str) -> str:
        """The likelihood ``method`` trains with (regression): its ``method_likelihoods`` entry, else ``likelihood``."""
        return dict(self.method_likelihoods).get(method, self.likelihood)

    def calibrates(self, method: str) -> bool:
        """Whether ``method``'s noise is calibrated on held-out rows: its ``method_calibrations`` entry, else
        ``calibrate_noise``."""
        return dict(self.method_calibrations).get(method, self.calibrate_noise)

    def for_method(self, method: str) -> UCIConfig:
        """These settings as ``method`` trains with them, alone: its likelihood as ``likelihood``, its network and
        schedule from ``method_protocols``, its calibration as ``calibrate_noise``, and the first of the dropout rates
        unless it is ``mcd``, the one method they apply to."""
        protocol = dict(self.method_protocols).get(method)
        own: dict[str, Any] = dict(
            methods=(method,), method_protocols=(), method_calibrations=(), method_likelihoods=()
        )
        own.update(calibrate_noise=self.calibrates(method), likelihood=self.likelihood_of(method))
        if protocol is not None:  # its own network and schedule, not the run's candidates
            own.update(protocols=(), choose_by=SCORE_RULE, **self._network(protocol))
        if parse_method(method).base != "mcd":
            own["dropout"] = self.dropouts[0]
        return replace(self, **own)

    def _network(self, protocol: dict[str, Any] | None) -> dict[str, Any]:
        """The fields that give these settings ``protocol``'s network and schedule (none for ``None``)."""
        if protocol is None:
            return {}
        schedule = replace(self.schedule, steps=protocol["steps"], lr=protocol["lr"], cooldown=protocol["cooldown"])
        return {"hidden": protocol["hidden"], "layers": protocol["layers"], "schedule": schedule}

    @property
    def choosing(self) -> bool:
        """Whether each split chooses its settings on held-out training rows (several candidates)."""
        return len(self.kl_weights) * max(1, len(self.protocols)) * len(self.dropouts) > 1

    @property
    def holding_out(self) -> bool:
        """Whether each split holds out ``val_fraction`` of its training rows: to choose among candidates
        (:attr:`choosing`) or to calibrate the noise of one of its methods (:meth:`calibrates`)."""
        return self.choosing or any(self.calibrates(method) for method in self.methods)

    def candidates(self) -> list[tuple[str, UCIConfig]]:
        """``(label, settings)`` of every candidate: one KL weight and one dropout rate each, and a protocol's network
        and schedule where there are ``protocols``. The label keys the validation scores: the weight's ``repr``
        alone, or the parts that vary joined by ``:`` (the protocol's name, ``kl`` and the weight's ``repr``,
        ``dropout`` and the rate's ``repr``)."""
        result = []
        for protocol in self.protocols or (None,):
            for weight in self.kl_weights:
                for rate in self.dropouts:
                    network = self._network(protocol)
                    settings = replace(
                        self, kl_weight=weight, dropout=rate, protocols=(), choose_by=SCORE_RULE, **network
                    )
                    parts = [protocol["name"]] if protocol is not None else []
                    if len(self.kl_weights) > 1:
                        parts.append(f"kl{weight!r}" if parts or len(self.dropouts) > 1 else repr(weight))
                    parts += [f"dropout{rate!r}"] * (len(self.dropouts) > 1)
                    result.append((":".join(parts), settings))
        return result

    @classmethod
    def from_protocol(
        cls,
        name: str | tuple[str, ...],
        dataset: str,
        *,
        layers: int | None = None,
        hidden: int | None = None,
        steps: int | None = None,
        lr: float | None = None,
        fixed_noise_steps: int = Schedule.fixed_noise_steps,
        batch_size: int | None = Schedule.batch_size,
        cooldown: float | None = None,
        train_rows: int | None = None,
        **fields,
    ) -> UCIConfig:
        """The settings of ``whvi uci --protocol name`` on ``dataset`` (a folder or bundled set's name):
        :func:`protocol_settings` with the overrides that are not ``None``, the rest of the schedule, and any
        other field of :class:`UCIConfig` as a keyword. Several names (a tuple) are candidates chosen per split
        (``protocols``), the overrides applied to each; the config's own network and schedule are the first's.
        :data:`AUTO_PROTOCOL` (alone; per method, ``method_protocols``) is :func:`auto_protocol` of ``train_rows``,
        which it then needs, as does ``likelihood=``:data:`AUTO_LIKELIHOOD` (:func:`auto_likelihood`) and
        ``calibrate_noise="auto"`` (``"on"``, ``"off"`` or ``"auto"``, ``whvi uci``'s choices, or a bool:
        :func:`~pyro_whvi.experiments.auto_calibration.resolve_calibration`); ``dropout="auto"`` is
        :func:`~pyro_whvi.experiments.auto_dropout.auto_dropout` (:func:`~.uci_auto.protocol_fields`)."""
        names = (name,) if isinstance(name, str) else tuple(dict.fromkeys(name))
        overrides = {"layers": layers, "hidden": hidden, "steps": steps, "lr": lr, "cooldown": cooldown}
        fields = {"methods": cls.methods, "nproc": cls.nproc, **fields}
        resolved = protocol_fields(
            names, dataset, overrides, train_rows, fields, fixed_noise_steps=fixed_noise_steps, batch_size=batch_size
        )
        return cls(**resolved)

    def fingerprint(self, method: str, data: str = "") -> str:
        """A short hash of everything that changes the result of ``method`` on one split: the settings
        and ``data``, a key of the split's data (:func:`data_key`); :func:`settings_fingerprint`."""
        own = self.for_method(method)  # another method's calibration does not make this one's hold rows out
        return settings_fingerprint(method, asdict(own), data, holding_out=own.holding_out)

"""Training one split of ``whvi uci``: :func:`train_split` (a method on a split's training rows, seeded), its
predictions (:func:`predict_split`), and the choice among several KL weights or protocols on held-out training
rows (:func:`choose_settings`, through the library's one selection path,
:func:`~pyro_whvi.train.selection.select_best`). :mod:`~pyro_whvi.experiments.uci` runs the splits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyro
import torch

from ..train.checkpoints import resumed_seconds
from ..train.engine import Checkpoint
from ..train.files import notice
from ..train.selection import holdout, select_best
from .auto_narrow import FACTOR_RULE
from .ensemble import EnsembleGuide, remove_checkpoints, resumed_member_seconds
from .methods import MethodSpec, build_method, fit, predictive_sites
from .reporting import write_atomic
from .uci_config import BY_RESIDUALS, UCIConfig
from .uci_data import SplitSizes, UCIData, check_source, data_key, dataset_name, load_dataset_split
from .uci_report import evaluate

__all__ = [
    "TrainedSplit",
    "check_validation",
    "choose_settings",
    "predict_split",
    "read_saved",
    "train_split",
    "validation_part",
]


@dataclass
class TrainedSplit:
    """What :func:`train_split` leaves: the split's data, the trained model and guide, the losses and the time."""

    data: UCIData
    model: Any
    guide: Any
    losses: list[float]
    seconds: float
    label: str = "split"  # what the progress bars call it


def train_split(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    config: UCIConfig,
    checkpoint: Checkpoint | None = None,
    *,
    kl_weight: float | None = None,
    data: UCIData | None = None,
    validation: bool = False,
    candidate: str = "",
) -> TrainedSplit:
    """Build ``spec``'s network for split ``split`` (seeded with ``config.seed + split``) and train it on
    the split's training data (in every rank of a process group: each its shard), with the settings ``spec`` has
    in ``config`` (:meth:`~.uci_config.UCIConfig.for_method`: its likelihood, network and schedule).

    :param kl_weight: the KL term's weight; default ``config.kl_weight``, which must then be a single one.
    :param data: the split as loaded by the caller, or a part of it to train on instead (a validation holdout's
        fit part, :func:`choose_settings`); default: the split, loaded here.
    :param validation: ``data`` is such a fit part (the progress bar says so).
    :param candidate: the label of the candidate these settings are (:meth:`UCIConfig.candidates`), for the
        progress bar."""
    if kl_weight is None:
        if len(config.kl_weights) > 1:
            raise ValueError(
                f"train_split: config.kl_weight holds {len(config.kl_weights)} candidates; pass the one to train "
                "with as kl_weight (choose_settings chooses one)"
            )
        kl_weight = config.kl_weights[0]
    config = config.for_method(spec.name)  # its likelihood, network and schedule (UCIConfig.method_protocols)
    if config.protocols:
        raise ValueError(
            f"train_split: config.protocols holds {len(config.protocols)} candidates for {spec.name}; pass the "
            "settings of one (config.candidates(); choose_settings chooses one)"
        )
    if len(config.dropouts) > 1:
        raise ValueError(
            f"train_split: config.dropout holds {len(config.dropouts)} candidates for {spec.name}; pass the settings "
            "of one (config.candidates(); choose_settings chooses one)"
        )
    if data is None:
        data = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
    pyro.set_rng_seed(config.seed + split)
    pyro.clear_param_store()
    regression = data.task == "regression"
    widths = [data.x_train.shape[1], *[config.hidden] * config.layers, 1 if regression else data.num_classes]
    # by-residuals trains one noise scale first (likelihood_choice trains the head after it where needed).
    likelihood = "gaussian" if config.likelihood == BY_RESIDUALS else config.likelihood
    model, guide = build_method(
        spec,
        widths,
        likelihood=likelihood if regression else "categorical",
        noise_scale=config.noise_scale,
        dropout=config.dropouts[0],
        flows=config.flows,
        reflections=config.reflections,
    )
    model.to(config.device)  # its priors follow (the guide's parameters are made on the model's device)
    start = time.perf_counter()
    label = f"{dataset_name(source)} {spec.name} split {split}"
    if candidate:
        label += f" {_shown(candidate)}" + (" (validation)" if validation else "")
    losses = fit(
        spec,
        model,
        guide,
        data.x_train.to(config.device),
        data.y_train.to(config.device),
        config.schedule,
        seed=config.seed + split,
        progress=label if config.progress else False,
        checkpoint=checkpoint,
        kl_weight=kl_weight,
        jit=config.jit,
    )
    # A resumed run counts the seconds its checkpoint (an ensemble: its members') had trained: the split's whole
    # training time.
    resumed = resumed_member_seconds(checkpoint) if isinstance(guide, EnsembleGuide) else resumed_seconds(checkpoint)
    seconds = time.perf_counter() - start + resumed
    return TrainedSplit(data, model, guide, losses, seconds, label)


def predict_split(
    trained: TrainedSplit, x_test: torch.Tensor, config: UCIConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Predictive samples of ``f`` on ``x_test`` and the noise's standard deviation (regression), on the CPU for the
    metrics, whatever ``config.device`` trained on (many samples: drawn in chunks, with a progress bar).

    The noise is the learned scale, or with a mean-variance head (the method's likelihood, ``config.likelihood_of``,
    ``"heteroscedastic"``, and every ensemble) what the head predicts for each sample and test row, ``(S, N)`` like
    ``f``. An ensemble's samples are its networks' means (logits) ``(M, N)``
    (:func:`~pyro_whvi.experiments.ensemble.member_predictions`): the uniform mixture's components."""
    regression = trained.data.task == "regression"
    heads = regression and getattr(trained.model, "noise_scale", None) is None
    progress = f"{trained.label}: predicting" if config.progress else False
    x = x_test.to(config.device)
    drawn = predictive_sites(
        trained.model, trained.guide, x, config.samples, progress, ("f", "noise") if heads else ("f",)
    )
    if not regression:
        return drawn["f"].cpu(), None
    noise = drawn["noise"] if heads else trained.model.noise_scale.detach()
    return drawn["f"].cpu(), noise.cpu()


def validation_part(data: UCIData, fraction: float, seed: int) -> UCIData:
    """``data`` with its training rows split by :func:`~pyro_whvi.train.selection.holdout`: a ``fraction``
    of them in the place of the test rows, the rest to train on (the scaling is the full training rows')."""
    fit_rows, val_rows = _held_out(len(data.y_train), fraction, seed)
    x, y = data.x_train, data.y_train
    return replace(data, x_train=x[fit_rows], y_train=y[fit_rows], x_test=x[val_rows], y_test=y[val_rows])


def check_validation(source: str | Path, config: UCIConfig, sizes: SplitSizes | None = None) -> None:
    """A ``ValueError`` before any training when ``config`` holds rows out (to choose among candidates or calibrate
    the noise) and its ``val_fraction`` leaves a split too few rows to train on or to validate on
    (:func:`validation_part`), or calibrates the noise of a classification set. ``sizes``, what
    :func:`~.uci_data.check_source` returned for ``config.splits``, spares loading the splits again: the held-out
    part's size depends on the rows alone, and the split with the fewest decides."""
    if not config.holding_out:
        return
    if sizes is None:
        sizes = check_source(source, config.splits)
    if any(map(config.calibrates, config.methods)) and sizes.outputs > 1:
        raise ValueError(
            f"--calibrate-noise calibrates a regression likelihood's noise; {source} is a classification set: "
            "drop the flag"
        )
    _held_out(sizes.fewest_train, config.val_fraction, config.seed)


def _held_out(rows: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~pyro_whvi.train.selection.holdout` of ``rows`` training rows, or a ``ValueError`` naming
    ``--val-fraction`` where it leaves fewer than 2 to train on or none to validate on."""
    fit_rows, val_rows = holdout(rows, fraction, seed)
    if len(val_rows) < 1 or len(fit_rows) < 2:
        raise ValueError(
            f"val_fraction (--val-fraction) {fraction} of {rows} training rows leaves {len(fit_rows)} "
            f"to train on and {len(val_rows)} to validate on; choose one that leaves at least 2 and 1, or hold no "
            "rows out (one KL weight and protocol, no --calibrate-noise)"
        )
    return fit_rows, val_rows


def choose_settings(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    config: UCIConfig,
    store: Path | None = None,
    data: UCIData | None = None,
    on_fit: Callable[[str, torch.Tensor, torch.Tensor | None, torch.Tensor], None] | None = None,
    factor: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor], float] | None = None,
) -> tuple[str, UCIConfig, dict[str, float], float, dict[str, float]]:
    """Train ``spec`` with each of ``config``'s candidates (:meth:`UCIConfig.candidates`: KL weights, protocols)
    on the fit part of split ``split``'s training rows (:func:`validation_part`) and score it on the rest: test
    MNLL for regression, NLL for classification. Under ``config.choose_by`` ``"noise-factor"`` they are trained in
    order until one's noise ``factor`` is at most 1 (:mod:`~pyro_whvi.experiments.auto_narrow`).

    :param store: a JSON file that keeps each finished candidate's score and seconds (and, while it trains, a
        checkpoint next to it), so that a rerun with the same settings does not train it again.
    :param data: the split, when the caller has loaded it (:func:`run_split` loads it once and passes it down).
    :param on_fit: called with each candidate's label and its predictive on the held-out rows (samples of f, the
        noise, the rows' targets) as it is trained, not where its score is read back from ``store``
        (:func:`~.uci.run_split` keeps the chosen one's to calibrate the noise without training it again).
    :param factor: a candidate's calibrated noise factor from its predictive on the held-out rows (samples of f, the
        noise, the targets: :func:`~.noise_calibration.noise_factor`'s first), which ``"noise-factor"`` needs.
    :returns: the chosen candidate's label and settings (the lowest score, ties: the first given, a NaN score never
        wins; under ``"noise-factor"`` the first whose factor is at most 1, else the last), the score of every
        candidate trained by label, the seconds their training took, and under ``"noise-factor"`` their factors.
    """
    by_factor = config.choose_by == FACTOR_RULE
    if by_factor and factor is None:
        raise TypeError(f"choose_settings: config.choose_by {FACTOR_RULE!r} needs factor (the noise's, per candidate)")
    if data is None:
        data = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
    part = validation_part(data, config.val_fraction, config.seed + split)
    fingerprint = config.fingerprint(spec.name, data_key(source, split))
    saved = read_saved(store, "scores") if store is not None else {}
    if saved.get("fingerprint") != fingerprint:
        saved = {"fingerprint": fingerprint, "scores": {}, "seconds": {}}
    scores, seconds, factors = saved["scores"], saved.setdefault("seconds", {}), saved.setdefault("factors", {})
    metric = "mnll" if data.task == "regression" else "nll"
    candidates = config.candidates()

    def fit(candidate: tuple[str, UCIConfig]) -> tuple[float]:
        label, settings = candidate
        if label not in scores:  # a rerun with the same settings reads the finished candidates back
            checkpoint = None
            if store is not None and config.checkpoint_every:
                path = store.with_suffix(f".{_file_label(label)}.ckpt")
                checkpoint = Checkpoint(path, config.checkpoint_every, fingerprint)
            trained = train_split(
                source, spec, split, settings, checkpoint, data=part, validation=True, candidate=label
            )
            f, noise = predict_split(trained, part.x_test, settings)
            scores[label], seconds[label] = evaluate(part, f, noise)[metric], trained.seconds
            if by_factor:
                assert factor is not None
                factors[label] = factor(f, noise, part.y_test)
            if on_fit is not None:
                on_fit(label, f, noise, part.y_test)
            if store is not None:
                write_atomic(store, json.dumps(saved, indent=2))
                if checkpoint is not None:
                    remove_checkpoints(checkpoint.path)  # and an ensemble's members'
        return (scores[label],)

    if by_factor:
        for label, settings in candidates:  # the last is kept where no factor is at most 1
            fit((label, settings))
            if factors[label] <= 1.0:
                break
    else:  # lower MNLL/NLL is better: select_best maximizes the negated score (ties: the first candidate given)
        _, (label, settings), *_ = select_best(candidates, fit, score=lambda result: -result[0])
    labels = [each for each, _ in candidates if each in scores]
    kept = {each: factors[each] for each in labels} if by_factor else {}
    return (
        label,
        settings,
        {each: scores[each] for each in labels},
        sum(seconds.get(each, 0.0) for each in labels),
        kept,
    )


def _file_label(label: str) -> str:
    """A candidate's label in a file name: a KL weight alone as ``kl<repr>`` (the name stored runs used)."""
    return label if not label[:1].isdigit() else f"kl{label}"


def _shown(label: str) -> str:
    """A candidate's label on a progress bar: ``KL 0.1`` for a weight alone, else the protocol's label."""
    return f"KL {float(label):g}" if label[:1].isdigit() else label


def read_saved(path: Path, content: str = "row") -> dict[str, Any]:
    """A stored split result (its ``content`` a dict), or ``{}`` if there is none; an unreadable one (empty,
    truncated) is named in a :func:`~pyro_whvi.train.files.notice` and treated as missing."""
    if not path.exists():
        return {}
    try:
        text = path.read_text()
        if not text.strip():
            raise ValueError("empty file")
        saved = json.loads(text)
        if not isinstance(saved, dict) or not isinstance(saved.get(content), dict):
            raise ValueError(f"no {content}")
    except (OSError, ValueError) as error:
        notice(f"{path} is unreadable ({error}); training what it held again")
        return {}
    return saved

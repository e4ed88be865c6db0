r"""The UCI benchmark harness behind ``whvi uci``: any dataset, any methods, resumable.

A dataset is a directory in the UCI split format or one of scikit-learn's bundled sets
(:mod:`~pyro_whvi.experiments.uci_data`). Inputs are standardized with training statistics;
regression targets are standardized for training and the metrics reported in the original units.

Each (method, split) is trained with :func:`pyro_whvi.experiments.methods.fit` and written to
``<out>/runs/<dataset>/<method>/split<k>.json`` with a fingerprint of the settings and of the data (the
folder's resolved path and a hash of the files the split is read from); a rerun with the same settings
on the same data reads finished splits instead of training them again. The summary (mean and standard
error over splits, :mod:`~pyro_whvi.experiments.uci_report`) goes to ``<out>/uci_<dataset>.{json,csv,md}``.
With ``nproc > 1`` (or under ``torchrun``) each split is trained data-parallel
(:mod:`pyro_whvi.train.engine`); a split's training state is checkpointed next to its result and a
rerun resumes it.

Metrics (Monte-Carlo predictive with ``samples`` posterior draws): regression — test RMSE and MNLL
(negative log of the predictive mixture density, averaged over test points); classification — error
rate, NLL, ECE (15 bins) and mean predictive entropy.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §3.2, Table 3 and App. D.1 (set-up and schedule).
    J. M. Hernández-Lobato, R. Adams. *Probabilistic Backpropagation*. ICML 2015 (the split format).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyro
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..metrics import reliability_diagram
from ..train import distributed
from ..train.engine import Checkpoint
from ..train.selection import holdout
from .arguments import check_device
from .methods import MethodSpec, build_method, fit, parse_method, predictive_samples
from .noisy_sets import NOISE_FILE, noise_floor, read_noise_std
from .reporting import check_writable, save_tables, write_atomic
from .uci_config import ENGINE_VERSION, UCIConfig
from .uci_data import (
    BUNDLED_DATASETS,
    UCIData,
    check_source,
    data_key,
    dataset_name,
    is_bundled,
    load_dataset_split,
    parse_splits,
)
from .uci_report import evaluate, plot_reliability, summarize, summary_table, with_floor

__all__ = [
    "BUNDLED_DATASETS",
    "ENGINE_VERSION",
    "TrainedSplit",
    "UCIConfig",
    "UCIData",
    "check_source",
    "check_validation",
    "choose_kl_weight",
    "data_key",
    "dataset_name",
    "load_dataset_split",
    "parse_splits",
    "run_split",
    "run_uci",
    "summarize",
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


def train_split(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    config: UCIConfig,
    checkpoint: Checkpoint | None = None,
    *,
    kl_weight: float | None = None,
    data: UCIData | None = None,
) -> TrainedSplit:
    """Build ``spec``'s network for split ``split`` (seeded with ``config.seed + split``) and train it on
    the split's training data (in every rank of a process group: each its shard).

    :param kl_weight: the KL term's weight; default ``config.kl_weight``, which must then be a single one.
    :param data: train on ``data.x_train``, ``data.y_train`` instead of the split's (e.g. a validation holdout's
        fit part, :func:`choose_kl_weight`)."""
    validating = data is not None
    if kl_weight is None:
        if len(config.kl_weights) > 1:
            raise ValueError(
                f"train_split: config.kl_weight holds {len(config.kl_weights)} candidates; pass the one to train "
                "with as kl_weight (choose_kl_weight chooses one)"
            )
        kl_weight = config.kl_weights[0]
    if data is None:
        data = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
    pyro.set_rng_seed(config.seed + split)
    pyro.clear_param_store()
    regression = data.task == "regression"
    widths = [data.x_train.shape[1], *[config.hidden] * config.layers, 1 if regression else data.num_classes]
    model, guide = build_method(
        spec,
        widths,
        likelihood="gaussian" if regression else "categorical",
        noise_scale=config.noise_scale,
        dropout=config.dropout,
        flows=config.flows,
        reflections=config.reflections,
    )
    model.to(config.device)  # its priors follow (the guide's parameters are made on the model's device)
    start = time.perf_counter()
    label = f"{dataset_name(source)} {spec.name} split {split}"
    if len(config.kl_weights) > 1:
        label += f" KL {kl_weight:g}" + (" (validation)" if validating else "")
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
    )
    return TrainedSplit(data, model, guide, losses, time.perf_counter() - start)


def _predict(
    trained: TrainedSplit, x_test: torch.Tensor, config: UCIConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Predictive samples of ``f`` on ``x_test`` and the learned noise scale (regression), on the CPU for the
    metrics, whatever ``config.device`` trained on."""
    f = predictive_samples(trained.model, trained.guide, x_test.to(config.device), config.samples).cpu()
    regression = trained.data.task == "regression"
    return f, trained.model.noise_scale.detach().cpu() if regression else None


def validation_part(data: UCIData, fraction: float, seed: int) -> UCIData:
    """``data`` with its training rows split by :func:`~pyro_whvi.train.selection.holdout`: a ``fraction``
    of them in the place of the test rows, the rest to train on (the scaling is the full training rows')."""
    fit_rows, val_rows = holdout(len(data.y_train), fraction, seed)
    if len(val_rows) < 1 or len(fit_rows) < 2:
        raise ValueError(
            f"val_fraction (--val-fraction) {fraction} of {len(data.y_train)} training rows leaves {len(fit_rows)} "
            f"to train on and {len(val_rows)} to validate on; choose one that leaves at least 2 and 1, or one KL weight"
        )
    x, y = data.x_train, data.y_train
    return replace(data, x_train=x[fit_rows], y_train=y[fit_rows], x_test=x[val_rows], y_test=y[val_rows])


def check_validation(source: str | Path, config: UCIConfig) -> None:
    """A ``ValueError`` before any training when ``config`` chooses among KL weights and its ``val_fraction``
    leaves a split too few rows to train on or to validate on (:func:`validation_part`)."""
    if len(config.kl_weights) > 1:
        for split in config.splits:
            data = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
            validation_part(data, config.val_fraction, config.seed + split)


def choose_kl_weight(
    source: str | Path, spec: MethodSpec, split: int, config: UCIConfig, store: Path | None = None
) -> tuple[float, dict[str, float], float]:
    """Train ``spec`` with each of ``config.kl_weights`` on the fit part of split ``split``'s training rows
    (:func:`validation_part`) and score it on the rest: test MNLL for regression, NLL for classification.

    :param store: a JSON file that keeps each finished candidate's score and seconds (and, while it trains, a
        checkpoint next to it), so that a rerun with the same settings does not train it again.
    :returns: the weight with the lowest score (ties: the first given; a NaN score never wins), every
        candidate's score by ``repr(weight)``, and the seconds their training took.
    """
    data = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
    part = validation_part(data, config.val_fraction, config.seed + split)
    fingerprint = config.fingerprint(spec.name, data_key(source, split))
    saved = _read_saved(store, "scores") if store is not None else {}
    if saved.get("fingerprint") != fingerprint:
        saved = {"fingerprint": fingerprint, "scores": {}, "seconds": {}}
    scores, seconds = saved["scores"], saved.setdefault("seconds", {})
    metric = "mnll" if data.task == "regression" else "nll"
    for weight in config.kl_weights:
        name = repr(weight)
        if name in scores:
            continue
        checkpoint = None
        if store is not None and config.checkpoint_every:
            checkpoint = Checkpoint(store.with_suffix(f".kl{name}.ckpt"), config.checkpoint_every, fingerprint)
        trained = train_split(source, spec, split, config, checkpoint, kl_weight=weight, data=part)
        f, noise = _predict(trained, part.x_test, config)
        scores[name], seconds[name] = evaluate(part, f, noise)[metric], trained.seconds
        if store is not None:
            write_atomic(store, json.dumps(saved, indent=2))
            if checkpoint is not None:
                checkpoint.path.unlink(missing_ok=True)
    names = [repr(weight) for weight in config.kl_weights]
    best = min(config.kl_weights, key=lambda weight: (math.isnan(scores[repr(weight)]), scores[repr(weight)]))
    return best, {name: scores[name] for name in names}, sum(seconds.get(name, 0.0) for name in names)


def run_split(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    config: UCIConfig,
    checkpoint: Checkpoint | None = None,
    selection_store: Path | None = None,
) -> tuple[dict[str, Any], dict]:
    """Train ``spec`` on split ``split`` (:func:`train_split`); return its row of metrics and, for
    classification, the reliability diagram's bins (``{"reliability": [confidence, accuracy, count]}``).

    With several ``config.kl_weights`` the weight is chosen first (:func:`choose_kl_weight`, its scores kept in
    ``selection_store``; ``checkpoint`` is then kept per chosen weight); the row names the weight (``kl_weight``),
    every candidate's validation score and the seconds the candidates took (counted in ``train_seconds``).
    In a process group every rank trains its shard and only rank 0 evaluates (the others return ``({}, {})``).
    """
    chosen: dict[str, Any] = {}
    kl_weight = config.kl_weights[0]
    if len(config.kl_weights) > 1:
        kl_weight, scores, seconds = choose_kl_weight(source, spec, split, config, selection_store)
        chosen = {"kl_weight": kl_weight, "validation_scores": scores, "selection_seconds": seconds}
        if checkpoint is not None:  # a run begun with another choice is not resumed with this one
            checkpoint = replace(checkpoint, key=f"{checkpoint.key}:kl{kl_weight!r}")
    trained = train_split(source, spec, split, config, checkpoint, kl_weight=kl_weight)
    if distributed.rank() != 0:
        return {}, {}
    data, guide, losses = trained.data, trained.guide, trained.losses
    regression = data.task == "regression"
    f, noise = _predict(trained, data.x_test, config)
    extra = {} if regression else {"reliability": [t.tolist() for t in reliability_diagram(f, data.y_test)]}
    row = {
        "method": spec.name,
        "split": split,
        **evaluate(data, f, noise),
        "final_loss": sum(losses[-100:]) / len(losses[-100:]),
        "variational_parameters": sum(p.numel() for p in guide.parameters()),
        "train_seconds": trained.seconds + chosen.get("selection_seconds", 0.0),
        **chosen,
    }
    return row, extra


def _read_saved(path: Path, content: str = "row") -> dict[str, Any]:
    """A stored split result (its ``content`` a dict), or ``{}`` if there is none; an unreadable one (empty,
    truncated) is named in a warning and treated as missing."""
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
        warnings.warn(f"{path} is unreadable ({error}); training what it held again", stacklevel=3)
        return {}
    return saved


def run_uci(
    source: str | Path,
    config: UCIConfig,
    out: Path,
    *,
    port: int | None = None,
    timeout: timedelta = distributed.DEFAULT_TIMEOUT,
    threads: int | None = None,
    check: bool = True,
) -> tuple[list[dict[str, Any]], str]:
    """Run every (method, split) of ``config`` not already finished in ``out``; write and return the summary.

    With ``config.nproc > 1`` the splits are trained data-parallel by that many processes started here
    (:func:`pyro_whvi.train.distributed.launch`), or by the processes of the group this one already belongs to
    (``torchrun``); the batch is split over them. Rank 0 writes every file; a split's training state is
    checkpointed every ``config.checkpoint_every`` steps to ``runs/<dataset>/<method>/split<k>.ckpt`` and a
    rerun resumes it.

    :param source: a UCI-format directory or a name in :data:`BUNDLED_DATASETS`.
    :param port: the rendezvous port of the processes started here (default: a free one).
    :param timeout: how long any collective may wait for the other processes.
    :param threads: torch threads of each process started here (default: the cores shared out).
    :param check: validate ``config.device``, ``source`` and ``out`` first (:func:`check_source`,
        :func:`check_validation`, :func:`check_writable`);
        ``False`` when the caller just did (``whvi uci`` reports their errors as usage errors).
    :returns: the summary rows and the markdown table (on rank 0; ``([], "")`` on the others).
    :raises OSError: before any training, if ``out`` is not a folder that can be written to.
    """
    if check:
        check_device(config.device, "device")
        check_source(source, config.splits)
        check_validation(source, config)
        check_writable(out)
    if config.nproc > 1 and distributed.world_size() == 1:
        return distributed.launch(
            _run_jobs, config.nproc, source, config, out, port=port, timeout=timeout, threads=threads
        )
    if distributed.world_size() != config.nproc:
        raise ValueError(
            f"run_uci: this process group has {distributed.world_size()} processes but config.nproc is {config.nproc}"
        )
    return _run_jobs(source, config, out)


def _run_jobs(source: str | Path, config: UCIConfig, out: Path) -> tuple[list[dict[str, Any]], str]:
    leader = distributed.rank() == 0
    name = dataset_name(source)
    rows: list[dict[str, Any]] = []
    reliability: dict[str, list] = {}
    keys = {split: data_key(source, split) for split in config.splits}
    jobs = [(method, split) for method in config.methods for split in config.splits]
    for method, split in tqdm(jobs, desc=name, disable=not (config.progress and leader)):
        path = out / "runs" / name / method / f"split{split}.json"
        fingerprint = config.fingerprint(method, keys[split])
        decision = [_read_saved(path) if leader else None]
        if distributed.world_size() > 1:
            dist.broadcast_object_list(decision, src=0)  # every rank trains the split, or none
        saved = decision[0] or {}
        if saved.get("fingerprint") != fingerprint:
            every = config.checkpoint_every
            checkpoint = Checkpoint(path.with_suffix(".ckpt"), every, fingerprint) if every else None
            store = path.with_suffix(".validation.json")
            row, extra = run_split(source, parse_method(method), split, config, checkpoint, store)
            saved = {"fingerprint": fingerprint, "row": row, **extra}
            if leader:
                write_atomic(path, json.dumps(saved, indent=2))
                path.with_suffix(".ckpt").unlink(missing_ok=True)
                store.unlink(missing_ok=True)  # the choice's scores are in the row
        rows.append(saved["row"])
        if "reliability" in saved:
            reliability.setdefault(method, []).append(saved["reliability"])
    if not leader:
        return [], ""
    sigma = None if is_bundled(source) else read_noise_std(source)
    if sigma is not None:
        rows = [with_floor(row, sigma) for row in rows]
    summary = summarize(rows, config.methods)
    text = summary_table(name, summary, config)
    if len(config.kl_weights) > 1:
        text += "\n\nKL weight chosen per split on validation: " + "; ".join(
            f"{method}: " + ", ".join(f"{row['kl_weight']:g}" for row in rows if row["method"] == method)
            for method in config.methods
        )
    if sigma is not None:
        floor = noise_floor(sigma)
        text += (
            f"\n\nKnown noise σ = {sigma:.4g} ({NOISE_FILE}): the best possible test RMSE is σ and the best test MNLL "
            f"{floor['mnll_floor']:.3f}."
        )
    meta = {"dataset": str(source), "config": json.loads(json.dumps(asdict(config), default=str)), "splits": rows}
    save_tables(out, f"uci_{name}", meta, summary, text)
    if reliability:
        plot_reliability(out / f"uci_{name}_reliability.png", reliability)
    return summary, text

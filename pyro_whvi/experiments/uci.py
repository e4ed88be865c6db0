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
(:mod:`pyro_whvi.train.engine`); a split's training state is checkpointed next to its result (a deep
ensemble's, each network's: :func:`~pyro_whvi.experiments.ensemble.member_checkpoint`) and a rerun resumes it.

Metrics (Monte-Carlo predictive with ``samples`` posterior draws): regression — test RMSE and MNLL
(negative log of the predictive mixture density, averaged over test points); classification — error
rate, NLL, ECE (15 bins) and mean predictive entropy. A deep ensemble's predictive is the uniform mixture of its
networks' (:mod:`~pyro_whvi.experiments.ensemble`): the same metrics, its networks in the place of the samples.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §3.2, Table 3 and App. D.1 (set-up and schedule).
    J. M. Hernández-Lobato, R. Adams. *Probabilistic Backpropagation*. ICML 2015 (the split format).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..metrics import reliability_diagram
from ..train import distributed
from ..train.engine import Checkpoint
from ..train.files import notice
from ..train.folder_lock import folder_lock
from .arguments import check_device
from .auto_narrow import FACTOR_RULE
from .ensemble import remove_checkpoints
from .likelihood_choice import NOISE_GAIN_THRESHOLD, check_store, train_choosing_likelihood
from .memory_checks import check_uci_memory
from .methods import MethodSpec, parse_method
from .noise_calibration import HeldOutFit, calibrate_noise, calibrated_noise, calibration_store, noise_factor
from .noisy_sets import NOISE_FILE, noise_floor, split_noise_std
from .reporting import check_writable, save_tables, write_atomic
from .uci_config import BY_RESIDUALS, ENGINE_VERSION, UCIConfig
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
from .uci_report import choices_text, evaluate, plot_reliability, summarize, summary_table, with_floor
from .uci_train import (
    TrainedSplit,
    check_validation,
    choose_settings,
    predict_split,
    read_saved,
    train_split,
    validation_part,
)

__all__ = [
    "BUNDLED_DATASETS",
    "ENGINE_VERSION",
    "TrainedSplit",
    "UCIConfig",
    "UCIData",
    "check_source",
    "check_validation",
    "choose_settings",
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


def run_split(
    source: str | Path,
    spec: MethodSpec,
    split: int,
    config: UCIConfig,
    checkpoint: Checkpoint | None = None,
    selection_store: Path | None = None,
    data: UCIData | None = None,
) -> tuple[dict[str, Any], dict]:
    """Train ``spec`` on split ``split`` (:func:`train_split`); return its row of metrics and, for
    classification, the reliability diagram's bins (``{"reliability": [confidence, accuracy, count]}``).

    With several candidates (``config.kl_weights``, ``config.protocols``, for ``mcd`` ``config.dropouts``) the
    settings are chosen first (:func:`choose_settings`, its scores kept in ``selection_store``; ``checkpoint`` is
    then kept per choice); the row names the choice (``kl_weight``, ``dropout`` where there are several rates, and
    ``protocol`` with its ``hidden``, ``layers``, ``steps`` and ``lr`` where there are protocols), every candidate's
    validation score and the seconds the candidates took (counted in ``train_seconds``), and under
    ``config.choose_by`` ``"noise-factor"`` the ``noise_factors`` of the candidates tried. A method with the
    likelihood ``"by-residuals"`` (regression) is trained by
    :func:`~pyro_whvi.experiments.likelihood_choice.train_choosing_likelihood` (its check kept in
    :func:`~pyro_whvi.experiments.likelihood_choice.check_store`); the row names the ``likelihood`` chosen, the
    ``noise_gain`` it was chosen by and the one noise scale's ``spread_share``. Where ``config.calibrates`` the
    method, its noise is calibrated on held-out rows first
    (:func:`~pyro_whvi.experiments.noise_calibration.calibrate_noise`, kept beside ``selection_store``; under
    ``"by-residuals"`` where the split chooses the head, before the head's training, or keeps one noise scale whose
    ``spread_share`` reaches :data:`~.auto_calibration.SPREAD_SHARE_THRESHOLD`, after its training) and the predictive
    is the scale mixture of the noise times the row's ``noise_factor`` and, with weight ``learned_noise_weight``, the
    learned noise (:func:`~pyro_whvi.experiments.noise_calibration.calibrated_noise`);
    its ``calibration_seconds`` count in ``train_seconds`` (0 where the settings were chosen: the held-out fit is the
    chosen candidate's, trained once, its seconds in ``selection_seconds``), and ``learned_noise_mnll`` is the test
    MNLL the learned noise alone gives the same draws (what the calibration changed).
    In a process group every rank trains its shard and only rank 0 evaluates (the others return ``({}, {})``).
    """
    chosen: dict[str, Any] = {}
    settings, label = config, ""
    if data is None:  # loaded once and passed down (whvi uci loads each split once for all its methods)
        data = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
    own = config.for_method(spec.name)  # the dropout rates are candidates for mcd alone
    fits: dict[str, HeldOutFit] = {}  # each candidate's predictive on the held-out rows, where the noise is calibrated

    def keep_fit(candidate: str, f: torch.Tensor, noise: torch.Tensor | None, y: torch.Tensor) -> None:
        fits[candidate] = HeldOutFit(f, noise, y)

    if own.choosing:
        one_scale = data.task == "regression" and own.likelihood_of(spec.name) != BY_RESIDUALS
        on_fit = keep_fit if config.calibrates(spec.name) and one_scale else None
        factor = (lambda f, noise, y: noise_factor(f, noise, y)[0]) if own.choose_by == FACTOR_RULE else None
        label, settings, scores, seconds, factors = choose_settings(
            source, spec, split, own, selection_store, data, on_fit, factor
        )
        chosen = {"kl_weight": settings.kl_weight, "validation_scores": scores, "selection_seconds": seconds}
        if factors:  # each candidate tried, in order, until one's was at most 1
            chosen["noise_factors"] = factors
        if len(own.dropouts) > 1:
            chosen["dropout"] = settings.dropout
        if own.protocols:  # the label is the protocol's name, then the other parts (UCIConfig.candidates)
            chosen["protocol"] = label.split(":")[0]
            chosen.update(layers=settings.layers, hidden=settings.hidden)
            chosen.update(steps=settings.schedule.steps, lr=settings.schedule.lr)
        if checkpoint is not None:  # a run begun with another choice is not resumed with this one
            choice = label if own.protocols or len(own.dropouts) > 1 else f"kl{settings.kl_weight!r}"
            checkpoint = replace(checkpoint, key=f"{checkpoint.key}:{choice}")
    calibration: dict[str, Any] = {}
    kept = calibration_store(selection_store) if selection_store is not None else None

    def calibrate(chosen_settings: UCIConfig, data: UCIData = data, fitted: HeldOutFit | None = None) -> None:
        # before a training, which seeds itself
        calibration.update(calibrate_noise(source, spec, split, chosen_settings, data, label, kept, fitted))

    by_residuals = data.task == "regression" and settings.likelihood_of(spec.name) == BY_RESIDUALS
    if config.calibrates(spec.name) and not by_residuals:  # the chosen candidate's fit is the one it would train
        calibrate(settings, fitted=fits.get(label))
    if by_residuals:  # calibrated where the split chooses the head, or q's spread of f is a large share of one scale
        store = check_store(selection_store) if selection_store is not None else None
        calibrates = calibrate if config.calibrates(spec.name) else None
        trained, likelihood = train_choosing_likelihood(
            source, spec, split, settings, checkpoint, data, label, store, calibrates
        )
        chosen.update(likelihood)
    else:
        trained = train_split(source, spec, split, settings, checkpoint, data=data, candidate=label)
    if distributed.rank() != 0:
        return {}, {}
    data, guide, losses = trained.data, trained.guide, trained.losses
    regression = data.task == "regression"
    f, noise = predict_split(trained, data.x_test, config)
    weights = None
    if calibration:
        assert noise is not None  # regression
        calibration = {**calibration, "learned_noise_mnll": evaluate(data, f, noise)["mnll"]}  # the same draws
        noise, weights = calibrated_noise(noise, calibration)
    extra = {} if regression else {"reliability": [t.tolist() for t in reliability_diagram(f, data.y_test)]}
    row = {
        "method": spec.name,
        "split": split,
        **evaluate(data, f, noise, weights),
        "final_loss": sum(losses[-100:]) / len(losses[-100:]),
        "variational_parameters": sum(p.numel() for p in guide.parameters()),
        "train_seconds": trained.seconds
        + chosen.get("selection_seconds", 0.0)
        + calibration.get("calibration_seconds", 0.0),
        **chosen,
        **calibration,
    }
    return row, extra


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
        :func:`check_validation`, :func:`check_writable`) and check that the run fits in memory
        (:func:`~pyro_whvi.experiments.memory_checks.check_uci_memory`);
        ``False`` when the caller just did (``whvi uci`` reports their errors as usage errors).
    :returns: the summary rows and the markdown table (on rank 0; ``([], "")`` on the others).
    :raises OSError: before any training, if ``out`` is not a folder that can be written to.
    :raises ~pyro_whvi.train.folder_lock.FolderLocked: another live run is using ``out``.
    """
    if check:
        check_device(config.device, "device")
        sizes = check_source(source, config.splits)
        check_uci_memory(config, sizes)
        check_validation(source, config, sizes)
        check_writable(out)
    if distributed.world_size() not in (1, config.nproc):
        raise ValueError(
            f"run_uci: this process group has {distributed.world_size()} processes but config.nproc is {config.nproc}"
        )
    # One run per folder: rank 0 (the launcher, or torchrun's first process) holds out's lock, and the processes
    # launch starts hold it with it, so a second run on the same folder refuses instead of racing on its files.
    with folder_lock(out) if distributed.rank() == 0 else contextlib.nullcontext():
        if config.nproc > 1 and distributed.world_size() == 1:
            return distributed.launch(
                _run_jobs, config.nproc, source, config, out, port=port, timeout=timeout, threads=threads
            )
        return _run_jobs(source, config, out)


def _run_jobs(source: str | Path, config: UCIConfig, out: Path) -> tuple[list[dict[str, Any]], str]:
    leader = distributed.rank() == 0
    name = dataset_name(source)
    rows: list[dict[str, Any]] = []
    reliability: dict[str, list] = {}
    keys = {split: data_key(source, split) for split in config.splits}
    loaded: dict[int, UCIData] = {}  # each split read once, when its first method trains on it
    jobs = [(method, split) for method in config.methods for split in config.splits]
    for method, split in tqdm(jobs, desc=name, disable=not (config.progress and leader)):
        path = out / "runs" / name / method / f"split{split}.json"
        fingerprint = config.fingerprint(method, keys[split])
        decision = [read_saved(path) if leader else None]
        if distributed.world_size() > 1:
            dist.broadcast_object_list(decision, src=0)  # every rank trains the split, or none
        saved = decision[0] or {}
        if saved and saved.get("fingerprint") != fingerprint and leader:
            notice(f"{path} was stored with other settings or data; training {method} on split {split} again")
        if saved.get("fingerprint") != fingerprint:
            every = config.checkpoint_every
            checkpoint = Checkpoint(path.with_suffix(".ckpt"), every, fingerprint) if every else None
            store = path.with_suffix(".validation.json")
            if split not in loaded:
                loaded[split] = load_dataset_split(source, split, standardize_targets=config.standardize_targets)
            row, extra = run_split(source, parse_method(method), split, config, checkpoint, store, loaded[split])
            saved = {"fingerprint": fingerprint, "row": row, **extra}
            if leader:
                write_atomic(path, json.dumps(saved, indent=2))
                remove_checkpoints(path.with_suffix(".ckpt"))  # and an ensemble's members'
                store.unlink(missing_ok=True)  # the choice's scores are in the row
                check_store(store).unlink(missing_ok=True)  # and the likelihood's check
                calibration_store(store).unlink(missing_ok=True)  # and the noise's calibration
        rows.append(saved["row"])
        if "reliability" in saved:
            reliability.setdefault(method, []).append(saved["reliability"])
    if not leader:
        return [], ""
    sigmas = {} if is_bundled(source) else split_noise_std(source, config.splits)
    if sigmas:
        rows = [with_floor(row, sigmas[row["split"]]) for row in rows]
    summary = summarize(rows, config.methods)
    text = summary_table(name, summary, config)
    text += choices_text(rows, config, NOISE_GAIN_THRESHOLD)
    sigma = next(iter(sigmas.values()), None)
    if isinstance(sigma, float):
        floor = noise_floor(sigma)
        text += (
            f"\n\nKnown noise σ = {sigma:.4g} ({NOISE_FILE}): the best possible test RMSE is σ and the best test MNLL "
            f"{floor['mnll_floor']:.3f}."
        )
    elif sigma is not None:  # one per row: each split's floor is its test rows'
        floors = [noise_floor(each) for each in sigmas.values()]
        rmse_floor = sum(floor["rmse_floor"] for floor in floors) / len(floors)
        mnll_floor = sum(floor["mnll_floor"] for floor in floors) / len(floors)
        text += (
            f"\n\nKnown noise σ(x), one per row ({NOISE_FILE}): the best possible test RMSE is the root mean square "
            f"of the test rows' σ(x), {rmse_floor:.4g}, and the best test MNLL the mean of ½ log(2π σ(x)²) + ½ over "
            f"them, {mnll_floor:.3f} (means over the splits; each row's ratios and gap are to its split's)."
        )
    meta = {"dataset": str(source), "config": json.loads(json.dumps(asdict(config), default=str)), "splits": rows}
    save_tables(out, f"uci_{name}", meta, summary, text)
    if reliability:
        plot_reliability(out / f"uci_{name}_reliability.png", reliability)
    return summary, text

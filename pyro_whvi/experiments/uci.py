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
(:mod:`pyro_whvi.experiments.engine`); a split's training state is checkpointed next to its result and a
rerun resumes it.

Metrics (Monte-Carlo predictive with ``samples`` posterior draws): regression — test RMSE and MNLL
(negative log of the predictive mixture density, averaged over test points); classification — error
rate, NLL, ECE (15 bins) and mean predictive entropy.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §3.2, Table 3 and App. D.1 (set-up and schedule).
    J. M. Hernández-Lobato, R. Adams. *Probabilistic Backpropagation*. ICML 2015 (the split format).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyro
import torch.distributed as dist
from tqdm.auto import tqdm

from ..metrics import (
    reliability_diagram,
)
from . import distributed
from .engine import Checkpoint, shard_size
from .methods import MethodSpec, Schedule, build_method, fit, parse_method, predictive_samples
from .noisy_sets import NOISE_FILE, noise_floor, read_noise_std
from .reporting import check_writable, save_tables, write_atomic
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
    "TrainedSplit",
    "UCIConfig",
    "UCIData",
    "check_source",
    "data_key",
    "dataset_name",
    "load_dataset_split",
    "parse_splits",
    "run_split",
    "run_uci",
    "summarize",
    "train_split",
]

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


@dataclass
class TrainedSplit:
    """What :func:`train_split` leaves: the split's data, the trained model and guide, the losses and the time."""

    data: UCIData
    model: Any
    guide: Any
    losses: list[float]
    seconds: float


def train_split(
    source: str | Path, spec: MethodSpec, split: int, config: UCIConfig, checkpoint: Checkpoint | None = None
) -> TrainedSplit:
    """Build ``spec``'s network for split ``split`` (seeded with ``config.seed + split``) and train it on
    the split's training data (in every rank of a process group: each its shard)."""
    data = load_dataset_split(source, split)
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
    start = time.perf_counter()
    label = f"{dataset_name(source)} {spec.name} split {split}"
    losses = fit(
        spec,
        model,
        guide,
        data.x_train,
        data.y_train,
        config.schedule,
        seed=config.seed + split,
        progress=label if config.progress else False,
        checkpoint=checkpoint,
    )
    return TrainedSplit(data, model, guide, losses, time.perf_counter() - start)


def run_split(
    source: str | Path, spec: MethodSpec, split: int, config: UCIConfig, checkpoint: Checkpoint | None = None
) -> tuple[dict[str, Any], dict]:
    """Train ``spec`` on split ``split`` (:func:`train_split`); return its row of metrics and, for
    classification, the reliability diagram's bins (``{"reliability": [confidence, accuracy, count]}``).

    In a process group every rank trains its shard and only rank 0 evaluates (the others return ``({}, {})``).
    """
    trained = train_split(source, spec, split, config, checkpoint)
    if distributed.rank() != 0:
        return {}, {}
    data, model, guide, losses = trained.data, trained.model, trained.guide, trained.losses
    regression = data.task == "regression"
    f = predictive_samples(model, guide, data.x_test, config.samples)
    noise = model.noise_scale.detach() if regression else None
    extra = {} if regression else {"reliability": [t.tolist() for t in reliability_diagram(f, data.y_test)]}
    row = {
        "method": spec.name,
        "split": split,
        **evaluate(data, f, noise),
        "final_loss": sum(losses[-100:]) / len(losses[-100:]),
        "variational_parameters": sum(p.numel() for p in guide.parameters()),
        "train_seconds": trained.seconds,
    }
    return row, extra


def _read_saved(path: Path) -> dict[str, Any]:
    """A stored split result, or ``{}`` if there is none; an unreadable one (empty, truncated) is named
    in a warning and treated as missing."""
    if not path.exists():
        return {}
    try:
        text = path.read_text()
        if not text.strip():
            raise ValueError("empty file")
        saved = json.loads(text)
        if not isinstance(saved, dict) or not isinstance(saved.get("row"), dict):
            raise ValueError("no result row")
    except (OSError, ValueError) as error:
        warnings.warn(f"{path} is unreadable ({error}); training that split again", stacklevel=3)
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
) -> tuple[list[dict[str, Any]], str]:
    """Run every (method, split) of ``config`` not already finished in ``out``; write and return the summary.

    With ``config.nproc > 1`` the splits are trained data-parallel by that many processes started here
    (:func:`pyro_whvi.experiments.distributed.launch`), or by the processes of the group this one already belongs to
    (``torchrun``); the batch is split over them. Rank 0 writes every file; a split's training state is
    checkpointed every ``config.checkpoint_every`` steps to ``runs/<dataset>/<method>/split<k>.ckpt`` and a
    rerun resumes it.

    :param source: a UCI-format directory or a name in :data:`BUNDLED_DATASETS`.
    :param port: the rendezvous port of the processes started here (default: a free one).
    :param timeout: how long any collective may wait for the other processes.
    :param threads: torch threads of each process started here (default: the cores shared out).
    :returns: the summary rows and the markdown table (on rank 0; ``([], "")`` on the others).
    :raises OSError: before any training, if ``out`` is not a folder that can be written to.
    """
    check_source(source, config.splits)
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
            row, extra = run_split(source, parse_method(method), split, config, checkpoint)
            saved = {"fingerprint": fingerprint, "row": row, **extra}
            if leader:
                write_atomic(path, json.dumps(saved, indent=2))
                path.with_suffix(".ckpt").unlink(missing_ok=True)
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

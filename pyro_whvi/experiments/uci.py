r"""The UCI benchmark harness behind ``whvi uci``: any dataset, any methods, resumable.

A dataset is a directory in the standard UCI split format (``data.txt``, ``index_features.txt``,
``index_target.txt``, ``index_train_<k>.txt``, ``index_test_<k>.txt``) or one of scikit-learn's
bundled sets (``diabetes`` regression, ``breast_cancer`` and ``digits`` classification; the split
index seeds their random 90/10 or 70/30 split). Inputs are standardized with training statistics;
regression targets are standardized for training and the metrics reported in the original units.

Each (method, split) is trained with :func:`pyro_whvi.experiments.methods.fit` and written to
``<out>/runs/<dataset>/<method>/split<k>.json`` with a fingerprint of the settings and of the data (the
folder's resolved path and a hash of the files the split is read from); a rerun with the same settings
on the same data reads finished splits instead of training them again. The summary (mean and standard
error over splits) goes to ``<out>/uci_<dataset>.{json,csv,md}``. With ``nproc > 1`` (or under
``torchrun``) each split is trained data-parallel (:mod:`pyro_whvi.experiments.engine`); a split's training state
is checkpointed next to its result and a rerun resumes it.

Metrics (Monte-Carlo predictive with ``samples`` posterior draws): regression — test RMSE and MNLL
(negative log of the predictive mixture density, averaged over test points); classification — error
rate, NLL, ECE (15 bins) and mean predictive entropy.

References:
    WHVI paper (Rossi et al., NeurIPS 2020), §3.2, Table 3 and App. D.1 (set-up and schedule).
    J. M. Hernández-Lobato, R. Adams. *Probabilistic Backpropagation*. ICML 2015 (the split format).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyro
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..data import load_breast_cancer_split, load_diabetes_split, load_digits_split, load_uci_split
from ..data.uci import num_uci_splits, uci_split_files
from ..metrics import (
    categorical_nll,
    error_rate,
    expected_calibration_error,
    gaussian_mnll,
    mean_and_standard_error,
    predictive_entropy,
    reliability_diagram,
    rmse,
)
from . import distributed
from .engine import Checkpoint, shard_size
from .methods import MethodSpec, Schedule, build_method, fit, parse_method, predictive_samples
from .noisy_sets import NOISE_FILE, noise_floor, read_noise_std
from .reporting import check_writable, draw_reliability, save_tables, write_atomic

__all__ = [
    "BUNDLED_DATASETS",
    "UCIConfig",
    "UCIData",
    "data_key",
    "load_dataset_split",
    "parse_splits",
    "run_uci",
    "summarize",
]

BUNDLED_DATASETS = ("diabetes", "breast_cancer", "digits")
MAX_SPLITS = 1000  # more in one --splits is a typo (0-100000000), not a plan
REGRESSION_METRICS = ("rmse", "mnll")
# Bumped when a method's construction changes, so that its stored splits are trained again.
_VERSIONS = {name: 2 for name in ("whvi", "nf-whvi", "whvi+iblm", "nf-whvi+iblm")}
CLASSIFICATION_METRICS = ("error", "nll", "ece", "entropy")
# With a known noise level (a folder written by pyro_whvi.experiments.noisy_sets): test MNLL minus the best
# possible, test RMSE over the noise's sigma (1 at best) and the estimated noise scale over sigma.
FLOOR_METRICS = ("mnll_gap", "rmse_ratio", "noise_ratio")
FLOOR_LABELS = {"mnll_gap": "MNLL - floor", "rmse_ratio": "RMSE / σ", "noise_ratio": "noise / σ"}
# Bumped when the training loop changes every method's numbers. 2: pyro_whvi.experiments.engine (the noise scale's
# Adam state no longer starts from the gradient summed over the fixed-noise phase).
ENGINE_VERSION = 2
_NOT_FINGERPRINTED = ("methods", "splits", "checkpoint_every", "progress")


@dataclass
class UCIData:
    """One split; ``y_scale`` turns standardized regression targets back into original units."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str  # "regression" or "classification"
    y_scale: float = 1.0
    num_classes: int = 1


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


def parse_splits(text: str) -> tuple[int, ...]:
    """``"0-4"`` -> (0, 1, 2, 3, 4); ``"0,2,5"`` -> (0, 2, 5); a ``ValueError`` for anything else,
    a range that runs backwards included, or more than :data:`MAX_SPLITS` splits."""
    splits: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            start, stop = int(first), int(last or first) + 1
        except ValueError:
            start = stop = -1
        if not 0 <= start < stop:
            raise ValueError(f"splits must look like '0-4' or '0,2,5' (non-negative, ranges upwards), got {text!r}")
        if len(splits) + stop - start > MAX_SPLITS:
            raise ValueError(f"at most {MAX_SPLITS} splits expected, got {text!r}")
        splits.extend(range(start, stop))
    return tuple(dict.fromkeys(splits))


def _bundled(source: str | Path) -> bool:
    return isinstance(source, str) and source in BUNDLED_DATASETS


def dataset_name(source: str | Path) -> str:
    """The name results are filed under: the bundled set's, or the folder's (``.`` named after itself)."""
    return str(source) if _bundled(source) else Path(source).resolve().name


def data_key(source: str | Path, split: int) -> str:
    """What identifies split ``split``'s data: the bundled set's name, or the folder's resolved path and
    a hash of the files the split is read from, so that an edited or another folder is not mistaken for it."""
    if _bundled(source):
        return str(source)
    digest = hashlib.sha256()
    for file in uci_split_files(source, split):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return f"{Path(source).resolve()}:{digest.hexdigest()}"


def check_source(source: str | Path, splits: tuple[int, ...]) -> None:
    """A ``ValueError``/``FileNotFoundError`` naming the problem when ``source`` cannot provide ``splits``:
    every requested split of a folder is loaded and validated (:func:`~pyro_whvi.data.load_uci_split`)."""
    if _bundled(source):
        return
    available = num_uci_splits(source)  # raises for a missing directory or files
    missing = [k for k in splits if k >= available]
    if missing:
        listed = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        has = f"splits 0-{available - 1}" if available else "no index_train_<k>.txt"
        raise ValueError(f"{source} has {has}; asked for {listed}")
    for split in splits:
        load_uci_split(source, split)
    read_noise_std(source)  # a damaged noise_std.txt is reported now, not after training


def load_dataset_split(source: str | Path, split: int) -> UCIData:
    """Split ``split`` of a UCI-format directory or a bundled scikit-learn set (see the module doc)."""
    if source == "digits":
        digits = load_digits_split(seed=split)
        return UCIData(digits.x_train, digits.y_train, digits.x_test, digits.y_test, "classification", num_classes=10)
    if source == "breast_cancer":
        cancer = load_breast_cancer_split(seed=split)
        return UCIData(cancer.x_train, cancer.y_train, cancer.x_test, cancer.y_test, "classification", num_classes=2)
    data = load_diabetes_split(split) if source == "diabetes" else load_uci_split(source, split)
    return UCIData(data.x_train, data.y_train, data.x_test, data.y_test, "regression", y_scale=data.y_std)


def _evaluate(data: UCIData, f: torch.Tensor, noise_scale) -> dict[str, float]:
    if data.task == "regression":
        scale = data.y_scale
        return {
            "rmse": rmse(f, data.y_test) * scale,
            "mnll": gaussian_mnll(f, noise_scale, data.y_test) + math.log(scale),
            "noise_scale": float(noise_scale) * scale,
        }
    return {
        "error": float(error_rate(f, data.y_test)),
        "nll": float(categorical_nll(f, data.y_test)),
        "ece": float(expected_calibration_error(f, data.y_test)),
        "entropy": float(predictive_entropy(f).mean()),
    }


def run_split(
    source: str | Path, spec: MethodSpec, split: int, config: UCIConfig, checkpoint: Checkpoint | None = None
) -> tuple[dict[str, Any], dict]:
    """Train ``spec`` on split ``split``; return its row of metrics and, for classification, the
    reliability diagram's bins (``{"reliability": [confidence, accuracy, count]}``; no caching).

    In a process group every rank trains its shard and only rank 0 evaluates (the others return ``({}, {})``).
    """
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
    seconds = time.perf_counter() - start
    if distributed.rank() != 0:
        return {}, {}
    f = predictive_samples(model, guide, data.x_test, config.samples)
    noise = model.noise_scale.detach() if regression else None  # type: ignore[union-attr]
    extra = {} if regression else {"reliability": [t.tolist() for t in reliability_diagram(f, data.y_test)]}
    row = {
        "method": spec.name,
        "split": split,
        **_evaluate(data, f, noise),
        "final_loss": sum(losses[-100:]) / len(losses[-100:]),
        "variational_parameters": sum(p.numel() for p in guide.parameters()),
        "train_seconds": seconds,
    }
    return row, extra


def summarize(rows: list[dict[str, Any]], methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """Mean and standard error (sample std / sqrt(splits)) of every metric per method, in ``methods`` order."""
    summary = []
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        if not mine:
            continue
        entry: dict[str, Any] = {"method": method, "splits": len(mine), "parameters": mine[0]["variational_parameters"]}
        for metric in (*REGRESSION_METRICS, *FLOOR_METRICS, *CLASSIFICATION_METRICS, "train_seconds"):
            if metric in mine[0]:
                entry[metric], entry[metric + "_se"] = mean_and_standard_error(r[metric] for r in mine)
        summary.append(entry)
    return summary


def _table(name: str, summary: list[dict[str, Any]], config: UCIConfig) -> str:
    metrics = [m for m in (*REGRESSION_METRICS, *FLOOR_METRICS, *CLASSIFICATION_METRICS) if m in summary[0]]
    schedule = config.schedule
    fixed = min(schedule.fixed_noise_steps, schedule.steps)
    noise = f" (noise fixed for the first {fixed})" if "rmse" in metrics and fixed else ""
    lines = [
        f"### {name}: {config.layers}x{config.hidden} ReLU, {schedule.steps} steps{noise}, batch "
        f"{schedule.batch_size}, lr {schedule.lr:g}, {config.samples} test samples; mean ± standard error over splits",
        "",
        "| method | splits | variational params | "
        + " | ".join(FLOOR_LABELS.get(m, f"test {m.upper()}") for m in metrics)
        + " | s/split |",
        "|---|---|---|" + "---|" * len(metrics) + "---|",
    ]
    for e in summary:
        cells = " | ".join(f"{e[m]:.3f} ± {e[m + '_se']:.3f}" for m in metrics)
        lines.append(f"| {e['method']} | {e['splits']} | {e['parameters']:,} | {cells} | {e['train_seconds']:.0f} |")
    return "\n".join(lines)


def _with_floor(row: dict[str, Any], sigma: float) -> dict[str, Any]:
    """``row`` with its distance to the floor that a known noise level ``sigma`` sets."""
    floor = noise_floor(sigma)
    return {
        **row,
        "mnll_gap": row["mnll"] - floor["mnll_floor"],
        "rmse_ratio": row["rmse"] / sigma,
        "noise_ratio": row["noise_scale"] / sigma,
    }


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
    sigma = None if _bundled(source) else read_noise_std(source)
    if sigma is not None:
        rows = [_with_floor(row, sigma) for row in rows]
    summary = summarize(rows, config.methods)
    text = _table(name, summary, config)
    if sigma is not None:
        floor = noise_floor(sigma)
        text += (
            f"\n\nKnown noise σ = {sigma:.4g} ({NOISE_FILE}): the best possible test RMSE is σ and the best test MNLL "
            f"{floor['mnll_floor']:.3f}."
        )
    meta = {"dataset": str(source), "config": json.loads(json.dumps(asdict(config), default=str)), "splits": rows}
    save_tables(out, f"uci_{name}", meta, summary, text)
    if reliability:
        _plot_reliability(out / f"uci_{name}_reliability.png", reliability)
    return summary, text


def _plot_reliability(path: Path, reliability: dict[str, list]) -> None:
    """Reliability diagrams pooled over splits (bin counts added, confidences and accuracies count-weighted)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots need the [bench] extra; the tables are written regardless
        return
    fig, axes = plt.subplots(1, len(reliability), figsize=(3.4 * len(reliability), 3.4), squeeze=False)
    for ax, (method, splits) in zip(axes[0], reliability.items()):
        bins = torch.tensor(splits, dtype=torch.float64).nan_to_num(0.0)  # (splits, 3, bins)
        count = bins[:, 2].sum(0)
        pooled = count.clamp_min(1)  # empty bins are not drawn
        confidence = (bins[:, 0] * bins[:, 2]).sum(0) / pooled
        accuracy = (bins[:, 1] * bins[:, 2]).sum(0) / pooled
        draw_reliability(ax, confidence, accuracy, count, f"{method} ({len(splits)} splits)")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, image.getvalue())

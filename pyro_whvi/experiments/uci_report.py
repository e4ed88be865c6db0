"""The report of ``whvi uci``: mean and standard error over splits, the markdown table, the distance to a
known noise floor, and the pooled reliability diagrams of classification runs."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..metrics import (
    categorical_nll,
    error_rate,
    expected_calibration_error,
    gaussian_mnll,
    predictive_entropy,
    rmse,
)
from .auto_narrow import SCORE_RULE
from .methods import parse_method
from .noisy_sets import noise_floor
from .reporting import draw_reliability, summarize_by, write_atomic
from .uci_protocols import BY_RESIDUALS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .uci_config import UCIConfig
    from .uci_data import UCIData

__all__ = [
    "CLASSIFICATION_METRICS",
    "FLOOR_METRICS",
    "REGRESSION_METRICS",
    "choices_text",
    "evaluate",
    "plot_reliability",
    "summarize",
    "summary_table",
    "with_floor",
]

REGRESSION_METRICS = ("rmse", "mnll")
CLASSIFICATION_METRICS = ("error", "nll", "ece", "entropy")
# With a known noise level (a folder written by pyro_whvi.experiments.noisy_sets): test MNLL minus the best
# possible, test RMSE over the noise's sigma (1 at best) and the estimated noise scale over sigma.
FLOOR_METRICS = ("mnll_gap", "rmse_ratio", "noise_ratio")
FLOOR_LABELS = {"mnll_gap": "MNLL - floor", "rmse_ratio": "RMSE / σ", "noise_ratio": "noise / σ"}


def evaluate(
    data: UCIData,
    f: torch.Tensor,
    noise_scale: torch.Tensor | float | None,
    noise_weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """A split's test metrics from predictive samples ``f`` (regression in the original units).

    :param noise_scale: the Gaussian noise's standard deviation: one, or one per sample and test point (an
        ensemble's mean-variance heads, ``(M, N)`` like ``f``), whose root mean square the row reports as
        ``noise_scale``; ``None`` for classification, which has no noise.
    :param noise_weights: a scale mixture's weights (:func:`~pyro_whvi.metrics.gaussian_mnll`; ``noise_scale`` then
        has a leading axis of components, and the row reports the first's)."""
    if data.task == "regression":
        if noise_scale is None:
            raise ValueError("evaluate: a regression split needs noise_scale (the predictive's noise), got None")
        scale = data.y_scale
        mnll = gaussian_mnll(f, noise_scale, data.y_test, noise_weights) + math.log(scale)
        noise = torch.as_tensor(noise_scale)
        noise = noise if noise_weights is None else noise[0]
        return {
            "rmse": rmse(f, data.y_test) * scale,
            "mnll": mnll,
            "noise_scale": (float(noise) if noise.numel() == 1 else float(noise.pow(2).mean().sqrt())) * scale,
        }
    return {
        "error": float(error_rate(f, data.y_test)),
        "nll": float(categorical_nll(f, data.y_test)),
        "ece": float(expected_calibration_error(f, data.y_test)),
        "entropy": float(predictive_entropy(f).mean()),
    }


def summarize(rows: list[dict[str, Any]], methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """Mean and standard error (sample std / sqrt(splits)) of every metric per method, in ``methods`` order."""
    metrics = (*REGRESSION_METRICS, *FLOOR_METRICS, *CLASSIFICATION_METRICS, "train_seconds")
    present = tuple(metric for metric in metrics if rows and metric in rows[0])
    by_method = {entry["method"]: entry for entry in summarize_by(rows, ("method",), present)}
    summary = []
    for method in (m for m in methods if m in by_method):
        entry = by_method[method]
        parameters = next(r["variational_parameters"] for r in rows if r["method"] == method)
        statistics = {k: v for k, v in entry.items() if k not in ("method", "runs")}
        summary.append({"method": method, "splits": entry["runs"], "parameters": parameters, **statistics})
    return summary


def summary_table(name: str, summary: list[dict[str, Any]], config: UCIConfig) -> str:
    metrics = [m for m in (*REGRESSION_METRICS, *FLOOR_METRICS, *CLASSIFICATION_METRICS) if m in summary[0]]
    schedule = config.schedule
    fixed = min(schedule.fixed_noise_steps, schedule.steps)
    regression = "rmse" in metrics
    heads = [e["method"] for e in summary if regression and config.likelihood_of(e["method"]) == "heteroscedastic"]
    every_head = len(heads) == len(summary)  # then no noise scale to hold
    noise = f" (noise fixed for the first {fixed})" if regression and fixed and not every_head else ""
    targets = ", raw targets" if regression and not config.standardize_targets else ""
    checked = [e["method"] for e in summary if regression and config.likelihood_of(e["method"]) == BY_RESIDUALS]
    if heads:
        which = "" if every_head else f" for {', '.join(heads)} (one noise scale for the others)"
        targets += f", mean-variance heads (heteroscedastic likelihood){which}"
    if checked:
        targets += f", the likelihood chosen per split on the training residuals for {', '.join(checked)}"
    weights = config.kl_weights
    tempered = f", KL weight {weights[0]:g} (tempered)" if weights != (1.0,) else ""
    held_out = f"on {config.val_fraction * 100:g}% of each split's training rows"
    if len(weights) > 1:
        candidates = ", ".join(f"{weight:g}" for weight in weights)
        tempered = f", KL weight chosen from {candidates} {held_out}"
    if any(parse_method(e["method"]).base == "mcd" for e in summary):
        rates = ", ".join(f"{rate:g}" for rate in config.dropouts)
        several = len(config.dropouts) > 1
        tempered += f", MC dropout's rate chosen from {rates} {held_out}" if several else f", MC dropout rate {rates}"
    cooldown = _cooled(schedule.cooldown)
    device = f", trained on {config.device}" if config.device != "cpu" else ""
    network = f"{config.layers}x{config.hidden} ReLU, {schedule.steps} steps{noise}, batch {schedule.batch_size}, "
    network += f"lr {schedule.lr:g}"
    if config.protocols:
        choices = ", ".join(
            f"{p['name']} ({p['layers']}x{p['hidden']}, {p['steps']} steps, lr {p['lr']:g}{_cooled(p['cooldown'])})"
            for p in config.protocols
        )
        cooldown = ""  # each candidate's own
        rule = (
            " (the first whose noise factor there is at most 1, else the last)"
            if config.choose_by != SCORE_RULE
            else ""
        )
        network = f"ReLU, protocol chosen per split from {choices} {held_out}{rule}"
        network += "".join(f"; {p['name']} for {m}" for m, p in config.method_protocols if not config.protocol)
        network += f"; noise fixed for the first {fixed} steps" if noise else ""
        network += f", batch {schedule.batch_size}"
    if config.protocol:
        network = (
            f"protocol {config.protocol}; {network}" if config.protocols else f"protocol {config.protocol}, {network}"
        )
    lines = [
        f"### {name}: {network}{cooldown}, {config.samples} test samples{targets}{tempered}"
        f"{device}; mean ± standard error over splits",
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


def _cooled(cooldown: float) -> str:
    return f" cooled down over the last {cooldown * 100:g}% of steps" if cooldown else ""


def with_floor(row: dict[str, Any], sigma) -> dict[str, Any]:
    """``row`` with its distance to the floor that a known noise level ``sigma`` sets: one, or one per test row
    (:func:`~pyro_whvi.experiments.noisy_sets.split_noise_std`), whose root mean square the ratios divide by."""
    floor = noise_floor(sigma)
    return {
        **row,
        "mnll_gap": row["mnll"] - floor["mnll_floor"],
        "rmse_ratio": row["rmse"] / floor["rmse_floor"],
        "noise_ratio": row["noise_scale"] / floor["rmse_floor"],
    }


def plot_reliability(path: Path, reliability: dict[str, list]) -> None:
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


def _choice(row: dict[str, Any], config: UCIConfig) -> str:
    weight = f"{row['kl_weight']:g}" if len(config.kl_weights) > 1 else ""
    rate = f"dropout {row['dropout']:g}" if "dropout" in row else ""
    tried = row.get("noise_factors", {})  # under choose_by "noise-factor": each candidate tried and its factor
    factors = f"({', '.join(f'{label} {factor:.3g}' for label, factor in tried.items())})" if tried else ""
    return " ".join(filter(None, [row.get("protocol", "") if config.protocols else "", weight, rate, factors]))


def _per_method(rows: list[dict[str, Any]], methods: tuple[str, ...], key: str, shown) -> str:
    """``method: shown(row), ...; ...`` over the methods with a row that has ``key``."""
    return "; ".join(
        f"{method}: " + ", ".join(shown(row) for row in rows if row["method"] == method and key in row)
        for method in methods
        if any(row["method"] == method and key in row for row in rows)
    )


def choices_text(rows: list[dict[str, Any]], config: UCIConfig, gain_threshold: float) -> str:
    """The summary's notes on what each split chose: its candidate (``config.choosing``), its likelihood (the rows
    with a ``noise_gain``, and their ``spread_share`` where they have one; ``gain_threshold`` the gain that trains the
    head) and its noise's calibration factor (the methods ``config.calibrates``; "–" where a split kept one noise
    scale uncalibrated under by-residuals), each a paragraph after two newlines; ``""`` if none."""
    text = ""
    if config.choosing:
        parts = ["protocol"] * bool(config.protocols) + ["KL weight"] * (len(config.kl_weights) > 1)
        what = " and ".join(parts + ["MC dropout's rate"] * (len(config.dropouts) > 1))
        text += f"\n\n{what[0].upper()}{what[1:]} chosen per split on validation: " + "; ".join(
            f"{method}: " + ", ".join(_choice(row, config) for row in rows if row["method"] == method)
            for method in config.methods
            if config.for_method(method).choosing
        )
    likelihoods = _per_method(
        rows,
        config.methods,
        "noise_gain",
        lambda row: (
            f"{'head' if row['likelihood'] == 'heteroscedastic' else 'one scale'} ({row['noise_gain']:.3f}"
            + (f", {row['spread_share']:.2f}" if "spread_share" in row else "")
            + ")"
        ),
    )
    if likelihoods:
        text += (
            "\n\nLikelihood chosen per split on the training residuals (one noise scale, the mean-variance head where "
            f"a variance model of the inputs gains {gain_threshold} nats a row; the gain, and q's spread of f as a "
            f"share of one noise scale's variance): {likelihoods}"
        )
    calibrating = tuple(method for method in config.methods if config.calibrates(method))
    factors = _per_method(
        rows, calibrating, "split", lambda row: f"{row['noise_factor']:.3g}" if "noise_factor" in row else "–"
    )
    if factors:
        text += (
            "\n\nNoise calibrated per split on held-out training rows (--calibrate-noise: the predictive keeps a "
            "weight of 1/(held-out rows + 2) on the learned noise; the factor of the rest"
            + ("; – where the split kept one noise scale uncalibrated, under by-residuals" if "–" in factors else "")
            + f"): {factors}"
        )
    return text

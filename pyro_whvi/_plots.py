"""Drawing shared by the command line's outputs (matplotlib is imported by the callers)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

__all__ = ["draw_reliability"]


def draw_reliability(ax: Any, confidence: Tensor, accuracy: Tensor, count: Tensor, title: str) -> None:
    """A reliability diagram on ``ax``: one bar per non-empty confidence bin, and the diagonal."""
    keep = count > 0
    ax.plot([0, 1], [0, 1], "k--", lw=1)
    ax.bar(confidence[keep], accuracy[keep], width=1 / len(count), alpha=0.6, edgecolor="C0")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
    ax.set_title(title, fontsize=9)

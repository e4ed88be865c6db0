"""Exact references shared by the tests."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch


def scipy_hadamard(size: int) -> torch.Tensor:
    """scipy's Walsh–Hadamard matrix scaled to be orthonormal."""
    return torch.from_numpy(scipy.linalg.hadamard(size).astype(np.float64)) / np.sqrt(size)


def dense_weight(s1: torch.Tensor, g: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """W = diag(s1) H diag(g) H diag(s2) for a shared g, or a batch of W (one per row of g)."""
    hadamard = scipy_hadamard(s1.shape[-1]).to(s1.dtype)
    return s1[..., :, None] * (hadamard * g[..., None, :]) @ hadamard * s2[..., None, :]

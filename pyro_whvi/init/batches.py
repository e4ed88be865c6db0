"""Minibatches for I-BLM from a tensor pair or a ``DataLoader``, with the data checked on the way."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["BatchStream"]


class BatchStream:
    """Minibatches ``(x, y)`` from a tensor pair (random subsets) or from an iterable such as a ``DataLoader``."""

    def __init__(self, data, batch_size: int):
        if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
            x, y = data
            if x.shape[0] != y.shape[0] or x.shape[0] == 0:
                raise ValueError(
                    f"iblm_: data must be (x, y) with the same number of rows > 0, got {x.shape[0]} and {y.shape[0]}."
                )
            self._check(x, y)
            self.tensors: tuple[Tensor, Tensor] | None = (x, y)
            self.batch_size = min(int(batch_size), x.shape[0])
        elif isinstance(data, Iterable) and not isinstance(data, Tensor):
            self.tensors, self._loader, self._iterator = None, data, iter(data)
            first = self._next_loader_batch()
            self.batch_size = first[0].shape[0]
            self._pending: list[tuple[Tensor, Tensor]] = [first]
        else:
            raise TypeError(f"iblm_: data must be a pair (x, y) of tensors or a DataLoader, got {type(data).__name__}.")

    @staticmethod
    def _check(x: Tensor, y: Tensor) -> None:
        for name, value in (("x", x), ("y", y)):
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise ValueError(f"iblm_: the data's {name} contains NaN or Inf; clean or impute it first.")

    def _next_loader_batch(self) -> tuple[Tensor, Tensor]:
        try:
            batch = next(self._iterator)
        except StopIteration:
            self._iterator = iter(self._loader)
            try:
                batch = next(self._iterator)
            except StopIteration:
                raise ValueError("iblm_: the DataLoader yields no batches.") from None
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise ValueError("iblm_: each batch of the DataLoader must be a pair (x, y).")
        x, y = batch
        self._check(x, y)
        return x, y

    def take(self, count: int) -> tuple[Tensor, Tensor]:
        """``count`` minibatches of ``batch_size`` examples, concatenated."""
        if self.tensors is not None:
            x, y = self.tensors
            index = torch.cat([torch.randperm(x.shape[0], device=x.device)[: self.batch_size] for _ in range(count)])
            return x[index], y[index]
        batches: list[tuple[Tensor, Tensor]] = []
        while len(batches) < count:
            batch = self._pending.pop() if self._pending else self._next_loader_batch()
            if batch[0].shape[0] >= self.batch_size:  # a short last batch is skipped
                batches.append((batch[0][: self.batch_size], batch[1][: self.batch_size]))
        return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])

"""Old import paths kept for one release: they still work, with a ``DeprecationWarning`` naming the new one.

A moved module's old file calls :func:`alias_module`, which puts the new module in its place in
``sys.modules`` (so ``import old.path`` and ``from old.path import name`` give the very same objects,
private names included); a module that lost some of its names uses :func:`moved_names` as its
module-level ``__getattr__``.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["alias_module", "moved_names"]


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} has moved to {new}; import it from there ({old} will be removed in the next release).",
        DeprecationWarning,
        stacklevel=3,
    )


def alias_module(old_name: str, new_name: str) -> None:
    """Make the module ``old_name`` an alias of ``new_name``, warning once per import of the old path."""
    _warn(old_name, new_name)
    sys.modules[old_name] = importlib.import_module(new_name)


def moved_names(old_module: str, new_homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the names that moved from ``old_module``: ``{name: new module}``."""
    homes = dict(new_homes)

    def __getattr__(name: str) -> Any:
        if name in homes:
            _warn(f"{old_module}.{name}", f"{homes[name]}.{name}")
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {old_module!r} has no attribute {name!r}")

    return __getattr__

"""Moved to :mod:`pyro_whvi.train.engine` (the library's training package); this path works for one release,
with a ``DeprecationWarning``."""

from .._moved import alias_module

alias_module(__name__, "pyro_whvi.train.engine")

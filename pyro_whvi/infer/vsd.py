"""Moved to :mod:`pyro_whvi.infer.vsd_reparam` (the modules of each family have symmetric names); this path works
for one release, with a ``DeprecationWarning``."""

from .._moved import alias_module

alias_module(__name__, "pyro_whvi.infer.vsd_reparam")

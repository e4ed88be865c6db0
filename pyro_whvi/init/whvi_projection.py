"""Moved to :mod:`pyro_whvi.distributions.whvi_projection` (the fits live with their family); this path
works for one release, with a ``DeprecationWarning``."""

from .._moved import alias_module

alias_module(__name__, "pyro_whvi.distributions.whvi_projection")

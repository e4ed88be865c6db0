"""What :func:`~pyro_whvi.iblm_` and :func:`~pyro_whvi.xavier_normal_` need of a guide: two methods that set
one site's ``q`` in place, each in the guide's own family.

:class:`~pyro_whvi.AutoWHVIGuide` and :class:`~pyro_whvi.AutoVSDGuide` have them (their mean-field sites as
Pyro's ``AutoNormal`` has them, their structured sites by a fit to their family); Pyro's ``AutoNormal`` gets
them here, from the adapter below, the one place in :mod:`pyro_whvi.init` that knows a guide's classes. Any
other guide takes part by implementing :class:`SiteInitializer`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pyro.infer.autoguide import AutoNormal
from torch import Tensor

from ..infer._base import set_mean_field_gaussian_, set_mean_field_isotropic_

__all__ = ["SiteInitializer", "site_initializer"]


@runtime_checkable
class SiteInitializer(Protocol):
    """A guide that sets one latent site's ``q`` in place (see ``StructuredAutoGuide.set_site_gaussian_`` and
    ``set_site_isotropic_`` for the meaning of the arguments)."""

    def set_site_gaussian_(
        self,
        site: str,
        mean: Tensor,
        precision: Tensor,
        *,
        data_precision: Tensor | None = None,
        data_rhs: Tensor | None = None,
    ) -> None:
        """Its family's approximation of a Gaussian over the site's value (diagonal ``precision``)."""

    def set_site_isotropic_(self, site: str, variance: float) -> None:
        """An uninformed start whose entries have variance ``variance`` about zero."""


class _AutoNormalSites:
    """Pyro's ``AutoNormal`` as a :class:`SiteInitializer`: every latent site has a mean-field Normal."""

    def __init__(self, guide: AutoNormal):
        self.guide = guide

    def set_site_gaussian_(self, site, mean, precision, *, data_precision=None, data_rhs=None) -> None:
        what = f"{type(self.guide).__name__}.set_site_gaussian_({site!r})"
        set_mean_field_gaussian_(self.guide, site, mean, precision, what)

    def set_site_isotropic_(self, site: str, variance: float) -> None:
        set_mean_field_isotropic_(
            self.guide, site, variance, f"{type(self.guide).__name__}.set_site_isotropic_({site!r})"
        )


def site_initializer(guide, caller: str) -> SiteInitializer:
    """``guide`` itself if it is a :class:`SiteInitializer`, Pyro's ``AutoNormal`` through an adapter, else a
    ``TypeError`` (starting with ``caller``) that says which guides are supported."""
    if isinstance(guide, SiteInitializer):
        return guide
    if isinstance(guide, AutoNormal):
        return _AutoNormalSites(guide)
    raise TypeError(
        f"{caller}: {type(guide).__name__} is not supported; pass an AutoNormal, AutoWHVIGuide or AutoVSDGuide, "
        "or a guide with the methods set_site_gaussian_(site, mean, precision, *, data_precision=None, "
        "data_rhs=None) and set_site_isotropic_(site, variance) (pyro_whvi.init.guide_protocol.SiteInitializer)."
    )

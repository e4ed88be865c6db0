"""What the model transform (:class:`~pyro_whvi.infer.model_transform.ModelTransform`) needs of a structured
guide: the typed contract between the two, so that neither reads the other's private state.

:class:`~pyro_whvi.AutoWHVIGuide` and :class:`~pyro_whvi.AutoVSDGuide` implement it through their common base
(``pyro_whvi/infer/_base.py``); a new structured guide implements the same members, and
:class:`pyro_whvi.testing.StructuredGuideTestCase` checks it end to end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

__all__ = ["TransformingGuide"]


class TransformingGuide(Protocol):
    """A guide whose model is transformed in place: it picks its structured sites and replaces them in the model."""

    @property
    def structured_sites(self) -> dict[str, Any] | None:
        """``{weight site: its layout or site description}`` once chosen, else ``None``."""

    @property
    def model_site_shapes(self) -> dict[str, Any] | None:
        """The shape of each structured site in the user's model (checked at every run), once known."""

    @property
    def prototype_trace(self) -> Any:
        """Pyro's prototype trace of the guide (``None`` before its set-up)."""

    @property
    def init_loc_fn(self) -> Callable:
        """Pyro's initialization strategy for the mean-field sites, applied while the prototype is traced."""

    @property
    def in_setup(self) -> bool:
        """Whether the guide is tracing its prototype now (the transform then applies ``init_loc_fn``)."""

    def select_sites(self, original_model: Callable, *args: Any, **kwargs: Any) -> None:
        """Choose the structured sites from one run of the untransformed model."""

    def auxiliary_model_sites(self) -> Iterable[str]:
        """The sites the transformed model adds (e.g. ``<weight>_whvi_g``), which the guide samples."""

    def replace_model_site(self, msg: dict) -> None:
        """Rewrite a structured weight site's message in the transformed model."""

    def guide_site(self, weight_site: str) -> str:
        """The site the guide samples for a structured weight site."""

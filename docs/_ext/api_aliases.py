"""Resolve references to re-exported names (``pyro_whvi.AutoWHVIGuide``) to where they are documented.

The API reference documents every object once, in the module that defines it
(``pyro_whvi.infer.whvi_guide.AutoWHVIGuide``); the docstrings refer to the public, re-exported names
(``:class:`~pyro_whvi.AutoWHVIGuide```, ``:class:`KLAnnealing``` from inside ``pyro_whvi.infer``).
On ``missing-reference`` this imports the target (only names under ``pyro_whvi``), finds the object's
defining module and qualified name, and links there if that is documented. A reference that still
does not resolve stays a warning (the docs build treats warnings as errors).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from docutils import nodes

PACKAGE = "pyro_whvi"
_MISSING = object()


def _lookup(path: str) -> Any:
    parts = path.split(".")
    if parts[0] != PACKAGE:
        return _MISSING
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _canonical(obj: Any) -> str | None:
    if inspect.ismodule(obj):
        return obj.__name__
    if isinstance(obj, property) and obj.fget is not None:
        obj = obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        return f"{module}.{qualname}"
    return None


def _candidates(target: str, module: str | None, cls: str | None) -> list[str]:
    target = target.lstrip(".")
    if target.startswith(PACKAGE + ".") or target == PACKAGE:
        return [target]
    scopes = []
    if module and cls:
        scopes.append(f"{module}.{cls}")
    if module:
        parts = module.split(".")
        scopes.extend(".".join(parts[:cut]) for cut in range(len(parts), 0, -1))
    return [f"{scope}.{target}" for scope in scopes]


def _documented_name(domain, candidate: str) -> str | None:
    objects = domain.objects
    if candidate in objects or candidate in domain.modules:
        return candidate
    obj = _lookup(candidate)
    if obj is _MISSING:
        return None
    canonical = _canonical(obj)
    if canonical and (canonical in objects or canonical in domain.modules):
        return canonical
    # Module-level data (no __qualname__): the documented name whose value is this very object.
    if not inspect.isclass(obj) and not callable(obj) and not inspect.ismodule(obj):
        leaf = candidate.rsplit(".", 1)[-1]
        for name in objects:
            if name.rsplit(".", 1)[-1] == leaf and _lookup(name) is obj:
                return name
    return None


def _missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    for candidate in _candidates(node["reftarget"], node.get("py:module"), node.get("py:class")):
        name = _documented_name(domain, candidate)
        if name is None:
            continue
        role = "mod" if node["reftype"] == "mod" or name in domain.modules else "obj"
        resolved = domain.resolve_xref(env, node["refdoc"], app.builder, role, name, node, contnode)
        if isinstance(resolved, nodes.Element):
            return resolved
    # No module context (an autosummary table's summary line) or a name from a sibling module: the
    # one documented object whose dotted name ends with the target, if there is exactly one.
    target = node["reftarget"].lstrip(".")
    if not target.startswith(PACKAGE + "."):
        suffix = "." + target
        found = [name for name in (*domain.objects, *domain.modules) if name.endswith(suffix)]
        found = [name for name in found if name.startswith(PACKAGE + ".")]
        if len(found) == 1:
            role = "mod" if found[0] in domain.modules else "obj"
            return domain.resolve_xref(env, node["refdoc"], app.builder, role, found[0], node, contnode)
    return None


def setup(app):
    app.connect("missing-reference", _missing_reference)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}

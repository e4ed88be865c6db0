"""Sphinx configuration of the pyro_whvi documentation (`make docs`).

Pages are MyST Markdown; the API reference is generated from the docstrings (autodoc + autosummary,
stubs in ``api/generated/``); the tutorials are rendered from ``tutorials/*.py`` without running them
(``_ext/tutorial_pages.py``). Figures stay where the repository keeps them (``benchmarks/results/``,
``tutorials/figures/``) and are referenced by relative path; Sphinx copies them into ``_images/``.
The build needs neither a GPU nor the optional extras (GPflow, TensorFlow, Lightning are mocked).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(REPO))

import pyro_whvi  # noqa: E402

project = "pyro_whvi"
author = "pyro_whvi developers"
copyright = "pyro_whvi developers"
release = pyro_whvi.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
    "sphinx_copybutton",
    "tutorial_pages",
    "api_aliases",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "_ext", "_templates/**"]
templates_path = ["_templates"]

# -- checks: every reference we write must resolve -----------------------------------------------------------
nitpicky = True
# Names outside this project: no intersphinx (the build runs offline), so references to them stay text.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|pyro|gpytorch|numpy|np|scipy|sklearn|gpflow|tensorflow|lightning|triton|matplotlib)(\..*)?"),
    (r"py:.*", r"(typing|collections|collections\.abc|pathlib|os|io|json|dataclasses|enum|contextlib)\..*"),
    (r"py:.*", r"(abc|argparse|concurrent|multiprocessing|threading|subprocess|types|functools)\..*"),
    (r"py:class", r"(Tensor|Module|Parameter|Distribution|TorchDistribution|Path|Callable|Iterable|Iterator)"),
    (r"py:class", r"(Sequence|Mapping|Any|Optional|Union|Literal|Self|TypeVar|Generator|PathLike|Enum)"),
    (r"py:class", r"(int|float|bool|str|bytes|dict|list|tuple|set|frozenset|object|type|slice|complex|None)"),
    (r"py:class", r"(NoneType|Ellipsis|EllipsisType|ModuleType|FunctionType|Exception|RuntimeError)"),
    (r"py:class", r"(ValueError|TypeError|Warning|UserWarning|RuntimeWarning)"),
    (r"py:class", r"(optional|callable|array-like|default|iterable)"),
    (r"py:.*", r"(datetime|contextvars|fcntl|signal|socket|tempfile|hashlib)\..*"),
    (r"py:class", r"(PyroModule|PyroSample|PyroParam|Planar|LinearOperator|LowRankRootLinearOperator|Interval)"),
    (r"py:class", r"(nn|F|dist)\..*"),
    # Type aliases and type variables in signatures (site_selection.SiteFilter, svgp.Covariance,
    # selection.Setting): not documented objects.
    (r"py:class", r"(SiteFilter|Covariance|pyro_whvi\.train\.selection\.Setting)"),
    # Private modules and classes (bases shown by show-inheritance, implementation notes).
    (r"py:.*", r"pyro_whvi(\.\w+)*\._\w+(\..*)?"),
    # Instance attributes the docstrings name but autodoc cannot document (set in __init__).
    (r"py:attr", r"(init_scale|inducing_points)"),
    # A public helper outside its module's __all__ (pyro_whvi.infer.model_transform).
    (r"py:func", r"last_layer_sites"),
]

# -- autodoc / autosummary -----------------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False
# Optional extras, imported lazily by the library; mocked so the build never needs them.
autodoc_mock_imports = ["gpflow", "tensorflow", "tensorflow_probability", "tf_keras", "lightning"]


def _moved_modules() -> list[str]:
    """Old module paths kept for one release (``pyro_whvi._moved.alias_module``): importing one gives the new
    module, which has its own page; the module template leaves them out."""
    import importlib
    import pkgutil
    import warnings

    moved = []
    for info in pkgutil.walk_packages(pyro_whvi.__path__, "pyro_whvi."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if importlib.import_module(info.name).__name__ != info.name:
                moved.append(info.name)
    return moved


def _module_constants() -> dict[str, list[tuple[str, bool]]]:
    """Module constants (``NOISE_FILE = ...``) that autodoc would leave out, by module.

    Sphinx documents module-level data only when it has a ``#:`` doc comment; the docstrings refer to
    many constants without one. The module template (``_templates/autosummary/module.rst``) adds an
    ``autodata`` for each upper-case name assigned at a module's top level that ``automodule`` does not
    already show; with its value unless that is long or holds objects (``<function ... at 0x...>``).
    """
    import ast
    import importlib
    import pkgutil

    from sphinx.pycode import ModuleAnalyzer

    names = ["pyro_whvi"]
    names += [info.name for info in pkgutil.walk_packages(pyro_whvi.__path__, "pyro_whvi.")]
    found: dict[str, list[tuple[str, bool]]] = {}
    for name in names:
        if any(part.startswith("_") for part in name.split(".")) or name in _moved_modules():
            continue
        module = importlib.import_module(name)
        source = Path(module.__file__).read_text(encoding="utf-8")
        assigned = []
        for node in ast.parse(source).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            assigned += [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper() and t.id[0] != "_"]
        attr_docs = {key[1] for key in ModuleAnalyzer.for_module(name).find_attr_docs() if key[0] == ""}
        public = getattr(module, "__all__", None)
        shown = {c for c in attr_docs if public is None or c in public}
        missing = [c for c in dict.fromkeys(assigned) if c not in shown]
        if missing:
            values = [repr(getattr(module, c)) for c in missing]
            found[name] = [(c, len(v) <= 100 and " at 0x" not in v) for c, v in zip(missing, values)]
    return found


autosummary_context = {"undocumented_constants": _module_constants(), "moved_modules": _moved_modules()}


def _skip_reexports(app, what, name, obj, skip, options):
    """Document a class or function once, on the page of the module that defines it.

    A module's ``__all__`` decides what its page shows, but names it imports and re-exports
    (``Schedule`` in ``experiments.engine``, the packages' ``__init__``) are left to their own module's
    page; references to the re-exported names still resolve there (``_ext/api_aliases.py``).
    """
    if what != "module":
        return None
    if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        return None
    # The module autodoc is documenting (Sphinx 9 keeps it on the current document).
    current = getattr(getattr(app.env, "current_document", None), "autodoc_module", None)
    defined_in = getattr(obj, "__module__", None)
    if current and isinstance(defined_in, str) and defined_in != current:
        return True
    return None


def _drop_type_docstrings(app, what, name, obj, options, lines):
    """An undocumented constant would show its type's docstring (``dict() -> new empty dictionary``)."""
    if what in ("data", "attribute") and lines:
        own = inspect.getdoc(type(obj)) or ""
        if "\n".join(lines).strip() == own.strip():
            lines.clear()


def setup(app):
    app.connect("autodoc-skip-member", _skip_reexports)
    app.connect("autodoc-process-docstring", _drop_type_docstrings)


# -- MyST ----------------------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# -- HTML ----------------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"pyro_whvi {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_theme_options = {"navigation_with_keys": True}
copybutton_prompt_text = r"\$ "
copybutton_prompt_is_regexp = True

"""The house rules of ``docs/development.md``, checked on the source: imports run one way through the layers
(ops -> distributions -> infer -> init -> nn -> gp -> train -> experiments; module-level, lazy and ``TYPE_CHECKING``
imports alike), modules stay small, and every old import path of a moved name still works for one release with a
``DeprecationWarning`` naming the new one."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

PACKAGE = ROOT / "pyro_whvi"

#: The layers, lowest first (``_csrc``: the kernel sources, ``cuda/``). A module may import its own layer and the ones
#: before it. ``_moved`` (the
#: deprecation aliases) and the top-level package are outside the order; ``metrics`` and ``data`` sit beside
#: ``ops``; ``testing`` is a leaf above the library.
LAYERS = ["_csrc", "ops", "metrics", "data", "distributions", "infer", "init", "nn", "gp", "train", "testing"]
LAYERS += ["experiments"]

#: Old module paths kept for one release, and where they point.
MOVED_MODULES = {
    "pyro_whvi.experiments.engine": "pyro_whvi.train.engine",
    "pyro_whvi.experiments.schedule": "pyro_whvi.train.schedule",
    "pyro_whvi.experiments.checkpoints": "pyro_whvi.train.checkpoints",
    "pyro_whvi.experiments.distributed": "pyro_whvi.train.distributed",
    "pyro_whvi.experiments.selection": "pyro_whvi.train.selection",
    "pyro_whvi.init.whvi_projection": "pyro_whvi.distributions.whvi_projection",
    "pyro_whvi.infer.autoguide": "pyro_whvi.infer.whvi_guide",
    "pyro_whvi.infer.reparam": "pyro_whvi.infer.whvi_reparam",
    "pyro_whvi.infer.vsd": "pyro_whvi.infer.vsd_reparam",
}

#: Old homes of single names kept for one release: (module, name, new module).
MOVED_NAMES = [
    ("pyro_whvi.init", "fit_whvi_mean", "pyro_whvi.distributions.whvi_projection"),
    ("pyro_whvi.init", "whvi_precision", "pyro_whvi.distributions.whvi_projection"),
    ("pyro_whvi.init", "cholesky_with_jitter", "pyro_whvi.distributions.qg_family"),
    ("pyro_whvi.init.assign", "fit_whvi_site", "pyro_whvi.distributions.whvi_projection"),
    ("pyro_whvi.init.assign", "project_onto_whvi", "pyro_whvi.distributions.whvi_projection"),
    ("pyro_whvi.init.assign", "fit_vsd_alpha", "pyro_whvi.distributions.householder"),
    ("pyro_whvi.infer.lazy_weight", "WHVIWeight", "pyro_whvi.infer.whvi_weight"),
    ("pyro_whvi.infer.lazy_weight", "VSDWeight", "pyro_whvi.infer.vsd_weight"),
    ("pyro_whvi.infer.whvi_guide", "PRESETS", "pyro_whvi.infer.site_selection"),
]


def _imports(path: Path, module: str) -> set[str]:
    """Every ``pyro_whvi`` module ``path`` imports, at any depth of its body, resolved to absolute names."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("pyro_whvi")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[: len(base) - node.level + 1]
                target = ".".join([*prefix, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.startswith("pyro_whvi"):
                found.add(target)
                found |= {f"{target}.{alias.name}" for alias in node.names}
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] in ("_moved", "__main__", "__init__"):
        return None
    return parts[1].removesuffix(".py")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def test_imports_run_one_way_through_the_layers():
    modules = _modules()
    upward = []
    for module, path in modules.items():
        if module in MOVED_MODULES:  # an alias of its new home, which may sit in a lower layer
            continue
        own = _layer(module)
        if own is None or own not in LAYERS:
            continue
        for target in _imports(path, module):
            other = _layer(target)
            if other in LAYERS and LAYERS.index(other) > LAYERS.index(own):
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(sorted(upward))


def test_the_layer_rule_catches_an_upward_import(tmp_path):
    """The check itself: an ``infer`` module importing ``init`` is found, lazily inside a function too."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from ..init.assign import assign_layer\n")
    imports = _imports(source, "pyro_whvi.infer.m")
    assert "pyro_whvi.init.assign" in imports
    assert LAYERS.index(_layer("pyro_whvi.init.assign")) > LAYERS.index(_layer("pyro_whvi.infer.m"))


def test_modules_stay_small():
    """TyXe's rule of small flat modules: none over ~300 lines (320 leaves room for a docstring's growth)."""
    large = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 320}
    assert not large, large


def _fresh_import(code: str) -> dict:
    """Run ``code`` in a new interpreter (nothing imported yet) and return the JSON it prints."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_moved_modules_still_import_with_a_warning_naming_the_new_path():
    code = f"""
import importlib, json, warnings
result = {{}}
for old, new in {MOVED_MODULES!r}.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and old in str(w.message)]
    result[old] = [module is importlib.import_module(new), messages]
print(json.dumps(result))
"""
    result = _fresh_import(code)
    for old, new in MOVED_MODULES.items():
        same, messages = result[old]
        assert same, f"{old} is not {new}"
        assert messages and new in messages[0], (old, messages)


@pytest.mark.slow
def test_moved_names_still_resolve_with_a_warning_naming_the_new_home():
    code = f"""
import importlib, json, warnings
result = []
for old, name, new in {MOVED_NAMES!r}:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(old), name)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    result.append([value is getattr(importlib.import_module(new), name), any(new in m for m in messages)])
print(json.dumps(result))
"""
    for (old, name, new), (same, warned) in zip(MOVED_NAMES, _fresh_import(code)):
        assert same and warned, (old, name, new)


def test_the_library_itself_uses_no_old_path():
    """Importing the library and the application touches no deprecated path (no DeprecationWarning of ours)."""
    code = """
import importlib, json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name in ["pyro_whvi", "pyro_whvi.gp", "pyro_whvi.train", "pyro_whvi.testing", "pyro_whvi.experiments.cli",
                 "pyro_whvi.experiments.uci", "pyro_whvi.experiments.demo", "pyro_whvi.experiments.gp",
                 "pyro_whvi.experiments.methods", "pyro_whvi.experiments.noisy_sets"]:
        importlib.import_module(name)
print(json.dumps([str(w.message) for w in caught if "has moved" in str(w.message)]))
"""
    assert _fresh_import(code) == []

"""A built wheel carries the kernel sources, so a non-editable install can compile them; the core dependencies
are the library's only."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contains_kernel_sources(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("pyro_whvi-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in ("fwht_cpu.cpp", "structured_cpu.cpp", "planar_cpu.cpp", "row_kernels.h"):
        assert f"pyro_whvi/_csrc/cpu/{source}" in names
    assert "pyro_whvi/_csrc/triton/kernels.py" in names
    assert "pyro_whvi/ops/__init__.py" in names


def test_the_library_does_not_depend_on_the_applications_packages():
    """scikit-learn (the bundled data sets) and matplotlib (plots) come with the ``experiments`` extra only."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=!~ ;\[]", requirement)[0].lower() for requirement in project["dependencies"]}
    assert not core & {"scikit-learn", "matplotlib"}, core
    assert {"scikit-learn>=1.3", "matplotlib>=3.7"} <= set(project["optional-dependencies"]["experiments"])


def test_bundled_data_sets_without_scikit_learn_name_the_extra(monkeypatch):
    from pyro_whvi.data import load_breast_cancer_split, load_diabetes_split, load_digits_split

    monkeypatch.setitem(sys.modules, "sklearn", None)  # what `import sklearn` meets when it is not installed
    for loader in (load_digits_split, load_diabetes_split, load_breast_cancer_split):
        with pytest.raises(ImportError, match=rf"{loader.__name__} .*pip install 'pyro_whvi\[experiments\]'"):
            loader()

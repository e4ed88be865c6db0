"""A built wheel carries the kernel sources, so a non-editable install can compile them."""

from __future__ import annotations

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
    for source in ("fwht_cpu.cpp", "structured_cpu.cpp", "row_kernels.h"):
        assert f"pyro_whvi/_csrc/cpu/{source}" in names
    assert "pyro_whvi/_csrc/triton/kernels.py" in names
    assert "pyro_whvi/ops/__init__.py" in names

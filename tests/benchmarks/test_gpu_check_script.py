"""``benchmarks/gpu_check.sh``, the one prepared GPU call, holds no error a CPU can find: its bash parses, and the
``whvi uci`` arguments it passes are ones the command accepts (an option it rejected once cost a device call)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

from ..helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_its_whvi_uci_arguments_are_accepted_on_both_devices():
    from pyro_whvi.experiments.cli import _parser

    text = SCRIPT.read_text()
    (array,) = re.findall(r"^uci_args=\((.*)\)$", text, flags=re.MULTILINE)
    steps = re.search(r"^steps=\$\(.*echo (\d+) \|\| echo (\d+)\)$", text, flags=re.MULTILINE)
    assert steps is not None, "the script's step counts moved: update this test"
    for device, count in (("cuda", steps.group(2)), ("cpu", steps.group(1))):
        argv = ["uci", "--device", device, *shlex.split(array.replace('"$steps"', count)), "--out", "somewhere"]
        args = _parser().parse_args(argv)  # argparse exits with status 2 on a rejected argument
        assert args.steps == int(count) and args.device == device

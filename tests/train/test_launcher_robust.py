"""The data-parallel launcher at the edges (issue 51): its ranks die with it, Ctrl-C stops them all in one line,
a rerun on a folder whose run is alive refuses in one line, and a rank's divergence reaches the caller typed.

Each test starts a launcher in a subprocess (its own session, as a terminal's job) with two gloo ranks that
train a tiny model with the engine, slowly enough to be caught mid-training.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from pyro_whvi.train import Schedule, TrainingDiverged, distributed, optimize
from pyro_whvi.train.folder_lock import FolderLocked, folder_lock

from ..helpers import ROOT, checkout_environment

pytestmark = pytest.mark.slow  # every test starts two ranks (a few seconds each to import torch)

# The launcher as `whvi uci --nproc 2` runs it: the folder locked, the ranks launched, an interrupt one line.
LAUNCHER = """
import sys
from pathlib import Path
from pyro_whvi.train import TrainingInterrupted, distributed
from pyro_whvi.train.folder_lock import folder_lock
from tests.train.test_launcher_robust import train_slowly

out = Path(sys.argv[1])
with folder_lock(out):
    try:
        distributed.launch(train_slowly, 2, str(out), 100_000, threads=1)
    except TrainingInterrupted as interrupted:
        print(f"interrupted at step {interrupted.step}; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
"""


class _EighthPower(torch.nn.Module):
    """A loss Adam minimizes at lr 1e-3 and overflows at lr 1e6 (its first step moves the weight by ~1e6)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x: torch.Tensor, y: torch.Tensor, num_data: int | None = None) -> torch.Tensor:
        return ((x @ self.weight - y) ** 8).mean()


def train_slowly(folder: str, steps: int, lr: float = 1e-3) -> int:
    """Train :class:`_EighthPower` for ``steps`` steps, recording this rank's pid and its steps done in ``folder``."""
    rank = distributed.rank()
    Path(folder, f"rank{rank}.pid").write_text(str(os.getpid()))
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 2, generator=generator), torch.randn(8, generator=generator)
    objective = _EighthPower()

    def record(step: int) -> None:
        Path(folder, f"rank{rank}.step").write_text(str(step))
        time.sleep(0.02)

    schedule = Schedule(steps=steps, fixed_noise_steps=0, batch_size=8, lr=lr)
    optimize(objective, x, y, schedule, warm_up=lambda *a, **k: None, callback=record, progress=False)
    return steps


def _start(out: Path, background: bool = False) -> subprocess.Popen[str]:
    """The launcher; ``background``: with SIGINT ignored, as a shell starts a job with ``&`` (the ranks inherit it,
    so torch's own parent-death signal, SIGINT, does not stop them)."""
    # A terminal's job starts with SIGINT at its default whatever its shell had; pytest run from a background job (CI
    # under nohup or `&`) has it ignored, which the launcher would inherit and keep (Python leaves an ignored SIGINT
    # ignored), so it is set either way.
    disposition = signal.SIG_IGN if background else signal.SIG_DFL
    set_sigint = lambda: signal.signal(signal.SIGINT, disposition)  # noqa: E731
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(LAUNCHER), str(out)],
        cwd=ROOT,
        env=checkout_environment(OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell's job: killpg reaches it and its ranks
        preexec_fn=set_sigint,
    )


def _ranks_training(out: Path, launcher: subprocess.Popen[str], steps: int = 3) -> list[int]:
    """Wait until both ranks have done ``steps`` steps; their pids."""
    deadline = time.monotonic() + 180  # two interpreters importing torch: slow on a loaded machine
    while True:
        assert launcher.poll() is None, launcher.communicate()
        with contextlib.suppress(OSError, ValueError):
            if all(int((out / f"rank{rank}.step").read_text()) >= steps for rank in (0, 1)):
                return [int((out / f"rank{rank}.pid").read_text()) for rank in (0, 1)]
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Whether any thread of ``pid`` is still running. A zombie is dead (it only waits for its parent to read its
    status), but a multithreaded process's main thread turns zombie while its other threads still tear down, and
    the open files (the folder lock among them) close only with the last: so every thread is looked at."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a thread gone while we read: looked at again on the next poll
        threads = Path(f"/proc/{pid}/task").iterdir()
        return any((thread / "stat").read_text().rsplit(")", 1)[-1].split()[0] not in "ZX" for thread in threads)
    return True


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _cleanup(launcher: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(launcher.pid, signal.SIGKILL)
    launcher.communicate()


@pytest.mark.parametrize("target", ["process_group", "launcher_alone"])
def test_ctrl_c_stops_every_rank_with_one_line(tmp_path, target):
    """Ctrl-C reaches the whole job (a terminal), or ``kill -INT`` the launcher alone: both end the same way."""
    launcher = _start(tmp_path)
    try:
        ranks = _ranks_training(tmp_path, launcher)
        if target == "process_group":
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            os.kill(launcher.pid, signal.SIGINT)
        _, stderr = launcher.communicate(timeout=30)  # the launcher gives its ranks 10 s, then kills them
    finally:
        _cleanup(launcher)
    assert launcher.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("interrupted at step ") and lines[0].endswith("; rerun the same command to resume")
    assert int(lines[0].split()[3].rstrip(";")) >= 3
    assert _gone_within(ranks, 5.0)


def test_killed_launcher_takes_its_ranks_and_the_folder_lock_refuses_a_rerun_meanwhile(tmp_path):
    launcher = _start(tmp_path, background=True)
    try:
        ranks = _ranks_training(tmp_path, launcher)
        with pytest.raises(FolderLocked) as refused, folder_lock(tmp_path):
            pass
        message = str(refused.value)
        assert "\n" not in message and f"{tmp_path} is in use by another run" in message
        assert str(launcher.pid) in message or all(str(pid) in message for pid in ranks), message
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        assert _gone_within(ranks, 5.0), "the ranks outlived their killed launcher"
    finally:
        _cleanup(launcher)
    with folder_lock(tmp_path):  # free again once every process of the run is gone
        pass


def test_a_ranks_divergence_reaches_the_caller_typed(tmp_path):
    with pytest.raises(TrainingDiverged) as diverged:
        distributed.launch(train_slowly, 2, str(tmp_path), 50, 1e6, threads=1)
    assert "training diverged at step" in str(diverged.value) and "lr / --lr, now 1e+06" in str(diverged.value)
    assert 1 <= diverged.value.step <= 50

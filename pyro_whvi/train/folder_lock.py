"""One live run per output folder: a lock file that a run and every process it launched hold until they end.

:func:`folder_lock` takes an exclusive :func:`fcntl.flock` on ``<folder>/.whvi.lock`` (a second run fails at
once, naming the processes that hold it) and then shares it: the ranks that
:func:`pyro_whvi.train.distributed.launch` starts take it shared too (:func:`share_held_lock`), so the folder
stays locked while any of them lives, even if the launcher itself was killed. The kernel releases a
``flock`` when its holder dies, so a lock is never stale.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_NAME", "FolderLocked", "folder_lock", "held_lock", "share_held_lock"]

LOCK_NAME = ".whvi.lock"
_held: list[Path] = []  # the lock this process took with folder_lock (launch hands it to its ranks)
_shared: list[int] = []  # the descriptors of locks shared by a rank, open until it exits


class FolderLocked(OSError):
    """Another live run holds the folder's lock; the message (one line) names its processes."""


def _holders(path: Path) -> list[int]:
    """Processes holding a ``flock`` on ``path``, from ``/proc/locks`` (empty where it is unavailable)."""
    try:
        status = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    pids = []
    for line in lines:
        fields = line.split()
        if "FLOCK" in fields and "->" not in fields and len(fields) >= 6 and fields[5] == device:
            pids.append(int(fields[4]))
    return sorted(set(pids) - {os.getpid()})


def _refuse(folder: Path, path: Path) -> FolderLocked:
    holders: list[int | str] = ["?"]
    with contextlib.suppress(OSError):
        holders = [*_holders(path)] or [path.read_text().strip() or "?"]
    processes = " ".join(str(pid) for pid in holders)
    return FolderLocked(
        f"{folder} is in use by another run (process {processes.replace(' ', ', ')}, still running); wait for it "
        f"to end or stop it (kill {processes}), then rerun"
    )


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s run lock for the block; processes started by ``launch`` inside it hold it with us.

    Where ``fcntl`` is missing (Windows) nothing is locked.

    :raises FolderLocked: another live process (a run, or a rank of one) holds it.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared from now on: our ranks take it too
        except BlockingIOError:
            raise _refuse(folder, path) from None
        _held.append(path)
        try:
            yield
        finally:
            _held.remove(path)
    finally:
        os.close(fd)  # releases the lock


def held_lock() -> Path | None:
    """The lock file this process holds through :func:`folder_lock`, if any (the innermost)."""
    return _held[-1] if _held else None


def share_held_lock(path: Path) -> None:
    """Hold ``path`` shared until this process exits (a rank of the run that holds it)."""
    try:
        import fcntl
    except ImportError:
        return
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    _shared.append(fd)

"""Files that runs write: atomically (:func:`write_atomic`), in a folder checked first (:func:`check_writable`);
and the notices about the files a run reads (:func:`notice`)."""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path

__all__ = ["check_writable", "notice", "write_atomic"]


def notice(message: str) -> None:
    """Tell the user something that decides what the results mean (a damaged file trained again, a checkpoint
    ignored): one line on stderr, ``warning: <message>``, on a line of its own above any progress bar.

    Not a ``warnings.warn``: warning filters (``-W ignore``, ``PYTHONWARNINGS``) would hide it.
    """
    from tqdm.auto import tqdm

    tqdm.write(f"warning: {' '.join(message.splitlines())}", file=sys.stderr)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and :func:`os.replace`, so
    that a reader, or an interrupted run, sees the old file or the new one, never a part of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as handle:  # "x": a fresh file with the usual permissions (umask)
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())  # the data on disk before the rename: no empty file after a crash
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def check_writable(out: Path) -> None:
    """Create the folder ``out`` if needed and check that files can be written in it.

    :raises OSError: naming ``out`` and the reason.
    """
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError("it exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as error:
        raise OSError(f"cannot write results to {out}: {error.strerror or error}") from None

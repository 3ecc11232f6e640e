"""Writing files so that nothing already written is lost or half-written.

A write goes to a temp file in the same folder, is flushed to disk and renamed over the
target: a crash, a full disk or Ctrl-C mid-write leaves the previous file as it was. Every
part that writes (checkpoints, model folders, exports, tables) uses these.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .errors import RunDirError


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    """:func:`atomic_save` for a text file (a table, a JSON record, a config)."""
    atomic_write(lambda f: f.write(text.encode()), Path(path), "file")


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temp file in the same directory, fsync, then ``os.replace``.

    A crash or Ctrl-C mid-write leaves the previous file intact, never a truncated one. A
    failed write (full disk, I/O error; torch's zip writer raises a ``RuntimeError``) removes
    the temp file and raises a one-line :class:`RunDirError`.
    """
    atomic_write(lambda f: torch.save(obj, f), Path(path), "checkpoint")


def atomic_write(write: Callable[[Any], object], path: Path, what: str) -> None:
    """Call ``write(f)`` on a temp file beside ``path``, then rename it over ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise write_failed(path, e, what) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) or (isinstance(e, RuntimeError) and "write" in str(e).lower()):
            raise write_failed(path, e, what) from None
        raise  # Ctrl-C, or not an I/O failure: a bug, keep its traceback


def write_failed(path: Path, e: Exception, what: str) -> RunDirError:
    """A failed write as one line saying whether the previous file survived."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else "the write failed"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        why = "no space left on device"
    kept = f"the previous {path.name} is unchanged" if path.exists() else "nothing was written"
    return RunDirError(f"cannot write {what} {path}: {why}; {kept}")

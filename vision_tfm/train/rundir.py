"""Run directories: who may write where, one writer at a time, checked before any work.

Rules (the README's "Safety and failure behaviour" repeats them):

* A run dir is a folder this package created (:func:`make_run_dir`); a marker file
  (:data:`RUN_MARKER`) says so. Resuming continues in place only there, and only when neither
  the folder nor any file the run writes is a symlink; anywhere else it starts a new run dir,
  so a checkpoint copied into a user's folder never overwrites that folder's files.
* One process writes a run dir at a time: :class:`RunLock` holds an ``flock`` on
  :data:`LOCK_FILE`, which the kernel releases when the holder dies, so a lock left by a
  killed run is taken over without a word and a live one is named by its PID.
* Output folders are probed for writability before any work (:func:`check_writable_dir`).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from datetime import datetime
from pathlib import Path

from ..errors import RunDirError

try:
    import fcntl
except ImportError:  # Windows: no flock, so no lock (the PID is still written)
    fcntl = None

RUN_MARKER = ".vision_tfm_run"
"""Written into every run dir the package creates; resume continues in place only beside it."""
LOCK_FILE = ".lock"
RUN_OUTPUTS = ("config.yaml", "metrics.csv", "steps.csv", "last.pt", "best.pt", "tb")
"""What a run writes into its run dir (plots are written only at the end, by name)."""


def make_run_dir(out_dir: str | os.PathLike, name: str) -> Path:
    """``<out_dir>/<name>-<timestamp>`` with the run marker; never reuses an existing directory."""
    base = Path(out_dir) / f"{name}-{datetime.now():%Y%m%d-%H%M%S}"
    for n in itertools.count(1):
        path = base.with_name(f"{base.name}-{n}") if n > 1 else base
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        except OSError as e:
            raise _unwritable(Path(out_dir), "run.out_dir", e) from None
        mark_run_dir(path)
        return path


def mark_run_dir(path: Path) -> None:
    """Claim a folder this process has just created as a run dir."""
    (path / RUN_MARKER).write_text("created by vision_tfm; resume may write here\n")


def is_own_run_dir(path: Path) -> bool:
    """Whether a resume may keep writing in ``path`` (see the module docstring)."""
    marker = path / RUN_MARKER
    if path.is_symlink() or marker.is_symlink() or not marker.is_file():
        return False
    return not any((path / name).is_symlink() for name in RUN_OUTPUTS)


def _unwritable(path: Path, what: str, e: OSError) -> RunDirError:
    return RunDirError(f"{what}: cannot write in {path} ({e.strerror or type(e).__name__})")


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Prove, before any work, that a file can be written in ``path`` (or its nearest existing
    parent, where it will be created), leaving nothing behind; else a one-line
    :class:`RunDirError` naming ``what`` (a flag or config key) and the folder."""
    path = Path(path)
    probe = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not probe.is_dir():
        raise RunDirError(f"{what}: cannot create {path}: {probe} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise _unwritable(probe, what, e) from None


def remove_stale_temps(path: Path) -> None:
    """Delete temp files a killed checkpoint write left (``.last.pt.*.tmp``); call under lock."""
    for tmp in path.glob(".*.pt.*.tmp"):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink()


class RunLock:
    """An exclusive, non-blocking lock on a run dir, holding its owner's PID; a context manager."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunDirError` naming the PID that holds it."""
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise _unwritable(self.path.parent, "run dir", e) from None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunDirError(
                    f"{self.path.parent} is in use by another run (PID {holder}); wait for it "
                    f"to end or resume elsewhere",
                ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays; an unlocked file is free to take)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

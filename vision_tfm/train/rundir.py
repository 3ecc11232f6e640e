"""Run directories: who may write where, one writer at a time, checked before any work.

Rules (docs/safety.md repeats them):

* A run dir is a folder this package created (:func:`make_run_dir`); a marker file
  (:data:`RUN_MARKER`) says so. Resuming continues in place only there, and only when neither
  the folder nor any file the run writes is a symlink; anywhere else it starts a new run dir,
  so a checkpoint copied into a user's folder never overwrites that folder's files.
* One process writes a run dir at a time: :class:`RunLock` holds an ``flock`` on
  :data:`LOCK_FILE`, which the kernel releases when the holder dies, so a lock left by a
  killed run is taken over without a word and a live one is named by its PID. A run that
  ends (finished, stopped by a signal, or failed) removes the file while it still holds it.
* Output folders are probed for writability before any work (:func:`check_writable_dir`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ..config import safe_yaml
from ..errors import ConfigError, RunDirError, VisionTfmError, error_line
from ..files import read_text
from ..io import atomic_save, load_checkpoint, unwritable_error

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
            raise unwritable_error(Path(out_dir), "run.out_dir", e) from None
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
        while True:
            try:
                fd = os.open(self.path, flags, 0o644)
            except OSError as e:
                raise unwritable_error(self.path.parent, "run dir", e) from None
            if fcntl is None:
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise RunDirError(
                    f"{self.path.parent} is in use by another run (PID {holder}); wait for it "
                    f"to end or resume elsewhere",
                ) from None
            if self._still_linked(fd):
                break
            os.close(fd)  # its holder removed the file as we opened it: lock the path anew
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def _still_linked(self, fd: int) -> bool:
        """Whether ``fd`` is still the file at :attr:`path` (a lock on an unlinked one
        guards nothing)."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the file, then drop the lock; nothing is left behind in the run dir."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # held: no other run is using it (Windows
                self.path.unlink()  # removes no open file: its PID file stays)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def file_id(path: Path) -> tuple[int, int, int]:
    """Changes when a file is replaced (atomic_save) or rewritten."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def resumes_newest(resume: Path, resume_id: tuple | None, state: dict[str, Any]) -> bool:
    """Whether the resumed checkpoint is its run dir's newest state (its last.pt, or a copy).

    Continuing in place from anything older (a best.pt behind last.pt) would overwrite
    last.pt with another lineage and repeat epochs in metrics.csv.
    """
    last = resume.parent / "last.pt"
    if resume.name == last.name:  # unless another run has replaced it since
        with contextlib.suppress(OSError):
            return file_id(last) == resume_id
        return False
    try:
        return load_checkpoint(last, resume=True)["state"] == state
    except (OSError, ValueError):  # no (readable) last.pt: nothing to continue there
        return False


def _run_config(d: Path) -> dict:
    """A run dir's ``config.yaml``, bounded (an alias bomb or a FIFO is refused, not read)."""
    config = safe_yaml(read_text(d / "config.yaml"))
    if not isinstance(config, dict):
        raise ConfigError(f"{d / 'config.yaml'} is not a mapping")
    return config


def newest_unfinished(
    out_dir: str | os.PathLike,
    same: Callable[[dict], bool],
    epochs: int,
    say: Callable[[str], None] | None = None,
) -> Path | None:
    """``last.pt`` of the newest run dir directly under ``out_dir`` whose ``config.yaml``
    ``same`` accepts and whose checkpoint has trained fewer than ``epochs`` epochs: what
    ``run.resume=auto`` continues. Newest by its ``last.pt``; None when there is none.

    A run dir whose config or checkpoint cannot be read is passed over, and ``say`` is told
    which and why: resuming an older run in silence would hide the newest one's damage.
    """
    found = []
    skip = say or (lambda _: None)
    with contextlib.suppress(OSError):  # no out_dir yet: nothing to continue
        for d in sorted(Path(out_dir).iterdir()):
            last = d / "last.pt"
            if not (d.is_dir() and is_own_run_dir(d) and last.is_file()):
                continue
            try:
                if same(_run_config(d)):
                    found.append((last.stat().st_mtime_ns, last))
            except (VisionTfmError, OSError, ValueError, TypeError, yaml.YAMLError) as e:
                skip(f"run.resume=auto: skipped {d}: {error_line(e).removeprefix('error: ')}")
    for _, last in sorted(found, reverse=True):
        try:
            state = load_checkpoint(last, resume=True)["state"]
        except (OSError, ValueError) as e:  # unreadable: the next newest
            skip(f"run.resume=auto: skipped {last.parent}: {error_line(e).removeprefix('error: ')}")
            continue
        if isinstance(state, dict) and state.get("epoch", epochs) < epochs:
            return last
    return None


class RunDirs:
    """Where a run writes, chosen once on rank 0: a new run dir, the resumed one (locked), or
    a fork beside it when writing there would lose something (the rules: module docstring)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.lock: RunLock | None = None

    def take(self, path: Path) -> Path:
        """Hold ``path`` against a second writer and clear temps a killed write left."""
        self.release()
        self.lock = RunLock(path).acquire()
        remove_stale_temps(path)
        return path

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def fork(self, resume: Path, parent: Path, name: str, why: str, best: dict | None) -> Path:
        """A new run dir under ``parent``; the resumed checkpoint's folder is left as it is.
        ``best``: the resumed checkpoint, when its epoch is the best of its lineage so far."""
        new = make_run_dir(parent, name)
        if best is not None:
            atomic_save(best, new / "best.pt")
        self.say(
            f"{resume} {why}; continuing in a new run dir {new} and leaving {resume.parent} "
            "as it is"
        )
        return self.take(new)

    def resume_in(
        self,
        resume: Path,
        resume_id: tuple | None,
        ckpt: dict,
        out_dir: str,
        name: str,
        best: dict | None,
    ) -> tuple[Path, bool]:
        """The run dir a resume continues in, and whether it is a new one."""
        here = resume.parent
        if not is_own_run_dir(here):  # a user's folder: never write there
            why = "is not in a run dir vision_tfm made"
            return self.fork(resume, Path(out_dir), name, why, best), True
        state = ckpt["state"]
        if resumes_newest(resume, resume_id, state):  # lock, then look again: it may have
            self.take(here)  # moved on while we waited
            if resumes_newest(resume, resume_id, state):
                return here, False
            self.release()
        # a folder we only read is left byte for byte as it was
        why = "is not the newest state of its run dir"
        return self.fork(resume, here.parent, name, why, best), True

    def new(self, out_dir: str, name: str, path: Path | None = None) -> Path:
        """A fresh run dir: ``path`` when given (it must not exist yet), else a timestamped one."""
        if path is None:
            return self.take(make_run_dir(out_dir, name))
        path.mkdir(parents=True, exist_ok=False)
        mark_run_dir(path)
        return self.take(path)

    def choose(
        self,
        out_dir: str,
        name: str,
        run_dir: Path | None,
        resume: Path | None,
        resume_id: tuple | None = None,
        ckpt: dict | None = None,
        best: dict | None = None,
    ) -> tuple[Path, bool]:
        """The run dir to write (locked), and whether it is a fork of the resumed one."""
        if resume is None:
            return self.new(out_dir, name, run_dir), False
        return self.resume_in(resume, resume_id, ckpt, out_dir, name, best)

"""Reading files that may be hostile, and writing files so nothing written is lost.

Reading: every file the package reads as a whole (configs, model.json, annotations, weights)
goes through :func:`open_regular`, which refuses what is not a regular file (a FIFO blocks
forever, ``/dev/zero`` never ends) and a symlink loop, and bounds the bytes before reading.
Folder walks go through :func:`walk_files`, which visits each real file once and never loops.

Writing: a write goes to a temp file in the same folder, is flushed to disk and renamed over
the target: a crash, a full disk or Ctrl-C mid-write leaves the previous file as it was. Every
part that writes (checkpoints, model folders, exports, tables) uses these.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import torch

from .errors import ConfigError, DataError, MissingFileError, NotAFileError, RunDirError

MAX_TEXT_BYTES = 4 << 20
"""Bytes a config, model.json or annotation file may hold: each needs kilobytes."""
MAX_NESTING = 32
"""Depth a JSON or YAML document may nest to: a config needs five."""


def open_regular(path: str | os.PathLike, max_bytes: int | None = None) -> IO[bytes]:
    """Open ``path`` for reading if it is a regular file of at most ``max_bytes``.

    The open itself does not block (``O_NONBLOCK``: a FIFO with no writer would wait
    forever); the kind and size are then read from the open descriptor, so a file swapped
    after a check cannot slip through. A symlink is followed as the OS does, at most 40
    links deep; a loop is refused.

    Raises:
        MissingFileError: Nothing is at ``path``.
        NotAFileError: ``path`` is a folder.
        DataError: A FIFO, device or socket, a link loop, or over ``max_bytes``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise MissingFileError(f"file not found: {path}") from None
    except IsADirectoryError:
        raise NotAFileError(f"{path} is a folder, expected a file") from None
    except OSError as e:
        why = "a symlink loop" if e.errno == errno.ELOOP else e.strerror or "unreadable"
        raise DataError(f"{path}: cannot open ({why})") from None
    st = os.fstat(fd)
    problem = None
    if stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise NotAFileError(f"{path} is a folder, expected a file")
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file (a FIFO, device or socket), expected a file"
    elif max_bytes is not None and st.st_size > max_bytes:
        problem = f"is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit for this file"
    if problem:
        os.close(fd)
        raise DataError(f"{path} {problem}")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """A regular file's bytes, at most ``max_bytes`` (also checked while reading: a file
    that grows past its size between the check and the read is refused too)."""
    with open_regular(path, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise DataError(f"{path} grew past the {max_bytes:,}-byte limit while being read")
    return data


def read_text(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8, with a one-line error for other bytes."""
    try:
        return read_bytes(path, max_bytes).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _children(v: dict | list | tuple) -> Iterator[Any]:
    return iter(v.values() if isinstance(v, dict) else v)


def check_nesting(value: Any, what: str, limit: int = MAX_NESTING) -> Any:
    """``value`` unchanged if its lists and mappings nest at most ``limit`` deep.

    Each container is measured once (by identity), so a YAML document whose aliases share
    one list many times costs its size in nodes, not its expanded size; a container that
    holds itself (``&a [*a]``) is refused.
    """
    containers = (dict, list, tuple)
    height: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        v, done = stack.pop()
        if not isinstance(v, containers) or (not done and id(v) in height):
            continue
        if done:
            kids = [height[id(k)] for k in _children(v) if isinstance(k, containers)]
            height[id(v)] = 1 + max(kids, default=0)
            on_path.discard(id(v))
            if height[id(v)] > limit:
                raise ConfigError(f"{what} nests deeper than {limit} levels")
            continue
        if id(v) in on_path:
            raise ConfigError(f"{what} holds itself (a recursive alias), expected plain data")
        on_path.add(id(v))
        stack.append((v, True))
        stack.extend((k, False) for k in _children(v))
    return value


def read_json(path: str | os.PathLike, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """A bounded JSON document: :func:`read_text`, then parse, then :func:`check_nesting`."""
    text = read_text(path, max_bytes)
    try:
        value = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path} nests deeper than {MAX_NESTING} levels") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    return check_nesting(value, str(path))


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def walk_files(root: str | os.PathLike, keep: Callable[[Path], bool] | None = None) -> list[Path]:
    """Every file below ``root`` that ``keep`` accepts, each real file once, sorted.

    Symlinked folders are followed, but a folder already visited (by device and inode) is
    not entered again, so a link to a parent or a sibling neither loops nor lists the same
    image twice; a file reached by two names is listed under the first, in sorted order.
    Hidden files and folders (``.ipynb_checkpoints``, ``.DS_Store``) are skipped.
    """
    seen_dirs: set[tuple[int, int]] = set()
    seen_files: set[tuple[int, int]] = set()
    out: list[Path] = []
    for top, dirs, files in os.walk(root, followlinks=True):
        st = os.stat(top)
        if (st.st_dev, st.st_ino) in seen_dirs:
            dirs[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
        for name in sorted(files):
            p = Path(top, name)
            if _is_hidden(name) or (keep is not None and not keep(p)):
                continue
            with contextlib.suppress(OSError):  # a dangling link is no file
                fst = p.stat()
                if stat.S_ISREG(fst.st_mode) and (fst.st_dev, fst.st_ino) not in seen_files:
                    seen_files.add((fst.st_dev, fst.st_ino))
                    out.append(p)
    return sorted(out)


def _match_parts(parts: list[str], pattern: list[str]) -> bool:
    """Whether path components match glob components, ``**`` standing for zero or more."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match_parts(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match_parts(
        parts[1:], pattern[1:]
    )


def glob_files(pattern: str) -> Iterator[Path]:
    """The files and folders a glob names, found by :func:`walk_files` below its fixed
    prefix: each real file once, never looping through a linked folder (``glob.glob``'s
    ``**`` follows a link to its own folder until the path is too long)."""
    parts = Path(pattern).parts
    fixed = next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    rest = list(parts[fixed:])
    if not rest or not root.is_dir():
        yield from (Path(m) for m in glob.glob(pattern))
        return
    if "**" not in rest:  # no descent: the plain glob cannot loop
        yield from sorted(Path(m) for m in glob.glob(pattern))
        return
    for p in walk_files(root):
        if _match_parts(list(p.relative_to(root).parts), rest):
            yield p


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


def user_mode(mode: int = 0o666) -> int:
    """``mode`` under the process's umask: what ``open()`` would give, where ``mkstemp``
    gives 0600 and another user or container could not read the file."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def _writer_alive(tmp: Path, name: str) -> bool:
    """Whether the process whose PID a temp file's name holds is still running here."""
    pid = tmp.name[len(name) + 2 :].split(".", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, owned by another user
        return True
    return True


def remove_dead_temps(path: Path) -> None:
    """Delete the temp files of ``path`` left by a writer that was killed (its PID is gone),
    so a kill mid-write costs disk only until the next write of the same file."""
    with contextlib.suppress(OSError):
        for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            if tmp.is_file() and not tmp.is_symlink() and not _writer_alive(tmp, path.name):
                tmp.unlink()


def atomic_write(write: Callable[[Any], object], path: Path, what: str) -> None:
    """Call ``write(f)`` on a temp file beside ``path``, then rename it over ``path``.

    The file gets the user's umask (:func:`user_mode`); the temp file's name holds this
    process's PID, so the next write can tell a dead writer's leftovers from a live one's.
    """
    remove_dead_temps(path)
    try:
        prefix = f".{path.name}.{os.getpid()}."
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
        if hasattr(os, "fchmod"):  # not on Windows, where mkstemp's mode is moot
            os.fchmod(fd, user_mode())
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

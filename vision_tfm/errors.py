"""The package's own error types.

Every expected failure (bad setting, bad file, unusable output folder) is one of these, with a
one-line message naming the key or file. Each also derives from the builtin type the same
failure would raise in plain Python (``ValueError``, ``FileNotFoundError``, ``TypeError``...),
so code that catches those keeps working, and the CLI catches :class:`VisionTfmError` alone.
"""

from __future__ import annotations

import contextlib
import errno
import pickle
import sys
import warnings
from collections.abc import Iterator

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DependencyError",
    "ExportError",
    "InputError",
    "InputIndexError",
    "InputTypeError",
    "MissingFileError",
    "NotAFileError",
    "OutputExistsError",
    "RunDirError",
    "UnknownKeyError",
    "UnsafeFileError",
    "VisionTfmError",
]  # the classes alone (tests/test_errors.py); exit_code, error_line and warning_line
# are for the CLIs


class VisionTfmError(Exception):
    """Base of every error vision_tfm raises on purpose."""


class ConfigError(VisionTfmError, ValueError):
    """A config key or argument is unknown, or its value has the wrong type or is out of range."""


class UnknownKeyError(ConfigError, KeyError):
    """A name looked up in a collection the user chose from (a dataset's view ids) is unknown.

    Also a ``KeyError``, as the plain lookup was; the message prints unquoted, as every other
    error's does (``KeyError`` alone would show its repr).
    """

    __str__ = BaseException.__str__


class DataError(VisionTfmError, ValueError):
    """A data file (image, annotation, dataset pickle) is malformed; the message names it."""


class UnsafeFileError(DataError):
    """A file would run code or name objects beyond plain data if it were loaded."""


class MissingFileError(VisionTfmError, FileNotFoundError):
    """A file or folder the user named does not exist (or is the wrong kind of path)."""


class NotAFileError(MissingFileError, IsADirectoryError):
    """A file was expected, but the path the user named is a folder."""


class CheckpointError(VisionTfmError, ValueError):
    """A checkpoint is unreadable, does not fit the model, or holds non-finite weights."""


class InputError(VisionTfmError, ValueError):
    """A tensor or argument given to a model has the wrong shape, channel count or value."""


class InputIndexError(InputError, IndexError):
    """An index is out of range (a dataset item); also an ``IndexError``, so iteration that
    relies on it (``for item in dataset``) still stops there."""


class InputTypeError(VisionTfmError, TypeError):
    """An argument has the wrong type (a tensor's dtype, a module where a name was expected)."""


class DependencyError(VisionTfmError, ImportError):
    """An optional package a feature needs (onnxruntime, openvino...) is not installed."""


class RunDirError(VisionTfmError, OSError):
    """An output folder cannot be written, or another process holds the run dir."""


class OutputExistsError(RunDirError, FileExistsError):
    """An output file or folder exists and ``--overwrite`` (``overwrite=True``) was not given."""


class ExportError(VisionTfmError, RuntimeError):
    """An export step failed: the exporter, a runtime, or a check on what it wrote."""


_WRITE_ERRNOS = frozenset(
    {errno.EFBIG, errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EPIPE}
)
_TORCH_WRITE = ("unexpected pos", "PytorchStreamWriter failed", "problem writing")


def exit_code(e: BaseException) -> int | None:
    """The exit code a CLI gives an expected failure, or None for a bug (whose traceback
    should show): 1 for a failed write (disk full, file-size limit), 2 for bad input,
    ours or a library's (an unsafe or corrupt checkpoint, a file onnxruntime cannot load,
    a size beyond memory)."""
    kind = type(e)
    if isinstance(e, VisionTfmError):
        return 2
    if isinstance(e, OSError):
        return 1 if e.errno in _WRITE_ERRNOS or "writ" in str(e).lower() else 2
    if isinstance(e, RuntimeError) and any(s in str(e) for s in _TORCH_WRITE):
        return 1  # torch's zip writer on a full disk or past a file-size limit
    if isinstance(e, RuntimeError) and str(e).startswith("Weights only load failed"):
        return 2  # torch refused to unpickle objects beyond plain data
    if isinstance(e, (ValueError, MemoryError, pickle.UnpicklingError)):
        return 2
    if kind.__name__ == "SafetensorError" or kind.__module__.startswith("onnxruntime"):
        return 2  # a corrupt safetensors file (a bad Hugging Face cache); an unloadable graph
    return None


def error_line(e: BaseException) -> str:
    """``error: <the first line of the message>``, cut to about 300 characters: a library's
    message can run to pages (torch's unpickling advice) or be empty (``MemoryError``)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, pickle.UnpicklingError) or text.startswith("Weights only load failed"):
        text = "a checkpoint holds objects beyond plain data, which are never loaded (torch's "
        text += "weights_only refusal); re-save it as a state dict"  # not torch's advice
    elif isinstance(e, MemoryError):
        text = f"out of memory{': ' + text if text else ''}"
    elif not isinstance(e, VisionTfmError) and type(e).__module__ != "builtins":
        text = f"{type(e).__name__}: {text}"  # a library's type says where it came from
    return f"error: {text[:300] or type(e).__name__}"


def warning_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    line: str | None = None,
) -> str:
    """``warnings.formatwarning`` for the command lines: ``warning: <message>`` on one line.
    Python's default adds the file, line number and source line that raised it, which
    tell a user of the CLI nothing about their data."""
    kind = "" if category is UserWarning else f"{category.__name__}: "
    text = " ".join(str(message).split())
    return f"warning: {kind}{text}\n"


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """What a command line runs under: an expected failure (:func:`exit_code`) prints
    :func:`error_line` on stderr and exits with its code, a bug's traceback shows, and
    warnings print as :func:`warning_line` meanwhile."""
    fmt, warnings.formatwarning = warnings.formatwarning, warning_line
    try:
        yield
    except Exception as e:  # ours; a library's, on bad input or a full disk; a bug re-raised
        code = exit_code(e)
        if code is None:
            raise
        print(error_line(e), file=sys.stderr)
        sys.exit(code)
    finally:
        warnings.formatwarning = fmt

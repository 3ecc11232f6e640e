"""The package's own error types.

Every expected failure (bad setting, bad file, unusable output folder) is one of these, with a
one-line message naming the key or file. Each also derives from the builtin type the same
failure would raise in plain Python (``ValueError``, ``FileNotFoundError``, ``TypeError``...),
so code that catches those keeps working, and the CLI catches :class:`VisionTfmError` alone.
"""

from __future__ import annotations

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
]


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

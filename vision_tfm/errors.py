"""The package's own error types.

Every expected failure (bad setting, bad file, unusable output folder) is one of these, with a
one-line message naming the key or file. They derive from ``ValueError`` or ``OSError`` as well,
so code that catches those keeps working.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "DataError",
    "InputError",
    "RunDirError",
    "UnsafeFileError",
    "VisionTfmError",
]


class VisionTfmError(Exception):
    """Base of every error vision_tfm raises on purpose."""


class DataError(VisionTfmError, ValueError):
    """A data file (image, annotation, dataset pickle) is malformed; the message names it."""


class UnsafeFileError(DataError):
    """A file would run code or name objects beyond plain data if it were loaded."""


class CheckpointError(VisionTfmError, ValueError):
    """A checkpoint is unreadable, does not fit the model, or holds non-finite weights."""


class InputError(VisionTfmError, ValueError):
    """A tensor or argument given to a model has the wrong shape, channel count or dtype."""


class RunDirError(VisionTfmError, OSError):
    """An output folder cannot be written, or another process holds the run dir."""

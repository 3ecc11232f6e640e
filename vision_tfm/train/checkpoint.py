"""Checkpoints that are never half-written and resume bit-identically.

Everything stored is loadable with ``torch.load(weights_only=True)``: tensors, plain
containers and numbers only. No RNG state is stored: the engine derives every random draw
from the seed, the epoch and the position in it, which the checkpoint holds.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ..config import apply_overrides
from ..errors import CheckpointError, RunDirError
from ..models.convert import check_finite, load_torch_file

T = TypeVar("T")

TASKS = {"cls": ("classification", "train_cls.py"), "grasp": ("grasp", "train_grasp.py")}
"""Checkpoint ``meta["task"]`` -> what to call it, and the script that trains it."""


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """Write to a temp file in the same directory, fsync, then ``os.replace``.

    A crash or Ctrl-C mid-write leaves the previous file intact, never a truncated one. A
    failed write (full disk, I/O error; torch's zip writer raises a ``RuntimeError``) removes
    the temp file and raises a one-line :class:`RunDirError`.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise _write_failed(path, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) or (isinstance(e, RuntimeError) and "write" in str(e).lower()):
            raise _write_failed(path, e) from None
        raise  # Ctrl-C, or not an I/O failure: a bug, keep its traceback


def _write_failed(path: Path, e: Exception) -> RunDirError:
    why = e.strerror if isinstance(e, OSError) and e.strerror else "the write failed"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        why = "no space left on device"
    kept = f"the previous {path.name} is unchanged" if path.exists() else "nothing was written"
    return RunDirError(f"cannot write checkpoint {path}: {why}; {kept}")


REQUIRED_KEYS = ("model", "config", "meta")
"""What every vision_tfm checkpoint holds (predict, export and eval read only these)."""
RESUME_KEYS = ("optimizer", "scheduler", "scaler", "state")
"""What continuing a run needs on top of :data:`REQUIRED_KEYS`."""


def load_checkpoint(path: str | os.PathLike, resume: bool = False) -> dict[str, Any]:
    """Read a training checkpoint safely, with one-line errors for the usual failures.

    Args:
        path: A ``last.pt`` / ``best.pt`` written by the engine.
        resume: Also require the optimiser, schedule and loop state (``RESUME_KEYS``).
    """
    path = Path(path)
    ckpt = load_torch_file(path)
    keys = REQUIRED_KEYS + (RESUME_KEYS if resume else ())
    missing = [k for k in keys if k not in ckpt] if isinstance(ckpt, dict) else list(keys)
    if missing:
        raise CheckpointError(
            f"{path} is not a vision_tfm training checkpoint (missing {', '.join(missing)})"
        )
    if not isinstance(ckpt["config"], dict) or not isinstance(ckpt["meta"], dict):
        raise CheckpointError(f"{path}: its 'config' and 'meta' must be mappings")
    return ckpt


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _floats(v: Any, n: int) -> bool:
    return (
        isinstance(v, list)
        and len(v) == n
        and all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
    )


# what predict / export / benchmark / resume read from ``meta``, per task: key -> (check, expected)
_META: dict[str, dict[str, tuple[Callable[[Any, dict], bool], str]]] = {
    "cls": {
        "num_classes": (lambda v, m: _is_int(v) and v >= 1, "an integer >= 1"),
        "in_chans": (lambda v, m: v in (1, 3) and _is_int(v), "1 or 3"),
        "img_size": (lambda v, m: _is_int(v) and v >= 1, "an integer >= 1"),
        "class_names": (
            lambda v, m: (
                isinstance(v, list)
                and all(isinstance(x, str) for x in v)
                and len(v) == m.get("num_classes")
            ),
            "one name per output (num_classes of them)",
        ),
        "mean": (lambda v, m: _floats(v, m.get("in_chans")), "one finite number per channel"),
        "std": (
            lambda v, m: _floats(v, m.get("in_chans")) and min(v) > 0,
            "one positive number per channel",
        ),
    },
    "grasp": {"in_chans": (lambda v, m: v in (1, 3, 4) and _is_int(v), "1, 3 or 4")},
}


def check_meta(meta: dict[str, Any], what: str = "checkpoint") -> None:
    """Check the ``meta`` fields predict / export / benchmark read before rebuilding a model,
    so an edited one is a one-line error naming it rather than an ``AttributeError`` /
    ``IndexError`` (or a silently wrong label, when class names and outputs disagree)."""
    task = meta.get("task")
    if task not in _META:
        raise CheckpointError(f"{what}: meta 'task' is {task!r}; expected one of {sorted(_META)}")
    for key, (ok, expected) in _META[task].items():
        if not ok(meta.get(key), meta):
            raise CheckpointError(f"{what}: meta {key!r} must be {expected}, got {meta.get(key)!r}")


def check_fits(
    build: Callable[[], nn.Module], weights: Mapping[str, torch.Tensor], what: str
) -> None:
    """Check that ``weights`` fit the model ``build`` makes, built on the meta device, so a
    config edited to ask for a huge model is a one-line error, not ``std::bad_alloc``."""
    with torch.device("meta"):
        own = build().state_dict()
    for key in sorted(set(own) | set(weights)):
        mine, theirs = own.get(key), weights.get(key)
        if mine is None or theirs is None or tuple(mine.shape) != tuple(theirs.shape):
            shapes = [tuple(t.shape) if t is not None else "absent" for t in (theirs, mine)]
            raise CheckpointError(
                f"{what}: the weights do not fit the model its config describes (size "
                f"mismatch {key!r}: weights {shapes[0]}, model {shapes[1]}); has its config "
                f"changed since training?"
            )


def build_for_weights(
    build: Callable[[], nn.Module], weights: Mapping[str, torch.Tensor], what: str
) -> nn.Module:
    """:func:`check_fits`, then build the model for real and load ``weights``."""
    check_fits(build, weights, what)
    model = build()
    model.load_state_dict(weights)
    return model


def checkpoint_builder(
    ckpt: dict[str, Any],
    default: T,
    build: Callable[[T, dict[str, Any], bool], nn.Module],
    source: str = "checkpoint",
) -> tuple[Callable[[], nn.Module], T]:
    """What rebuilds a checkpoint's model, uncalled so that it can run on the meta device,
    and the checkpoint's config over ``default``; ``build(cfg, meta, pretrained)`` makes the
    model, here with ``pretrained=False``: the checkpoint's weights replace those training
    started from, so the rebuild must not read or download them, nor need their file."""
    check_meta(ckpt["meta"], source)
    cfg = apply_overrides(default, ckpt["config"])
    return lambda: build(cfg, ckpt["meta"], False), cfg


def restore_model(
    ckpt: dict[str, Any],
    task: str,
    builder: Callable[[dict[str, Any], str], tuple[Callable[[], nn.Module], T]],
    use_ema: bool | None = None,
    source: str = "checkpoint",
) -> tuple[nn.Module, T]:
    """Rebuild a trained ``task`` model (a key of :data:`TASKS`) in eval mode, and its config.

    ``builder`` is the task's :func:`checkpoint_builder`; ``use_ema``: see
    :func:`shipped_weights`; ``source`` names the checkpoint in errors.
    """
    if ckpt.get("meta", {}).get("task") != task:
        raise CheckpointError(f"checkpoint is not a {TASKS[task][0]} checkpoint")
    build, cfg = builder(ckpt, source)
    return build_for_weights(build, shipped_weights(ckpt, use_ema, source), source).eval(), cfg


def shipped_weights(
    ckpt: dict[str, Any], use_ema: bool | None = None, source: str = "checkpoint"
) -> dict[str, Any]:
    """The state dict a checkpoint is used with: the EMA when the run tracked it.

    Args:
        ckpt: A training checkpoint dict.
        use_ema: None follows the run (``meta["weights"]``); True takes the EMA weights and
            refuses a checkpoint without them (rather than quietly using the raw ones);
            False takes the raw model's.
    """
    if use_ema and ckpt.get("ema") is None:
        raise CheckpointError(
            "EMA weights asked for (--ema), but this checkpoint has none: "
            "its run trained without ema.enabled"
        )
    if use_ema is None:
        use_ema = ckpt.get("meta", {}).get("weights") == "ema"
    weights = ckpt["model"]
    if use_ema and ckpt.get("ema") is not None:
        weights = {k.removeprefix("module."): v for k, v in ckpt["ema"].items()}
    check_finite(weights, source)
    return weights

"""Checkpoint reading and safe writing, below the training loop.

Inference, export and the engine all read checkpoints and write files; none of them needs
the others for it. Everything stored is loadable with ``torch.load(weights_only=True)``:
tensors, plain containers and numbers only. A write goes to a temp file in the same folder
and is renamed over the target, so nothing already written is ever lost or half-written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import CheckpointError, ConfigError, RunDirError
from .files import atomic_save, atomic_write_text  # noqa: F401  (re-exported: callers' home)
from .models.convert import check_finite, load_torch_file

MetaChecks = Mapping[str, tuple[Callable[[Any, dict], bool], str]]
"""``meta`` key -> (check of its value given the whole meta, what it should be)."""


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


def check_fits(
    build: Callable[[], nn.Module], weights: Mapping[str, torch.Tensor], what: str
) -> None:
    """Check that ``weights`` fit the model ``build`` makes, built on the meta device, so a
    config edited to ask for a huge model is a one-line error, not ``std::bad_alloc``."""
    try:
        with torch.device("meta"):
            own = build().state_dict()
    except ConfigError as e:  # e.g. a config edited to ask for more than this machine holds
        raise CheckpointError(f"{what}: its config does not build ({e})") from None
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


def check_meta(meta: dict[str, Any], checks: MetaChecks, what: str = "checkpoint") -> None:
    """Check the ``meta`` fields a task reads before rebuilding a model, so an edited one is a
    one-line error naming it rather than an ``AttributeError`` / ``IndexError`` (or a silently
    wrong label, when class names and outputs disagree)."""
    for key, (ok, expected) in checks.items():
        if not ok(meta.get(key), meta):
            raise CheckpointError(f"{what}: meta {key!r} must be {expected}, got {meta.get(key)!r}")


def unwritable_error(path: Path, what: str, e: OSError) -> RunDirError:
    """The one-line error for a folder that ``what`` (a flag or config key) names and that
    cannot be written in."""
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
        raise unwritable_error(probe, what, e) from None

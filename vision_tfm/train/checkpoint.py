"""Checkpoints that are never half-written and resume bit-identically.

Everything stored is loadable with ``torch.load(weights_only=True)``: tensors, plain
containers and numbers only. No RNG state is stored: the engine derives every random draw
from the seed, the epoch and the position in it, which the checkpoint holds.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..models.convert import load_torch_file

__all__ = [
    "REQUIRED_KEYS",
    "RESUME_KEYS",
    "atomic_save",
    "load_checkpoint",
    "shipped_weights",
]


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """Write to a temp file in the same directory, fsync, then ``os.replace``.

    A crash or Ctrl-C mid-write leaves the previous file intact, never a truncated one.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
        raise ValueError(
            f"{path} is not a vision_tfm training checkpoint (missing {', '.join(missing)})"
        )
    return ckpt


def shipped_weights(ckpt: dict[str, Any], use_ema: bool | None = None) -> dict[str, Any]:
    """The state dict a checkpoint is used with: the EMA when the run tracked it.

    Args:
        ckpt: A training checkpoint dict.
        use_ema: None follows the run (``meta["weights"]``); True takes the EMA weights and
            refuses a checkpoint without them (rather than quietly using the raw ones);
            False takes the raw model's.
    """
    if use_ema and ckpt.get("ema") is None:
        raise ValueError(
            "EMA weights asked for (--ema), but this checkpoint has none: "
            "its run trained without ema.enabled"
        )
    if use_ema is None:
        use_ema = ckpt.get("meta", {}).get("weights") == "ema"
    if use_ema and ckpt.get("ema") is not None:
        return {k.removeprefix("module."): v for k, v in ckpt["ema"].items()}
    return ckpt["model"]

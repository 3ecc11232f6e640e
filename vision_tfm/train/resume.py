"""What a resumed run checks before it continues: the weights, the model, the position."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timm.scheduler.scheduler import Scheduler
from torch import nn

from ..errors import CheckpointError, ConfigError
from ..io import check_fits
from ..models.convert import check_finite
from .optim import schedule_shape


@dataclass
class LoopState:
    """Where a run is; a checkpoint stores it, and a resume continues from it exactly."""

    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # micro-batches done in the current epoch (Ctrl-C mid-epoch)
    num_updates: int = 0
    best: float = -math.inf
    # the current epoch's progress before a mid-epoch stop, summed over ranks
    loss_sum: float = 0.0
    loss_count: int = 0
    seen: int = 0
    time_s: float = 0.0
    world_size: int = 1  # a mid-epoch position is only valid under the same process count

    @classmethod
    def restored(cls, saved: dict[str, Any]) -> LoopState:
        """The state a checkpoint stored (keys this version does not know are ignored)."""
        return cls(**{k: v for k, v in saved.items() if k in cls.__dataclass_fields__})


MAX_COUNT = 2**53
"""Largest epoch, step or update count a checkpoint may hold: beyond it a float (the
schedule's step, a log's x axis) no longer counts every update."""

_COUNTS = ("epoch", "step_in_epoch", "num_updates", "loss_count", "seen")
_FLOATS = ("loss_sum", "time_s")  # finite; ``best`` may also be -inf (nothing validated yet)


def check_state(ckpt: dict[str, Any], path: Path) -> None:
    """The loop position a checkpoint holds is one this engine could have written: counts are
    integers in ``[0, MAX_COUNT]``, the process count is at least 1, the running sums are
    finite. An edited or corrupt position would otherwise train on silently from a negative
    epoch or from update 10**18.

    The checkpoint holds no random generator state to check: every draw derives from the
    config's seed and this position.
    """
    state = ckpt["state"]
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: its 'state' must be a mapping, got {type(state).__name__}")

    def bad(key: str, expected: str) -> CheckpointError:
        shown = _short(repr(state[key]))
        return CheckpointError(f"{path}: state.{key} must be {expected}, got {shown}")

    for key in (k for k in _COUNTS if k in state):
        v = state[key]
        if type(v) is not int or not 0 <= v <= MAX_COUNT:
            raise bad(key, f"an integer in [0, {MAX_COUNT}]")
    if "world_size" in state and (type(state["world_size"]) is not int or state["world_size"] < 1):
        raise bad("world_size", "an integer >= 1")
    for key in (k for k in (*_FLOATS, "best") if k in state):
        v = state[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)
        if not ok or (key != "best" and not math.isfinite(v)) or v == math.inf:
            raise bad(key, "a finite number" + (" or -inf" if key == "best" else ""))
    history = ckpt.get("history", [])
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        raise CheckpointError(f"{path}: its 'history' must be a list of mappings")


def _short(text: str, limit: int = 200) -> str:
    """A value as an error quotes it: at most ``limit`` characters."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def check_weights(ckpt: dict[str, Any], task: Any, path: Path) -> None:
    """Before anything is built: a sane loop position (:func:`check_state`), and finite
    weights that fit the model the checkpoint's config describes, checked on the meta device
    (an edited config cannot make a huge model)."""
    check_state(ckpt, path)
    check_finite(ckpt["model"], str(path))
    check_fits(task.model_builder(ckpt, str(path))[0], ckpt["model"], str(path))


def check_compatible(ckpt: dict[str, Any], model_name: str, model: nn.Module, path: Path) -> None:
    """The checkpoint holds the model the config asks for now, with the same shapes."""
    ck_name = ckpt["meta"].get("model_name")
    if ck_name != model_name:
        raise CheckpointError(
            f"{path} holds a {ck_name!r} checkpoint, but the config asks for {model_name!r}"
        )
    check_fits(lambda: model, ckpt["model"], str(path))


def check_position(path: Path, state: Any, epochs: int, processes: int) -> None:
    """A run can continue from where ``state`` stopped, under ``processes`` processes."""
    if state.epoch >= epochs:
        raise ConfigError(
            f"{path} has already trained {state.epoch} epochs of sched.epochs={epochs}; "
            f"raise --epochs to train on"
        )
    if state.step_in_epoch and state.world_size != processes:
        n = state.world_size
        raise ConfigError(
            f"{path} was stopped mid-epoch under {n} process(es); resume it under {n} "
            f"(torchrun --nproc_per_node={n})"
        )


def restore_schedule(
    scheduler: Scheduler,
    saved: dict[str, Any],
    num_updates: int,
    say: Callable[[str], None] | None,
) -> None:
    """Continue the saved schedule, unless the config now asks for another one.

    The scheduler's state holds its length, so loading it as is would keep a run resumed
    with a larger ``--epochs`` at ``min_lr`` after the old end. A changed schedule is
    rebuilt from the config and picked up at the current update instead. ``say`` tells the
    user (None: quietly, as evaluation does, whose folder may size the epoch differently).
    """
    new = scheduler.state_dict()
    if schedule_shape(saved) == schedule_shape(new):
        scheduler.load_state_dict(saved)
        return
    scheduler.step_update(num_updates=num_updates)
    if say is not None:
        old_total, new_total = (_updates(d) for d in (saved, new))
        say(
            f"the schedule differs from the checkpoint's ({old_total} -> {new_total} "
            f"updates); following the new one from update {num_updates}"
        )


def _updates(state: dict[str, Any]) -> int | str:
    """How many updates a schedule's ``state_dict`` spans (cosine or slanted triangular)."""
    if "t_total" in state:
        return state["t_total"]
    return state.get("t_initial", 0) + state.get("warmup_t", 0)

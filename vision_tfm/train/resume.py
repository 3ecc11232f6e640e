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


def check_weights(ckpt: dict[str, Any], task: Any, path: Path) -> None:
    """Before anything is built: finite weights that fit the model the checkpoint's config
    describes, checked on the meta device (an edited config cannot make a huge model)."""
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

"""The optimiser and learning-rate schedule a run steps, as timm builds them."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import nn

from ..errors import ConfigError
from ..tasks.config import OptimConfig, SchedConfig

FUSED_OPTIMIZERS = ("adam", "adamw")
"""timm names that build torch's ``Adam`` / ``AdamW``, which take ``fused=True``."""


def build_optimizer(model: nn.Module, o: OptimConfig, lr: float) -> torch.optim.Optimizer:
    """timm's optimiser for ``optim``: weight decay off for norms, biases and the model's
    ``no_weight_decay()``; with ``layer_decay``, each group's ``lr_scale`` follows the model's
    ``group_matcher`` (BEiT's ``decay ** (depth + 1 - layer_id)``); ``discriminative`` is
    ULMFiT's form of the same rates, ``decay = 1 / factor``.

    torch's Adam and AdamW run fused where every parameter lives on a CPU or CUDA device: one
    kernel per step instead of several ops per parameter, which on a small model is a large
    part of a CPU training step (``benchmarks/optimizer_step.py``)."""
    kw: dict[str, Any] = {"betas": o.betas} if "adam" in o.opt or "lamb" in o.opt else {}
    if o.opt.lower() in FUSED_OPTIMIZERS and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in model.parameters()
    ):
        kw["fused"] = True
    return create_optimizer_v2(
        model,
        opt=o.opt,
        lr=lr,
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        layer_decay=o.layer_decay or (1 / o.discriminative if o.discriminative else None),
        **kw,
    )


class SlantedTriangularLR(Scheduler):
    """ULMFiT's slanted triangular learning rates (Howard & Ruder 2018, eq. 3), per update:

    ``cut = floor(T * cut_frac)``; ``p = t / cut`` before it, else
    ``1 - (t - cut) / (cut * (1 / cut_frac - 1))``; ``lr_t = lr * (1 + p * (ratio - 1)) / ratio``.

    A short rise lets the model settle on a region of the new task before the long decay
    refines it. Each group keeps its ``lr_scale`` (discriminative rates) on top.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, t_total: int, cut_frac: float, ratio: float
    ) -> None:
        super().__init__(optimizer, "lr", t_in_epochs=False)
        self.t_total, self.cut_frac, self.ratio = t_total, cut_frac, ratio
        self.cut = max(1, math.floor(t_total * cut_frac))
        self.update_groups(self._get_lr(0))

    def _get_lr(self, t: int) -> list[float]:
        cut = self.cut
        p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / self.cut_frac - 1))
        p = max(p, 0.0)  # past T (a resumed run that trains on): the floor, lr / ratio
        return [v * (1 + p * (self.ratio - 1)) / self.ratio for v in self.base_values]


def build_scheduler(
    optimizer: torch.optim.Optimizer, s: SchedConfig, steps_per_epoch: int
) -> Scheduler:
    """The configured schedule over ``s.epochs * steps_per_epoch`` updates."""
    total = s.epochs * steps_per_epoch
    if s.name == "slanted_triangular":
        return SlantedTriangularLR(optimizer, total, s.cut_frac, s.ratio)
    warm = min(int(s.warmup_epochs * steps_per_epoch), max(total - 1, 0))
    with _one_update_cosine_is_meant():
        return CosineLRScheduler(
            optimizer,
            t_initial=max(total - warm, 1),
            lr_min=s.min_lr,
            warmup_t=warm,
            warmup_lr_init=s.warmup_lr,
            warmup_prefix=True,
            t_in_epochs=False,
        )


@contextlib.contextmanager
def _one_update_cosine_is_meant() -> Iterator[None]:
    """timm warns that a cosine of one update "will have no effect on the learning rate";
    here that is the schedule asked for (the warmup takes all but the last update of a short
    run: the peak rate, then ``min_lr``), so that one message is dropped while it is built."""
    log = logging.getLogger(CosineLRScheduler.__module__)

    def keep(record: logging.LogRecord) -> bool:
        return "will have no effect" not in record.getMessage()

    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


def schedule_shape(state: dict[str, Any]) -> dict[str, Any]:
    """What defines a schedule in its ``state_dict``: its scalar settings (lengths, rates),
    not its progress or the optimiser's base rates. Two equal shapes are one schedule."""
    scalar = (int, float, str, bool, type(None))
    return {k: v for k, v in state.items() if k != "metric" and isinstance(v, scalar)}


def group_ids(model: nn.Module) -> dict[str, int]:
    """Each parameter's group in the model's ``group_matcher`` (as ``layer_decay`` groups
    them): 0 the deepest (the embeddings), the highest the head and whatever follows it."""
    from timm.models import group_parameters

    if not hasattr(model, "group_matcher"):
        raise ConfigError(
            f"{type(model).__name__} has no group_matcher(): optim.unfreeze and "
            "optim.discriminative need the model's parameter groups"
        )
    ids = group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    top = max(ids.values()) + 1
    return {n: ids.get(n, top) for n, _ in model.named_parameters()}


def unfreeze(model: nn.Module, ids: dict[str, int], epoch: int, every: int) -> None:
    """Gradual unfreezing at ``epoch`` (0-based): the top group trains for ``every`` epochs,
    then each group below joins after as many more. Sets ``requires_grad``: a frozen
    parameter gets no gradient, so the optimiser leaves it and its state alone."""
    lowest = max(ids.values()) - epoch // every
    for name, p in model.named_parameters():
        p.requires_grad_(ids[name] >= lowest)


def build_training(
    model: nn.Module, cfg: Any, batch_size: int, num_batches: int, grad_scaler: bool
) -> tuple[ModelEmaV3 | None, torch.optim.Optimizer, Scheduler, Any, float]:
    """What a run steps besides the model: its EMA (None when off), optimiser, schedule,
    gradient scaler (on with ``grad_scaler``: fp16 AMP) and learning rate. ``batch_size``
    counts every process; ``num_batches`` is one process's epoch."""
    o = cfg.optim
    ema = None
    if cfg.ema.enabled:
        ema = ModelEmaV3(model, decay=cfg.ema.decay, use_warmup=cfg.ema.warmup)
    global_batch = batch_size * o.accum_steps
    lr = o.lr * global_batch / o.lr_base_batch if o.lr_base_batch > 0 else o.lr
    optimizer = build_optimizer(model, o, lr)
    # a shorter last accumulation group is stepped too
    scheduler = build_scheduler(
        optimizer, cfg.sched, max(1, math.ceil(num_batches / o.accum_steps))
    )
    device = next(model.parameters()).device.type
    return ema, optimizer, scheduler, torch.amp.GradScaler(device, enabled=grad_scaler), lr

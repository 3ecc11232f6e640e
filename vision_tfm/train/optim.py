"""The optimiser and learning-rate schedule a run steps, as timm builds them."""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch import nn

from ..tasks.config import OptimConfig, SchedConfig

FUSED_OPTIMIZERS = ("adam", "adamw")
"""timm names that build torch's ``Adam`` / ``AdamW``, which take ``fused=True``."""


def build_optimizer(model: nn.Module, o: OptimConfig, lr: float) -> torch.optim.Optimizer:
    """timm's optimiser for ``optim``: weight decay off for norms, biases and the model's
    ``no_weight_decay()``; with ``layer_decay``, each group's ``lr_scale`` follows the model's
    ``group_matcher`` (BEiT's ``decay ** (depth + 1 - layer_id)``).

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
        layer_decay=o.layer_decay or None,
        **kw,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, s: SchedConfig, steps_per_epoch: int
) -> CosineLRScheduler:
    """Linear warmup then cosine decay, stepped every optimiser update."""
    total = s.epochs * steps_per_epoch
    warm = min(int(s.warmup_epochs * steps_per_epoch), max(total - 1, 0))
    return CosineLRScheduler(
        optimizer,
        t_initial=max(total - warm, 1),
        lr_min=s.min_lr,
        warmup_t=warm,
        warmup_lr_init=s.warmup_lr,
        warmup_prefix=True,
        t_in_epochs=False,
    )


def build_training(
    model: nn.Module, cfg: Any, batch_size: int, num_batches: int, grad_scaler: bool
) -> tuple[ModelEmaV3 | None, torch.optim.Optimizer, CosineLRScheduler, Any, float]:
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

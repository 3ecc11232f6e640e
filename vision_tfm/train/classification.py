"""Classification as an engine :class:`~vision_tfm.train.engine.Task`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from ..config import ConfigError
from ..data import AugConfig, DataConfig, build_cls_datasets
from ..models.registry import get_model_entry
from .checkpoint import checkpoint_builder, restore_model
from .config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig, grasp_models
from .distributed import all_reduce_sum
from .logging import plot_confusion, plot_curves


@dataclass
class ClsConfig:
    """Everything a classification run needs; YAML files override parts of it."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    aug: AugConfig = field(default_factory=AugConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        a = self.aug  # timm's Mixup pairs each image with its mirror: it asserts an even batch
        if (a.mixup > 0 or a.cutmix > 0) and self.data.batch_size % 2:
            raise ConfigError(
                f"aug.mixup / aug.cutmix need an even data.batch_size (per process), "
                f"got {self.data.batch_size}"
            )


def build_cls_model(
    model_cfg: ModelConfig, num_classes: int, in_chans: int, img_size: int, pretrained: bool = True
) -> nn.Module:
    """Create the registered model with the data's class count, channels and size."""
    entry = get_model_entry(model_cfg.name)
    if model_cfg.name in grasp_models():  # else: "unknown config key 'num_classes'"
        raise ConfigError(
            f"model.name={model_cfg.name!r} is a grasp model, not a classifier; "
            "train it with train_grasp.py"
        )
    kw: dict[str, Any] = {"num_classes": num_classes, "in_chans": in_chans}
    if hasattr(entry.cfg, "img_size"):
        kw["img_size"] = img_size
    return model_cfg.create(pretrained, **kw)


def _build_for_meta(cfg: ClsConfig, meta: dict[str, Any], pretrained: bool) -> nn.Module:
    return build_cls_model(
        cfg.model, meta["num_classes"], meta["in_chans"], meta["img_size"], pretrained
    )


class ClassificationTask:
    """Cross-entropy (or timm Mixup/CutMix soft targets) with top-1/top-5 evaluation."""

    metric = "top1"

    def __init__(self, cfg: ClsConfig) -> None:
        self.cfg = cfg
        self.batch_size = cfg.data.batch_size
        self.num_workers = cfg.data.num_workers
        self.data = None
        self.mixup = None

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        cfg = self.cfg
        self.data = data = build_cls_datasets(cfg.data, cfg.aug)
        model = build_cls_model(
            cfg.model, data.num_classes, data.in_chans, cfg.data.img_size, pretrained
        )
        a = cfg.aug
        if a.mixup > 0 or a.cutmix > 0:
            self.mixup = Mixup(
                mixup_alpha=a.mixup,
                cutmix_alpha=a.cutmix,
                prob=a.mixup_prob,
                switch_prob=a.mixup_switch_prob,
                label_smoothing=a.label_smoothing,
                num_classes=data.num_classes,
            )
            self.soft_ce = SoftTargetCrossEntropy()
        meta = {
            "task": "cls",
            "model_name": cfg.model.name,
            "num_classes": data.num_classes,
            "in_chans": data.in_chans,
            "img_size": cfg.data.img_size,
            "class_names": list(data.class_names),
            "mean": list(data.mean),
            "std": list(data.std),
        }
        return model, data.train, data.val, meta

    def collate(self, batch: list) -> Any:
        return default_collate(batch)

    @staticmethod
    def model_builder(
        ckpt: dict[str, Any], source: str = "checkpoint"
    ) -> tuple[Callable[[], nn.Module], ClsConfig]:
        """Rebuilds ``ckpt``'s classifier (the engine checks a resumed checkpoint with it)."""
        return checkpoint_builder(ckpt, ClsConfig(), _build_for_meta, source)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        if self.mixup is not None:
            x, y_soft = self.mixup(x, y)
            return self.soft_ce(model(x), y_soft), x.shape[0]
        smoothing = self.cfg.aug.label_smoothing
        return F.cross_entropy(model(x), y, label_smoothing=smoothing), x.shape[0]

    def predict(self, model: nn.Module, loader: DataLoader, device: torch.device):
        """Logits and labels over a loader (this rank's shard)."""
        outs, labels = [], []
        for x, y in loader:
            outs.append(model(x.to(device)).float().cpu())
            labels.append(y)
        return torch.cat(outs), torch.cat(labels)

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        logits, y = self.predict(model, loader, device)
        k = min(5, logits.shape[1])
        topk = logits.topk(k, dim=1).indices
        counts = torch.tensor(
            [
                (topk[:, 0] == y).sum(),
                (topk == y[:, None]).any(1).sum(),
                len(y),
                F.cross_entropy(logits, y, reduction="sum"),
            ],
            dtype=torch.float64,
        )
        c1, c5, n, loss_sum = all_reduce_sum(counts).tolist()
        return {"top1": c1 / n, "top5": c5 / n, "val_loss": loss_sum / n}

    def finish(self, model: nn.Module, loader: DataLoader, run_dir: Path, history: list) -> None:
        plot_curves(history, run_dir / "curves.png", ["top1", "top5", "ema_top1"])
        with torch.no_grad():
            logits, y = self.predict(model.eval(), loader, next(model.parameters()).device)
        n = len(self.data.class_names)
        cm = np.zeros((n, n), dtype=np.int64)
        np.add.at(cm, (y.numpy(), logits.argmax(1).numpy()), 1)
        plot_confusion(cm, self.data.class_names, run_dir / "confusion.png")

    def summary(self, metrics: dict[str, float]) -> str:
        return f"val top1: {metrics['top1']:.4f}"


def restore_cls_model(
    ckpt: dict[str, Any], use_ema: bool | None = None, source: str = "checkpoint"
) -> tuple[nn.Module, ClsConfig]:
    """Rebuild a trained classifier (see :func:`~vision_tfm.train.checkpoint.restore_model`)."""
    return restore_model(ckpt, "cls", ClassificationTask.model_builder, use_ema, source)


def eval_data_config(cfg: ClsConfig, meta: dict[str, Any]) -> DataConfig:
    """The data config that reproduces a checkpoint's validation preprocessing."""
    return replace(
        cfg.data,
        img_size=meta["img_size"],
        in_chans=meta["in_chans"],
        mean=tuple(meta["mean"]),
        std=tuple(meta["std"]),
    )

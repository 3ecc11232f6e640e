"""Image classification: cross-entropy (or timm Mixup/CutMix soft targets), top-1/top-5."""

from __future__ import annotations

import csv
import io
import math
import re
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

from ..config import ConfigError, apply_overrides
from ..constants import IMAGENET_MEAN, IMAGENET_STD
from ..data import AugConfig, DataConfig, build_cls_datasets, build_eval_transform
from ..data.folder import ImageList, list_images
from ..distributed import all_reduce_sum
from ..models import check_input_memory, get_model_entry, load_pretrained
from ..viz import plot_confusion, plot_curves
from .base import Runner, Task, TopGrasp, register_task
from .config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig
from .spec import DOC, SIZE_ORDER, convert_step, decode_step


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
    ClassificationTask.check_model(model_cfg.name)  # else: "unknown config key 'num_classes'"
    kw: dict[str, Any] = {"num_classes": num_classes, "in_chans": in_chans}
    if hasattr(get_model_entry(model_cfg.name).cfg, "img_size"):
        kw["img_size"] = img_size
    return model_cfg.create(pretrained, **kw)


def eval_data_config(cfg: ClsConfig, meta: dict[str, Any]) -> DataConfig:
    """The data config that reproduces a checkpoint's validation preprocessing."""
    return replace(
        cfg.data,
        img_size=meta["img_size"],
        in_chans=meta["in_chans"],
        mean=tuple(meta["mean"]),
        std=tuple(meta["std"]),
    )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


MIN_STD = 1e-6
"""The least normalisation std a checkpoint may state: below it no pixel statistic is meant,
and a tiny std (1e-45 underflows float32) turns every input into inf."""


def _floats(v: Any, n: int) -> bool:
    return (
        isinstance(v, list)
        and len(v) == n
        and all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
    )


CLS_SPEC = f"{DOC}#classification-preprocessing"
CLS_CONTRACT = "vision_tfm.cls.preprocess/2"
"""The preprocessing ``vtfm predict`` applies; its rules: docs/deployment.md. Bump the number
when a step changes (/2: the steps are an ordered list, decoding and luma stated)."""


def cls_preprocess(img_size: int, crop_pct: float, in_chans: int, mean: Any, std: Any) -> dict:
    """``vtfm predict``'s preprocessing as the ordered steps a runtime without vision_tfm
    repeats; each step links the section of ``docs/deployment.md`` that states its rules
    (``examples/onnx_client.py`` follows them)."""
    mode = "L" if in_chans == 1 else "RGB"
    return {
        "contract": CLS_CONTRACT,
        "spec": CLS_SPEC,
        "steps": [
            decode_step(),
            convert_step(mode),
            {
                "op": "resize_short_side",
                "spec": CLS_SPEC,
                "size": int(img_size / crop_pct),
                "long_side": "max(1, round(long * size / short)), float64, half to even",
                "kernel": "bicubic, Keys a = -0.75, 4 taps clamped to the edge",
                "weights": "float32, times 2048, rounded half to even to integers",
                "arithmetic": "int64, along W then H; (v + 2**21) >> 22 clipped to 0..255",
                "not": "not OpenCV's cv2.resize, whose vectorised code rounds otherwise",
            },
            {
                "op": "center_crop",
                "spec": CLS_SPEC,
                "size": [img_size, img_size],  # [H, W]
                "offset": "top = (height - H) // 2, left = (width - W) // 2",
            },
            {
                "op": "normalize",
                "spec": CLS_SPEC,
                "mean": [float(v) for v in mean],
                "std": [float(v) for v in std],
                "dtype": "float32",
                "formula": "(v - mean * 255) * (1 / (std * 255)), mean and std cast to float32",
            },
            {
                "op": "to_tensor",
                "spec": CLS_SPEC,
                "layout": "NCHW",
                "dtype": "float32",
                "channels": list(mode),
            },
        ],
    }


@register_task
class ClassificationTask(Task):
    """Cross-entropy (or timm Mixup/CutMix soft targets) with top-1/top-5 evaluation."""

    name = "cls"
    title = "classification"
    script = "train_cls.py"
    metric = "top1"
    output_names = ("logits",)
    config_cls = ClsConfig
    table_words = {
        "outputs": "logits",
        "views": "val images",
        "spread": "its top-1 takes {fp32_top1_classes} distinct classes",
    }
    meta_checks = {
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
            lambda v, m: _floats(v, m.get("in_chans")) and min(v) >= MIN_STD,
            f"one number >= {MIN_STD} per channel",
        ),
    }

    def __init__(self, cfg: ClsConfig) -> None:
        super().__init__(cfg)
        self.data = None
        self.mixup = None

    @staticmethod
    def accepts(output_maps: tuple[str, ...]) -> bool:
        return not output_maps

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        cfg = self.cfg
        self.data = data = build_cls_datasets(cfg.data, cfg.aug)
        model = build_cls_model(
            cfg.model, data.num_classes, data.in_chans, cfg.data.img_size, pretrained
        )
        size = (cfg.data.img_size,) * 2
        check_input_memory(model, self.batch_size, size, "data.batch_size", training=True)
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
            "task": self.name,
            "model_name": cfg.model.name,
            "num_classes": data.num_classes,
            "in_chans": data.in_chans,
            "img_size": cfg.data.img_size,
            "class_names": list(data.class_names),
            "mean": list(data.mean),
            "std": list(data.std),
        }
        return model, data.train, data.val, meta

    @staticmethod
    def collate(batch: list) -> Any:
        return default_collate(batch)

    @classmethod
    def build_model(cls, cfg: ClsConfig, meta: dict[str, Any], pretrained: bool) -> nn.Module:
        return build_cls_model(
            cfg.model, meta["num_classes"], meta["in_chans"], meta["img_size"], pretrained
        )

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        if self.mixup is not None:
            x, y_soft = self.mixup(x, y)
            return self.soft_ce(model(x), y_soft), x.shape[0]
        smoothing = self.cfg.aug.label_smoothing
        return F.cross_entropy(model(x), y, label_smoothing=smoothing), x.shape[0]

    @staticmethod
    def predict(
        model: nn.Module, loader: DataLoader, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and labels over a loader (this rank's shard)."""
        outs, labels = [], []
        for x, y in loader:
            outs.append(model(x.to(device)).float().cpu())
            labels.append(y)
        return torch.cat(outs), torch.cat(labels)

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        """top-1, top-5 (only past 5 classes, where it is not 1 by construction) and the
        mean validation loss."""
        logits, y = self.predict(model, loader, device)
        topk = logits.topk(min(5, logits.shape[1]), dim=1).indices
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
        top5 = {"top5": c5 / n} if logits.shape[1] > 5 else {}
        return {"top1": c1 / n, **top5, "val_loss": loss_sum / n}

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

    def run_name(self, meta: dict[str, Any]) -> str:
        """``<model>-<data folder>`` for a user's data (``vit_small_patch16_224-flowers``), so
        runs on different folders tell themselves apart; the model alone for MNIST."""
        if self.cfg.data.name == "mnist" or not self.cfg.data.root:
            return meta["model_name"]
        folder = Path(self.cfg.data.root).expanduser().resolve().name
        return f"{meta['model_name']}-{re.sub(r'[^A-Za-z0-9._-]+', '_', folder) or 'data'}"

    def run_files(self) -> dict[str, str]:
        """``split.csv`` when the val share was held out of a flat class folder here: each
        image's side, class and path under ``data.root``, so the split can be checked or
        reused outside this package."""
        split = self.data.split if self.data is not None else None
        if not split:
            return {}
        root, names = Path(self.cfg.data.root), self.data.class_names
        text = io.StringIO()
        rows = csv.writer(text, lineterminator="\n")
        rows.writerow(["split", "class", "path"])
        for side in ("train", "val"):
            rows.writerows(
                [side, names[label], path.relative_to(root).as_posix()]
                for path, label in split[side]
            )
        return {"split.csv": text.getvalue()}

    # --- export -----------------------------------------------------------------------

    def data_root(self) -> str | None:
        return None if self.cfg.data.name == "mnist" else self.cfg.data.root or None

    def eval_datasets(self, meta: dict[str, Any]) -> tuple[Dataset, Dataset]:
        # kind="none" with every other augmentation at its default (off) makes the train
        # transform identical to the eval one, which is what calibration wants.
        data = build_cls_datasets(eval_data_config(self.cfg, meta), AugConfig(kind="none"))
        return data.train, data.val

    def folder_dataset(self, meta: dict[str, Any], root: Path, what: str = "images") -> Dataset:
        transform = build_eval_transform(eval_data_config(self.cfg, meta))
        return ImageList(list_images(root, what), meta["in_chans"], transform)

    def score(
        self, runner: Runner, batch: tuple, labelled: bool
    ) -> tuple[list[torch.Tensor], int, list[TopGrasp] | None]:
        out = [t.float() for t in runner(batch[0])]
        hits = int((out[0].argmax(1) == batch[1]).sum().item()) if labelled else 0
        return out, hits, None

    def deploy_spec(self, meta: dict[str, Any], img_size: tuple[int, int]) -> dict[str, Any]:
        m = meta
        return {
            "size_order": SIZE_ORDER,
            "class_names": m["class_names"],
            "preprocess": cls_preprocess(
                img_size[0], self.cfg.data.crop_pct, m["in_chans"], m["mean"], m["std"]
            ),
            "postprocess": {
                "spec": CLS_SPEC,
                "output": "logits",
                "probabilities": "softmax over the last axis",
                "labels": "class_names[i] for output index i",
            },
        }

    @classmethod
    def from_registered(
        cls, name: str, img_size: int, images: Path, weights: Path | None
    ) -> tuple[nn.Module, ClsConfig, dict[str, Any]]:
        entry = get_model_entry(name)
        over = {"model.name": name, "data.name": "imagefolder", "data.root": str(images)}
        cfg = apply_overrides(ClsConfig(), {**over, "data.img_size": img_size})
        in_chans = entry.cfg.in_chans
        model = build_cls_model(cfg.model, entry.cfg.num_classes, in_chans, img_size)
        if weights is not None:
            load_pretrained(model, weights)
        gray = in_chans == 1
        meta = {
            "in_chans": in_chans,
            "num_classes": entry.cfg.num_classes,
            "class_names": [str(i) for i in range(entry.cfg.num_classes)],
            "mean": [0.5] if gray else list(IMAGENET_MEAN),
            "std": [0.5] if gray else list(IMAGENET_STD),
        }
        return model, cfg, meta

"""Grasp detection: dense maps regressed per pixel, scored by the rectangle metric.

Dense maps are regressed with smooth-L1 (or MSE), as in GG-CNN / GR-ConvNet, the quality
logits with BCE; validation decodes the top-n grasps per view and scores them with the
rectangle metric (angle within 30 degrees and IoU > 0.25 against any ground-truth rectangle).

Validation crops at the image centre, as deployment does (``predict_grasps``); the GG-CNN
figure, with the crop centred on the ground truth, is reported beside it for comparison with
papers and is never the headline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from ...config import ConfigError, apply_overrides
from ...constants import MAP_KEYS
from ...data.grasp import (
    IN_CHANS,
    CornellGrasp,
    GraspAugment,
    GraspDataset,
    JacquardGrasp,
    grasp_collate,
)
from ...data.grasp.dataset import view_options
from ...data.grasp.synthetic import SceneSettings, SyntheticGrasp, is_synthetic_root
from ...data.grasp.synthetic import datasets_from_config as grasp_datasets_from_config
from ...data.grasp.synthetic import parse_root as parse_synthetic_root
from ...data.loaders import close_loader
from ...distributed import all_reduce_sum
from ...grasp import (
    activate_grasp_maps,
    batch_grasp_correct,
    decode_grasps,
    grasp_correct,
    split_maps,
)
from ...models import check_input_memory
from ...viz import plot_curves
from ..base import Runner, Task, TopGrasp, register_task
from ..config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig
from ..spec import SIZE_ORDER
from .config import GraspDataConfig, GraspEvalConfig, GraspLossConfig
from .inference import GraspMaps, display_image, draw_grasps, flip_averaged, grasp_maps
from .spec import grasp_postprocess, grasp_preprocess

HEADLINES = {"grasp_acc": "", "grasp_acc_gt_crop": ", GG-CNN ground-truth-centred crop"}
"""The headline metrics, each with what its printed line adds (printed in reverse)."""
AUG_KEYS = ("zoom", "translate", "color_jitter", "depth_noise")
"""Data settings that :class:`GraspAugment` takes by name."""


@dataclass
class GraspConfig:
    """Everything a grasp run needs."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(name="grasp_hybrid_s"))
    data: GraspDataConfig = field(default_factory=GraspDataConfig)
    loss: GraspLossConfig = field(default_factory=GraspLossConfig)
    eval: GraspEvalConfig = field(default_factory=GraspEvalConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=2e-3, weight_decay=0.01))
    sched: SchedConfig = field(default_factory=lambda: SchedConfig(epochs=50, warmup_epochs=2))
    ema: EmaConfig = field(default_factory=EmaConfig)
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/grasp"))

    def __post_init__(self) -> None:
        """Refuse a classifier where the config enters (training and restore both build one):
        its logits would fail in the loss as an IndexError."""
        GraspTask.check_model(self.model.name)


def build_grasp_model(cfg: GraspConfig, pretrained: bool = True) -> nn.Module:
    """The registered grasp model with channels from the configured input."""
    return cfg.model.create(pretrained, in_chans=IN_CHANS[cfg.data.input])


@register_task
class GraspTask(Task):
    """Map regression with rectangle-metric validation."""

    name = "grasp"
    title = "grasp"
    script = "train_grasp.py"
    metric = "grasp_acc"
    output_names = ("maps",)
    config_cls = GraspConfig
    scores_at_train_size = True  # rectangles are labelled in the pixels of the training size
    table_words = {
        "agree_head": "top grasp agree",
        "outputs": "the four activated maps",
        "views": "val views cropped at the image centre (deployment)",
        "spread": "its top grasp falls on {fp32_top_grasp_pixels} distinct pixels",
        "agree_note": "; top grasp agree: the view's best grasp is on fp32 PyTorch's peak pixel "
        "with the angle within 30 degrees; max abs diff over the four activated maps",
    }
    meta_checks = {"in_chans": (lambda v, m: v in (1, 3, 4) and type(v) is int, "1, 3 or 4")}

    def __init__(self, cfg: GraspConfig) -> None:
        super().__init__(cfg)
        self.split_name = ""
        self.val_gt: GraspDataset | None = None
        self._gt: tuple[DataLoader, DataLoader] | None = None  # (val loader, its GG-CNN twin)

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        d, seed = self.cfg.data, self.cfg.run.seed
        aug: GraspAugment | bool = False
        if d.augment:
            aug_kw = {k: getattr(d, k) for k in AUG_KEYS}
            aug = GraspAugment(rotate=(-d.rotate, d.rotate), seed=seed, **aug_kw)
        if d.score_all:  # a folder the model did not train on: every view is scored
            train = val = grasp_all_views(self.cfg)
            self.split_name = f"all {len(val)} views"
        else:
            train, val, self.split_name = grasp_datasets_from_config(
                d, seed, augment=aug, train_crop=d.train_crop, repeat=d.repeat, cache=d.cache
            )
        self.val_gt = val.recropped("grasps")
        model = build_grasp_model(self.cfg, pretrained)
        size = (d.output_size,) * 2
        check_input_memory(model, self.batch_size, size, "data.batch_size", training=True)
        meta = {
            "task": self.name,
            "model_name": self.cfg.model.name,
            "in_chans": IN_CHANS[d.input],
            "input": d.input,
            "img_size": d.output_size,
            "crop_size": d.crop_size,
            "width_scale": d.width_scale,
            "split": self.split_name,
            "val_ids": list(val.ids),
        }
        return model, train, val, meta

    @property
    def headlines(self) -> dict[str, str]:
        return HEADLINES

    @staticmethod
    def accepts(output_maps: tuple[str, ...]) -> bool:
        return tuple(output_maps) == MAP_KEYS

    @staticmethod
    def collate(batch: list) -> Any:
        return grasp_collate(batch)

    @classmethod
    def build_model(cls, cfg: GraspConfig, meta: dict[str, Any], pretrained: bool) -> nn.Module:
        return build_grasp_model(cfg, pretrained)

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, maps, _ = batch
        out = model(x.to(device, non_blocking=True))
        maps = {k: v.to(device) for k, v in maps.items()}
        c = self.cfg.loss
        fn = {"smooth_l1": F.smooth_l1_loss, "mse": F.mse_loss}[c.maps]
        logits = {k: v.float() for k, v in out.items()}
        act = activate_grasp_maps(logits)
        if c.quality == "bce":
            loss = F.binary_cross_entropy_with_logits(logits["quality"], maps["quality"])
        else:
            loss = fn(act["quality"], maps["quality"])
        mask = (maps["quality"] > 0).float() if c.geometry == "graspable" else None
        if c.width_space == "log":  # log(sigmoid(z)) without underflow; the target is > 0 there
            act["width"] = F.logsigmoid(logits["width"])
            maps["width"] = maps["width"].clamp(min=1e-6).log()
        for k in ("cos", "sin", "width"):
            w = c.width_weight if k == "width" else 1.0
            if mask is None:
                loss = loss + w * fn(act[k], maps[k])
            else:
                err = fn(act[k], maps[k], reduction="none")
                loss = loss + w * (err * mask).sum() / mask.sum().clamp(min=1)
        return loss, x.shape[0]

    def _decode_kw(self) -> dict[str, Any]:
        return self.cfg.eval.decode_kwargs(self.cfg.data.width_scale)

    def _hits(self, model: nn.Module, loader: Any, device: torch.device) -> torch.Tensor:
        """``[top-1 correct, top-n correct, views]`` over ``loader``, summed across ranks."""
        hits = torch.zeros(3, dtype=torch.float64)
        n = self.cfg.eval.top_n
        for x, _, rects in loader:
            maps = grasp_maps(model, x.to(device), self.cfg.eval.flip_tta)
            out = {k: v.float().cpu() for k, v in maps.items()}
            top1 = batch_grasp_correct(out, rects, top_n=1, **self._decode_kw())
            topn = batch_grasp_correct(out, rects, top_n=n, **self._decode_kw()) if n > 1 else top1
            hits += torch.tensor([sum(top1), sum(topn), len(rects)], dtype=torch.float64)
        return all_reduce_sum(hits)

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        """``grasp_acc`` on the deployment (centre) crop, ``grasp_acc_gt_crop`` on GG-CNN's."""
        c1, cn, views = self._hits(model, loader, device).tolist()
        metrics = {"grasp_acc": c1 / views}
        if self.cfg.eval.top_n > 1:
            metrics[f"grasp_acc_top{self.cfg.eval.top_n}"] = cn / views
        if self.val_gt is not None:
            g1, _, g_views = self._hits(model, self._gt_loader(loader), device).tolist()
            metrics["grasp_acc_gt_crop"] = g1 / g_views
        return metrics

    def _gt_loader(self, loader: DataLoader) -> DataLoader:
        """The same views and rank shards as ``loader``, cropped around the labels; one
        loader per val loader, so its workers (and the views they cache) outlive an epoch."""
        if self._gt is None or self._gt[0] is not loader:
            gt = DataLoader(
                self.val_gt,
                batch_sampler=loader.batch_sampler,
                num_workers=loader.num_workers,
                collate_fn=loader.collate_fn,
                persistent_workers=loader.num_workers > 0,
                worker_init_fn=loader.worker_init_fn,  # stop signals: the main process's
            )
            self._gt = (loader, gt)
        return self._gt[1]

    def close(self) -> None:
        if self._gt is not None:
            close_loader(self._gt[1])
            self._gt = None

    def finish(self, model: nn.Module, loader: DataLoader, run_dir: Path, history: list) -> None:
        plot_curves(history, run_dir / "curves.png", ["grasp_acc", "ema_grasp_acc"])
        device = next(model.parameters()).device
        x, _, rects = next(iter(loader))
        with torch.no_grad():
            maps = grasp_maps(model.eval(), x.to(device), self.cfg.eval.flip_tta)
            out = {k: v.float().cpu() for k, v in maps.items()}
        for i in range(min(4, len(rects))):
            view = {k: out[k][i, 0].numpy() for k in MAP_KEYS}
            preds = decode_grasps(**view, num_grasps=1, **self._decode_kw())
            img = display_image(x[i], self.cfg.data.input, self.cfg.data.normalise)
            draw_grasps(img, preds, rects[i], run_dir / f"val_overlay_{i}.png")

    def summary(self, metrics: dict[str, float]) -> str:
        """Two lines: the GG-CNN ground-truth-centred figure, then the headline (centre crop)."""
        split = self.split_label()
        return "\n".join(
            f"grasp acc ({split}, top-1{label}): {metrics[m]:.2f}"
            for m, label in reversed(HEADLINES.items())
            if m in metrics
        )

    # --- export -----------------------------------------------------------------------

    @staticmethod
    def deploy_model(model: nn.Module) -> nn.Module:
        return GraspMaps(model)  # the graph ends in the activations, not the logits

    def deploy_img_size(self) -> int:
        return self.cfg.data.output_size

    def eval_datasets(self, meta: dict[str, Any]) -> tuple[Dataset, Dataset]:
        root = self.data_root()
        if root is None:
            raise ConfigError("the grasp checkpoint names no data.root, so there is no val set")
        return grasp_split(self.cfg, root)

    def folder_dataset(self, meta: dict[str, Any], root: Path, what: str = "images") -> Dataset:
        return ConcatDataset(grasp_split(self.cfg, root, folder=True))

    def score(
        self, runner: Runner, batch: tuple, labelled: bool
    ) -> tuple[list[torch.Tensor], int, list[TopGrasp] | None]:
        """Maps decoded as validation decodes them (``eval.flip_tta`` included) into each
        view's top grasp, which the rectangle metric scores on labelled views."""
        x = batch[0]
        maps = flip_averaged(lambda v: split_maps(runner(v)[0]), x, self.cfg.eval.flip_tta)
        out = [maps[k].float() for k in MAP_KEYS]
        hits, tops, kw = 0, [], self._decode_kw()
        for i in range(len(x)):
            preds = decode_grasps(*[o[i] for o in out], num_grasps=1, **kw)
            tops.append((preds[0].x, preds[0].y, preds[0].angle) if preds else None)
            if labelled:
                hits += grasp_correct(preds, batch[2][i])
        return out, hits, tops

    def deploy_spec(self, meta: dict[str, Any], img_size: tuple[int, int]) -> dict[str, Any]:
        return {
            "input": meta.get("input"),
            "size_order": SIZE_ORDER,
            "preprocess": grasp_preprocess(self.cfg),
            "postprocess": grasp_postprocess(self.cfg),
        }

    @classmethod
    def from_registered(
        cls, name: str, img_size: int, images: Path, weights: Path | None
    ) -> tuple[nn.Module, GraspConfig, dict[str, Any]]:
        if weights is not None:
            raise ConfigError(f"--weights converts classifier weights; {name} is a grasp model")
        jacquard = next(images.rglob("*_perfect_depth.tiff"), None) is not None
        over = {
            "model.name": name,
            "data.dataset": "jacquard" if jacquard else "cornell",
            "data.root": str(images),
            "data.output_size": img_size,
        }
        cfg = apply_overrides(GraspConfig(), over)
        d = cfg.data
        meta = {
            "in_chans": IN_CHANS[d.input],
            "input": d.input,
            "crop_size": d.crop_size,
            "width_scale": d.width_scale,
        }
        return build_grasp_model(cfg), cfg, meta

    # --- k-fold cross-validation --------------------------------------------------------

    @classmethod
    def fold_config(cls, cfg: GraspConfig, folds: int, k: int) -> GraspConfig:
        return apply_overrides(cfg, {"data.folds": folds, "data.fold": k})

    def fold_record(self, val: Dataset) -> dict[str, Any]:
        return {"split": self.split_name, "val_ids": list(val.ids)}

    def split_label(self) -> str:
        if self.cfg.data.score_all:
            return self.split_name  # "all N views": the count is on the result line
        if self.cfg.data.dataset == "synthetic":
            return f"synthetic, {self.cfg.data.split}-wise"
        return f"{self.cfg.data.split}-wise"

    def fold_line(self, row: dict[str, Any], folds: int) -> str:
        split = self.split_label()
        return (
            f"fold {row['fold']}/{folds}: grasp acc ({split}, top-1): {row['grasp_acc']:.2f} | "
            f"GG-CNN ground-truth-centred crop: {row['grasp_acc_gt_crop']:.2f} "
            f"({row['train_time_s'] / 60:.1f} min)"
        )

    def cv_summary(self, result: dict[str, Any], folds: int) -> str:
        split = self.split_label()
        return "\n".join(
            f"grasp acc ({split} {folds}-fold, top-1{label}): "
            f"{result[m]['mean']:.2f} ± {result[m]['std']:.2f}"
            for m, label in reversed(HEADLINES.items())
        )


def dataset_of(root: str | os.PathLike) -> str:
    """The dataset a ``--data`` value names: generated scenes, or a folder's layout."""
    if is_synthetic_root(str(root)):
        return "synthetic"
    return "jacquard" if next(Path(root).rglob("*_RGB.png"), None) is not None else "cornell"


def grasp_all_views(cfg: Any, root: str | os.PathLike | None = None) -> GraspDataset:
    """Every view under ``root`` (or ``cfg.data.root``), preprocessed as validation is; a
    ``root`` other than the config's is read in its own layout (a model pre-trained on
    generated scenes scored on a Cornell folder)."""
    d = cfg.data
    if root is not None and str(root) != str(d.root):
        d = replace(d, dataset=dataset_of(root))
    root = str(root or d.root)
    opts = view_options(d)
    if d.dataset == "synthetic":
        settings = SceneSettings.from_dict(d.synthetic)
        return SyntheticGrasp(range(parse_synthetic_root(root)), settings, **opts)
    cls = {"cornell": CornellGrasp, "jacquard": JacquardGrasp}[d.dataset]
    return cls(root, **opts)


def grasp_split(cfg: Any, root: str | os.PathLike, folder: bool = False) -> tuple[Dataset, Dataset]:
    """(train, val) of a config's grasp split under ``root``, both preprocessed as validation
    is. ``folder``: any folder of views (calibration), split by default rules, so a fold
    checkpoint's ``data.folds`` does not ask a small folder for that many views."""
    d, seed = cfg.data, cfg.run.seed
    if folder:
        d, seed = replace(d, split="image", folds=0, fold=0), 0
    train, val, _ = grasp_datasets_from_config(d, seed, root)
    return train, val

"""Grasp detection as an engine :class:`~vision_tfm.train.engine.Task`, and k-fold CV.

Dense maps are regressed with smooth-L1 (or MSE), as in GG-CNN / GR-ConvNet, the quality
logits with BCE; validation decodes the top-n grasps per view and scores them with the
rectangle metric (angle within 30 degrees and IoU > 0.25 against any ground-truth rectangle).

Validation crops at the image centre, as deployment does (``predict_grasps``); the GG-CNN
figure, with the crop centred on the ground truth, is reported beside it for comparison with
papers and is never the headline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..config import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    ConfigError,
    Range,
    config_to_dict,
)
from ..data.grasp import (
    CROP_MODES,
    IN_CHANS,
    NORMALISE_MODES,
    RGB_MEAN,
    RGB_STD,
    GraspAugment,
    GraspDataset,
    grasp_collate,
    grasp_datasets_from_config,
)
from ..grasp import (
    MAP_KEYS,
    WIDTH_SCALE,
    activate_grasp_maps,
    batch_grasp_correct,
    decode_grasps,
    draw_grasps,
    grasp_maps,
)
from ..models import get_model_entry
from .checkpoint import checkpoint_builder, restore_model
from .config import (
    Checked,
    EmaConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SchedConfig,
    grasp_models,
)
from .distributed import all_reduce_sum
from .logging import plot_curves

_MAP_LOSSES = {"smooth_l1": F.smooth_l1_loss, "mse": F.mse_loss}
_QUALITY_LOSSES = ("bce", "regress")
_GEOMETRY = ("all", "graspable")
_WIDTH_SPACES = ("linear", "log")
# the headline metrics, each with what its printed line adds (printed in reverse)
_HEADLINES = {"grasp_acc": "", "grasp_acc_gt_crop": ", GG-CNN ground-truth-centred crop"}
# data settings that GraspAugment takes by name
_AUG_KEYS = ("zoom", "translate", "color_jitter", "depth_noise")


@dataclass
class GraspDataConfig(Checked):
    """Grasp data, input channels, split and augmentation.

    Attributes:
        dataset: "cornell" or "jacquard".
        root: Dataset folder.
        input: "rgb", "depth" or "rgbd" (depth last); sets the model's in_chans.
        split: "image" (shuffled) or "object" (consecutive ids), written into every figure.
        train_frac: Share of views used for training (when ``folds`` is 0).
        folds: k of k-fold cross-validation (``train_grasp.py --folds``); 0: one split.
        fold: The fold that validates (0-based), when ``folds`` > 0.
        train_views: Train on this many of the split's training views, a seeded subset that
            grows by adding views (a learning curve: how the figure scales with views); 0: all.
        output_size: Side of the square model input and maps.
        crop_size: Square crop before resizing (0: shorter image side).
        train_crop: Where training views are cropped: "centre" (the image centre, as
            validation and deployment) or "grasps" (centred on the labels, GG-CNN).
        normalise: Input normalisation: "fixed" (ImageNet RGB, depth in metres minus the
            crop's mean) or "image" (RGB and depth each standardised per view).
        batch_size: Views per step.
        num_workers: DataLoader workers.
        augment: Grasp-aware augmentation for training.
        rotate: Rotation range in degrees (symmetric).
        zoom: Zoom range about the objects.
        translate: Largest random shift, as a fraction of the crop, per axis.
        color_jitter: RGB jitter strength (0 = off).
        depth_noise: Depth noise std in metres.
        width_scale: The one width normaliser, used for encoding and decoding.
        repeat: Passes over the training views per epoch, each freshly augmented, so that a
            small dataset makes enough steps to be worth an evaluation each.
        cache: Keep decoded view crops in memory (small datasets); augmentation still runs
            fresh on every item.
    """

    dataset: str = "cornell"
    root: str = ""
    input: str = "rgbd"
    split: str = "image"
    train_frac: float = 0.8
    folds: int = 0
    fold: int = 0
    train_views: int = 0
    output_size: int = 224
    crop_size: int = 300
    train_crop: str = "centre"
    normalise: str = "fixed"
    batch_size: int = 8
    num_workers: int = 0
    augment: bool = True
    rotate: float = 180.0
    zoom: tuple[float, float] = (1.0, 1.25)
    translate: float = 0.1
    color_jitter: float = 0.2
    depth_noise: float = 0.005
    width_scale: float = WIDTH_SCALE
    repeat: int = 1
    cache: bool = False

    SECTION: ClassVar[str] = "data"
    RANGES: ClassVar[dict[str, Range]] = {
        "train_frac": Range(0, 1, lo_open=True, hi_open=True),
        "output_size": AT_LEAST_ONE,
        "crop_size": NON_NEGATIVE,
        "batch_size": AT_LEAST_ONE,
        "num_workers": NON_NEGATIVE,
        "rotate": Range(0, 180),
        "zoom": POSITIVE,
        "color_jitter": PROBABILITY,
        "depth_noise": NON_NEGATIVE,
        "width_scale": POSITIVE,
        "repeat": AT_LEAST_ONE,
        "translate": PROBABILITY,
        "folds": NON_NEGATIVE,
        "fold": NON_NEGATIVE,
        "train_views": NON_NEGATIVE,
    }
    ORDERED: ClassVar[tuple[str, ...]] = ("zoom",)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dataset": ("cornell", "jacquard"),
        "input": tuple(IN_CHANS),
        "split": ("image", "object"),
        "train_crop": CROP_MODES,
        "normalise": NORMALISE_MODES,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.folds and not self.fold < self.folds:
            raise ConfigError(f"data.fold must be in [0, {self.folds}), got {self.fold}")


@dataclass
class GraspLossConfig(Checked):
    """Loss on the four maps.

    Attributes:
        maps: "smooth_l1" or "mse" on cos, sin and width (and quality when ``quality`` is
            "regress"), over every pixel, as in GG-CNN / GR-ConvNet.
        quality: "bce" (binary cross-entropy on the quality logits) or "regress" (the
            ``maps`` loss on the probability). Graspable pixels are a few percent of a view;
            regressing them under a sigmoid gives small gradients and flat peaks, BCE does not.
        geometry: Where cos, sin and width are fitted: "all" pixels (background target 0,
            as in GG-CNN) or only "graspable" ones, the only pixels decoding ever reads.
        width_weight: Weight of the width term. Width targets span ~0.1-0.4 under a sigmoid,
            so their unweighted gradients are an order of magnitude below the angle's.
        width_space: Where the width error is taken: "linear" (``opening / width_scale``, as
            GG-CNN) or "log" (``log`` of it). The rectangle IoU judges an opening by its
            ratio to the true one; the log space charges a 2x error alike on a narrow grasp
            and a wide one, the linear space charges the narrow one far less. The recipes
            keep "linear": "log" did not score better on the nested folds
            (benchmarks/results/grasp.md).
            Needs ``geometry: graspable`` (the background has no opening to take a log of).
    """

    maps: str = "smooth_l1"
    quality: str = "bce"
    geometry: str = "graspable"
    width_weight: float = 10.0
    width_space: str = "linear"

    SECTION: ClassVar[str] = "loss"
    RANGES: ClassVar[dict[str, Range]] = {"width_weight": NON_NEGATIVE}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "maps": tuple(_MAP_LOSSES),
        "quality": _QUALITY_LOSSES,
        "geometry": _GEOMETRY,
        "width_space": _WIDTH_SPACES,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.width_space == "log" and self.geometry != "graspable":
            raise ConfigError(
                "loss.width_space=log needs loss.geometry=graspable "
                f"(got {self.geometry!r}: background pixels have width 0, whose log is -inf)"
            )


@dataclass
class GraspEvalConfig(Checked):
    """Decoding and scoring.

    Attributes:
        top_n: Also report top-n accuracy when > 1.
        min_distance: Minimum distance between decoded peaks, in map pixels.
        threshold: Minimum smoothed quality of a decoded grasp. 0 keeps the best peak of
            every view, which is what a top-1 score asks for.
        quality_sigma: Gaussian post-filter of the quality map before peak picking
            (GG-CNN2 / GR-ConvNet; 0: off).
        angle_sigma: The same for the cos and sin maps.
        width_sigma: The same for the width map.
        flip_tta: Average the maps of the view and its horizontal and vertical flips.
    """

    top_n: int = 1
    min_distance: int = 10
    threshold: float = 0.0
    quality_sigma: float = 2.0
    angle_sigma: float = 2.0
    width_sigma: float = 1.0
    flip_tta: bool = False

    def decode_kwargs(self, width_scale: float) -> dict[str, Any]:
        """Keyword arguments of :func:`~vision_tfm.grasp.decode_grasps` for this config."""
        names = ("min_distance", "threshold", "quality_sigma", "angle_sigma", "width_sigma")
        return {"width_scale": width_scale, **{k: getattr(self, k) for k in names}}

    SECTION: ClassVar[str] = "eval"
    RANGES: ClassVar[dict[str, Range]] = {
        "top_n": AT_LEAST_ONE,
        "min_distance": NON_NEGATIVE,
        "threshold": PROBABILITY,
        "quality_sigma": NON_NEGATIVE,
        "angle_sigma": NON_NEGATIVE,
        "width_sigma": NON_NEGATIVE,
    }


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
        name = self.model.name
        get_model_entry(name)  # an unknown name gets the registry's own error
        grasp = grasp_models()
        if name not in grasp:
            raise ConfigError(
                f"model.name={name!r} is a classification model, not a grasp model; "
                f"use one of {', '.join(grasp)} (or train it with train_cls.py)"
            )


def build_grasp_model(cfg: GraspConfig, pretrained: bool = True) -> nn.Module:
    """The registered grasp model with channels from the configured input."""
    return cfg.model.create(pretrained, in_chans=IN_CHANS[cfg.data.input])


class GraspTask:
    """Map regression with rectangle-metric validation."""

    metric = "grasp_acc"

    def __init__(self, cfg: GraspConfig) -> None:
        self.cfg = cfg
        self.batch_size = cfg.data.batch_size
        self.num_workers = cfg.data.num_workers
        self.split_name = ""
        self.val_gt: GraspDataset | None = None
        self._gt: tuple[DataLoader, DataLoader] | None = None  # (val loader, its GG-CNN twin)

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        d, seed = self.cfg.data, self.cfg.run.seed
        aug: GraspAugment | bool = False
        if d.augment:
            aug_kw = {k: getattr(d, k) for k in _AUG_KEYS}
            aug = GraspAugment(rotate=(-d.rotate, d.rotate), seed=seed, **aug_kw)
        train, val, self.split_name = grasp_datasets_from_config(
            d, seed, augment=aug, train_crop=d.train_crop, repeat=d.repeat, cache=d.cache
        )
        self.val_gt = val.recropped("grasps")
        model = build_grasp_model(self.cfg, pretrained)
        meta = {
            "task": "grasp",
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

    def collate(self, batch: list) -> Any:
        return grasp_collate(batch)

    @staticmethod
    def model_builder(
        ckpt: dict[str, Any], source: str = "checkpoint"
    ) -> tuple[Callable[[], nn.Module], GraspConfig]:
        """Rebuilds ``ckpt``'s grasp model (the engine checks a resumed checkpoint with it)."""
        return checkpoint_builder(
            ckpt,
            GraspConfig(),
            lambda cfg, _, pretrained: build_grasp_model(cfg, pretrained),
            source,
        )

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, maps, _ = batch
        out = model(x.to(device, non_blocking=True))
        maps = {k: v.to(device) for k, v in maps.items()}
        c = self.cfg.loss
        fn = _MAP_LOSSES[c.maps]
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
            )
            self._gt = (loader, gt)
        return self._gt[1]

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
            img = _display_image(x[i], self.cfg.data.input, self.cfg.data.normalise)
            draw_grasps(img, preds, rects[i], run_dir / f"val_overlay_{i}.png")

    def summary(self, metrics: dict[str, float]) -> str:
        """Two lines: the GG-CNN ground-truth-centred figure, then the headline (centre crop)."""
        split = f"{self.cfg.data.split}-wise"
        return "\n".join(
            f"grasp acc ({split}, top-1{label}): {metrics[m]:.2f}"
            for m, label in reversed(_HEADLINES.items())
            if m in metrics
        )


def _display_image(x: torch.Tensor, input_mode: str, normalise: str = "fixed") -> np.ndarray:
    """Undo the input normalisation enough to show the view (RGB, or depth as gray)."""
    if input_mode == "depth" or normalise == "image":
        v = x[:3].permute(1, 2, 0).numpy() if input_mode != "depth" else x[0, ..., None].numpy()
        v = (v - v.min()) / max(float(np.ptp(v)), 1e-6)
        return (np.broadcast_to(v, (*v.shape[:2], 3)) * 255).astype(np.uint8)
    rgb = x[:3].permute(1, 2, 0).numpy() * RGB_STD + RGB_MEAN
    return (rgb.clip(0, 1) * 255).astype(np.uint8)


def restore_grasp_model(
    ckpt: dict[str, Any], use_ema: bool | None = None, source: str = "checkpoint"
) -> tuple[nn.Module, GraspConfig]:
    """Rebuild a trained grasp model (see :func:`~vision_tfm.train.checkpoint.restore_model`)."""
    return restore_model(ckpt, "grasp", GraspTask.model_builder, use_ema, source)


def cross_validate(cfg: GraspConfig, folds: int) -> dict[str, Any]:
    """Train one model per fold of ``data.split`` and report every fold and ``mean ± std``.

    Each fold runs in ``<cv dir>/fold<k>``, a full engine run of its own; ``cv.json`` in the
    cv dir holds the per-fold figures and their mean and (population) std. The last line
    printed is the headline, in the single-run format with ``mean ± std``.

    Returns:
        The ``cv.json`` content.
    """
    from ..config import apply_overrides
    from .engine import Trainer, make_run_dir

    if folds < 2:
        raise ConfigError(f"--folds must be >= 2, got {folds}")
    cv_dir = make_run_dir(cfg.run.out_dir, f"{cfg.model.name}-cv{folds}")
    split = f"{cfg.data.split}-wise"
    rows: list[dict[str, Any]] = []
    for k in range(folds):
        fold_cfg = apply_overrides(cfg, {"data.folds": folds, "data.fold": k})
        task = GraspTask(fold_cfg)
        t0 = time.perf_counter()
        trainer = Trainer(fold_cfg, task, run_dir=cv_dir / f"fold{k + 1}")
        metrics = trainer.shipped_metrics(trainer.fit())
        rows.append(
            {
                "fold": k + 1,
                "split": task.split_name,
                "val_ids": list(trainer.val_ds.ids),
                "train_time_s": round(time.perf_counter() - t0, 1),
                **{m: metrics[m] for m in _HEADLINES},
            }
        )
    result: dict[str, Any] = {
        "model": cfg.model.name,
        "split": split,
        "folds": rows,
        "config": config_to_dict(cfg),
    }
    for m in _HEADLINES:
        values = np.array([r[m] for r in rows])
        result[m] = {"mean": float(values.mean()), "std": float(values.std())}
    (cv_dir / "cv.json").write_text(json.dumps(result, indent=2))
    for r in rows:
        print(
            f"fold {r['fold']}/{folds}: grasp acc ({split}, top-1): {r['grasp_acc']:.2f} | "
            f"GG-CNN ground-truth-centred crop: {r['grasp_acc_gt_crop']:.2f} "
            f"({r['train_time_s'] / 60:.1f} min)"
        )
    print(f"cv dir {cv_dir}")
    for m, label in reversed(_HEADLINES.items()):
        s = result[m]
        print(f"grasp acc ({split} {folds}-fold, top-1{label}): {s['mean']:.2f} ± {s['std']:.2f}")
    return result

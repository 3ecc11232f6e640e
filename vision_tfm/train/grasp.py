"""Grasp detection as an engine :class:`~vision_tfm.train.engine.Task`.

Dense maps are regressed with smooth-L1 (or MSE), as in GG-CNN / GR-ConvNet; validation
decodes the top-n grasps per view and scores them with the rectangle metric
(angle within 30 degrees and IoU > 0.25 against any ground-truth rectangle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, Range, check_ranges
from ..data.grasp import GraspAugment, build_grasp_datasets, grasp_collate
from ..grasp import MAP_KEYS, WIDTH_SCALE, batch_grasp_correct, decode_grasps
from ..models import create_model, get_model_entry, load_pretrained
from .config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig, grasp_models
from .distributed import all_reduce_sum
from .logging import plot_curves

__all__ = [
    "GraspConfig",
    "GraspDataConfig",
    "GraspTask",
    "check_grasp_model",
    "draw_grasps",
    "grasp_model_builder",
    "restore_grasp_model",
]


@dataclass
class GraspDataConfig:
    """Grasp data, input channels, split and augmentation.

    Attributes:
        dataset: "cornell" or "jacquard".
        root: Dataset folder.
        input: "rgb", "depth" or "rgbd" (depth last); sets the model's in_chans.
        split: "image" (shuffled) or "object" (consecutive ids), written into every figure.
        train_frac: Share of views used for training.
        output_size: Side of the square model input and maps.
        crop_size: Square crop around the objects before resizing (0: shorter image side).
        batch_size: Views per step.
        num_workers: DataLoader workers.
        augment: Grasp-aware augmentation for training.
        rotate: Rotation range in degrees (symmetric).
        zoom: Zoom range about the objects.
        color_jitter: RGB jitter strength (0 = off).
        depth_noise: Depth noise std in metres.
        width_scale: The one width normaliser, used for encoding and decoding.
        repeat: Passes over the training views per epoch, each freshly augmented; Cornell's
            56 training views make 7 steps, too few to be worth an evaluation each.
        cache: Keep decoded view crops in memory (small datasets: Cornell's 70 views take
            ~60 MB); augmentation still runs fresh on every item.
    """

    dataset: str = "cornell"
    root: str = ""
    input: str = "rgbd"
    split: str = "image"
    train_frac: float = 0.8
    output_size: int = 224
    crop_size: int = 300
    batch_size: int = 8
    num_workers: int = 0
    augment: bool = True
    rotate: float = 180.0
    zoom: tuple[float, float] = (1.0, 1.25)
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
    }
    ORDERED: ClassVar[tuple[str, ...]] = ("zoom",)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class GraspLossConfig:
    """Loss on the four maps.

    Attributes:
        maps: "smooth_l1" or "mse" on cos, sin and width (and quality when ``quality`` is
            "regress"), over every pixel, as in GG-CNN / GR-ConvNet.
        quality: "bce" (binary cross-entropy on the quality probability) or "regress" (the
            ``maps`` loss). Graspable pixels are a few percent of a view; regressing them
            under a sigmoid gives small gradients and flat peaks, BCE does not.
        geometry: Where cos, sin and width are fitted: "all" pixels (background target 0,
            as in GG-CNN) or only "graspable" ones, the only pixels decoding ever reads.
        width_weight: Weight of the width term. Width targets span ~0.1-0.4 under a sigmoid,
            so their unweighted gradients are an order of magnitude below the angle's.
    """

    maps: str = "smooth_l1"
    quality: str = "bce"
    geometry: str = "graspable"
    width_weight: float = 10.0

    SECTION: ClassVar[str] = "loss"
    RANGES: ClassVar[dict[str, Range]] = {"width_weight": NON_NEGATIVE}

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class GraspEvalConfig:
    """Decoding and scoring.

    Attributes:
        top_n: Also report top-n accuracy when > 1.
        min_distance: Minimum distance between decoded peaks, in map pixels.
        threshold: Minimum smoothed quality of a decoded grasp. 0 keeps the best peak of
            every view, which is what a top-1 score asks for.
    """

    top_n: int = 1
    min_distance: int = 10
    threshold: float = 0.0

    SECTION: ClassVar[str] = "eval"
    RANGES: ClassVar[dict[str, Range]] = {
        "top_n": AT_LEAST_ONE,
        "min_distance": NON_NEGATIVE,
        "threshold": PROBABILITY,
    }

    def __post_init__(self) -> None:
        check_ranges(self)


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


IN_CHANS = {"rgb": 3, "depth": 1, "rgbd": 4}
_MAP_LOSSES = {"smooth_l1": F.smooth_l1_loss, "mse": F.mse_loss}
_QUALITY_LOSSES = ("bce", "regress")
_GEOMETRY = ("all", "graspable")


def _bce(prob: torch.Tensor, target: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Binary cross-entropy on probabilities, written out so it runs under any autocast."""
    p = prob.clamp(eps, 1 - eps)
    return -(target * p.log() + (1 - target) * (1 - p).log()).mean()


def check_grasp_model(name: str) -> None:
    """Refuse a classifier up front; its logits would fail in the loss as an IndexError."""
    get_model_entry(name)  # an unknown name gets the registry's own error
    grasp = grasp_models()
    if name not in grasp:
        raise ValueError(
            f"model.name={name!r} is a classification model, not a grasp model; "
            f"use one of {', '.join(grasp)} (or train it with train_cls.py)"
        )


def build_grasp_model(cfg: GraspConfig) -> nn.Module:
    """The registered grasp model with channels from the configured input."""
    check_grasp_model(cfg.model.name)
    if cfg.data.input not in IN_CHANS:
        raise ValueError(f"data.input must be one of {sorted(IN_CHANS)}, got {cfg.data.input!r}")
    return create_model(
        cfg.model.name, **{"in_chans": IN_CHANS[cfg.data.input], **cfg.model.kwargs}
    )


class GraspTask:
    """Map regression with rectangle-metric validation."""

    metric = "grasp_acc"

    def __init__(self, cfg: GraspConfig) -> None:
        if cfg.loss.maps not in _MAP_LOSSES:
            raise ValueError(f"loss.maps must be one of {list(_MAP_LOSSES)}, got {cfg.loss.maps!r}")
        if cfg.loss.quality not in _QUALITY_LOSSES:
            raise ValueError(
                f"loss.quality must be one of {list(_QUALITY_LOSSES)}, got {cfg.loss.quality!r}"
            )
        if cfg.loss.geometry not in _GEOMETRY:
            raise ValueError(
                f"loss.geometry must be one of {list(_GEOMETRY)}, got {cfg.loss.geometry!r}"
            )
        check_grasp_model(cfg.model.name)
        self.cfg = cfg
        self.batch_size = cfg.data.batch_size
        self.num_workers = cfg.data.num_workers
        self.split_name = ""

    def build(self) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        d = self.cfg.data
        aug: GraspAugment | bool = False
        if d.augment:
            aug = GraspAugment(
                rotate=(-d.rotate, d.rotate),
                zoom=d.zoom,
                color_jitter=d.color_jitter,
                depth_noise=d.depth_noise,
                seed=self.cfg.run.seed,
            )
        train, val, self.split_name = build_grasp_datasets(
            d.dataset,
            d.root,
            split=d.split,
            train_frac=d.train_frac,
            seed=self.cfg.run.seed,
            augment=aug,
            input=d.input,
            output_size=d.output_size,
            crop_size=d.crop_size or None,
            width_scale=d.width_scale,
            repeat=d.repeat,
            cache=d.cache,
        )
        model = build_grasp_model(self.cfg)
        if self.cfg.model.pretrained:
            load_pretrained(model, self.cfg.model.pretrained)
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

    def model_builder(self, ckpt: dict[str, Any]) -> Callable[[], nn.Module]:
        """Rebuilds ``ckpt``'s model (the engine checks a resumed checkpoint on meta with it)."""
        return grasp_model_builder(ckpt)[0]

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        x, maps, _ = batch
        out = model(x.to(device, non_blocking=True))
        maps = {k: v.to(device) for k, v in maps.items()}
        c = self.cfg.loss
        fn = _MAP_LOSSES[c.maps]
        q = out["quality"].float()
        loss = _bce(q, maps["quality"]) if c.quality == "bce" else fn(q, maps["quality"])
        mask = (maps["quality"] > 0).float() if c.geometry == "graspable" else None
        for k in ("cos", "sin", "width"):
            w = c.width_weight if k == "width" else 1.0
            if mask is None:
                loss = loss + w * fn(out[k].float(), maps[k])
            else:
                err = fn(out[k].float(), maps[k], reduction="none")
                loss = loss + w * (err * mask).sum() / mask.sum().clamp(min=1)
        return loss, x.shape[0]

    def _decode_kw(self) -> dict[str, Any]:
        return {
            "width_scale": self.cfg.data.width_scale,
            "min_distance": self.cfg.eval.min_distance,
            "threshold": self.cfg.eval.threshold,
        }

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        hits = torch.zeros(3, dtype=torch.float64)  # top-1 correct, top-n correct, views
        n = self.cfg.eval.top_n
        for x, _, rects in loader:
            out = {k: v.float().cpu() for k, v in model(x.to(device)).items()}
            top1 = batch_grasp_correct(out, rects, top_n=1, **self._decode_kw())
            topn = batch_grasp_correct(out, rects, top_n=n, **self._decode_kw()) if n > 1 else top1
            hits += torch.tensor([sum(top1), sum(topn), len(rects)], dtype=torch.float64)
        c1, cn, views = all_reduce_sum(hits).tolist()
        metrics = {"grasp_acc": c1 / views}
        if n > 1:
            metrics[f"grasp_acc_top{n}"] = cn / views
        return metrics

    def finish(self, model: nn.Module, loader: DataLoader, run_dir: Path, history: list) -> None:
        plot_curves(history, run_dir / "curves.png", ["grasp_acc", "ema_grasp_acc"])
        device = next(model.parameters()).device
        x, _, rects = next(iter(loader))
        with torch.no_grad():
            out = {k: v.float().cpu() for k, v in model.eval()(x.to(device)).items()}
        for i in range(min(4, len(rects))):
            maps = {k: out[k][i, 0].numpy() for k in MAP_KEYS}
            preds = decode_grasps(**maps, num_grasps=1, **self._decode_kw())
            img = _display_image(x[i], self.cfg.data.input)
            draw_grasps(img, preds, rects[i], run_dir / f"val_overlay_{i}.png")

    def summary(self, metrics: dict[str, float]) -> str:
        return f"grasp acc ({self.cfg.data.split}-wise, top-1): {metrics['grasp_acc']:.2f}"


def _display_image(x: torch.Tensor, input_mode: str) -> np.ndarray:
    """Undo the input normalisation enough to show the view (RGB, or depth as gray)."""
    if input_mode == "depth":
        d = x[0].numpy()
        d = (d - d.min()) / max(float(np.ptp(d)), 1e-6)
        return (np.stack([d] * 3, -1) * 255).astype(np.uint8)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rgb = x[:3].permute(1, 2, 0).numpy() * std + mean
    return (rgb.clip(0, 1) * 255).astype(np.uint8)


def draw_grasps(image: np.ndarray, preds: list, gt_rects: np.ndarray | None, path: Path) -> None:
    """Predicted grasps in green (jaw plates thick), ground truth in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    ax.imshow(image)
    if gt_rects is not None:
        for r in gt_rects:
            ax.add_patch(plt.Polygon(r, closed=True, fill=False, ec="red", lw=1))
    for g in preds:
        c = g.corners()
        ax.add_patch(plt.Polygon(c, closed=True, fill=False, ec="lime", lw=1.5))
        for a, b in ((1, 2), (3, 0)):  # the plates: corners 1-2 and 3-0
            ax.plot([c[a, 0], c[b, 0]], [c[a, 1], c[b, 1]], color="lime", lw=3)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def restore_grasp_model(
    ckpt: dict[str, Any], use_ema: bool | None = None, source: str = "checkpoint"
) -> tuple[nn.Module, GraspConfig]:
    """Rebuild a trained grasp model from a checkpoint dict.

    ``use_ema``: see :func:`~vision_tfm.train.checkpoint.shipped_weights`; ``source`` names
    the checkpoint in errors.
    """
    from .checkpoint import build_for_weights, shipped_weights

    if ckpt.get("meta", {}).get("task") != "grasp":
        raise ValueError("checkpoint is not a grasp checkpoint")
    build, cfg = grasp_model_builder(ckpt, source)
    model = build_for_weights(build, shipped_weights(ckpt, use_ema, source), source)
    return model.eval(), cfg


def grasp_model_builder(
    ckpt: dict[str, Any], source: str = "checkpoint"
) -> tuple[Callable[[], nn.Module], GraspConfig]:
    """What rebuilds a checkpoint's grasp model (uncalled, so it can run on the meta device)."""
    from ..config import apply_overrides
    from .checkpoint import check_meta

    check_meta(ckpt["meta"], source)
    cfg = apply_overrides(GraspConfig(), ckpt["config"])
    return lambda: build_grasp_model(cfg), cfg


def predict_grasps(
    checkpoint: str | Path,
    image: str | Path,
    depth: str | Path | None = None,
    top_n: int = 5,
    use_ema: bool | None = None,
) -> tuple[list, np.ndarray]:
    """Top grasps on one raw view, in the view's own pixel coordinates.

    The view gets the training preprocessing (centre square crop of ``crop_size``, resize,
    normalisation, depth hole filling). Returns the grasps and the RGB (or depth) image.
    """
    from ..data.grasp import crop_resize, load_depth, load_rgb, output_to_crop, to_input
    from ..grasp import Grasp
    from .checkpoint import load_checkpoint

    model, cfg = restore_grasp_model(load_checkpoint(checkpoint), use_ema, str(checkpoint))
    d = cfg.data
    rgb = load_rgb(image) if d.input != "depth" else None
    dep = None
    if d.input != "rgb":
        if depth is None:
            raise ValueError(f"the model takes input={d.input!r}: pass --depth with a depth file")
        dep = load_depth(depth)
    shown = rgb if rgb is not None else load_rgb(image)
    H, W = shown.shape[:2]
    if dep is not None and dep.shape != (H, W):
        raise ValueError(f"depth {dep.shape} does not match image {(H, W)}: {depth}")
    crop = min(d.crop_size or min(H, W), H, W)
    box = ((W - crop) // 2, (H - crop) // 2, crop)
    rgb_c, dep_c = crop_resize(rgb, dep, box, d.output_size)
    with torch.no_grad():
        out = model(to_input(rgb_c, dep_c)[None])
    maps = {k: out[k][0, 0].float().numpy() for k in MAP_KEYS}
    preds = decode_grasps(
        **maps,
        num_grasps=top_n,
        width_scale=d.width_scale,
        min_distance=cfg.eval.min_distance,
        threshold=cfg.eval.threshold,
    )
    scale = crop / d.output_size
    grasps = []
    for g in preds:
        ((x, y),) = output_to_crop(np.array([[g.x, g.y]], np.float32), box, d.output_size)
        grasps.append(
            Grasp(float(x), float(y), g.angle, g.opening * scale, g.jaw * scale, g.quality)
        )
    return grasps, shown

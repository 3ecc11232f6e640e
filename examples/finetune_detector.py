"""Fine-tune a torchvision detector on a ViT / Swin backbone, on the shared training engine.

Data: with no ``--data``, a small detection set built from the package's own files: digits 0,
1 and 2 of the embedded MNIST, pasted at random sizes (28-56 px) and places on black 128x128
canvases, one to three per canvas and never overlapping; each box is its digit's ink and its
class the digit. 240 training canvases use the training digits, 60 held-out ones the val
digits; the set is the same on every run. With ``--data DIR``: the Cornell grasping views
(``pcdXXXXr.png`` + ``pcdXXXXcpos.txt``), one object per view, boxed by the extent of its grasp
rectangles (approximate: they reach a little past the outline); every 5th view (by id) is held
out and training flips at random.

    python examples/finetune_detector.py                      # the digits, from scratch, on a CPU
    python examples/finetune_detector.py --data ../shared/data/cornell --threads 1
    python examples/finetune_detector.py --backbone vit_small_patch16_224 --detector retinanet
    python examples/finetune_detector.py --backbone-kw '{}' --pretrained true   # timm's weights
    python examples/finetune_detector.py --scenes 8 4 --steps 2 --min-size 64 --max-size 64

Without ``--backbone-kw`` the backbone is a small config (``SMALL``) trained from scratch, so
the run fits on a CPU. After every epoch it prints the mean train loss and COCO's figures on
the held-out images: mAP@[.5:.95] (``map``), mAP@0.5 (``map50``) and AP per class (``ap_<class>``),
computed by torchmetrics on pycocotools (``pip install 'vision_tfm[detection]'``). At the end
it draws the held-out images with predicted (red) and true (green) boxes into
``<out>/<run>/predictions/`` and keeps the predictions in ``val_predictions.pt``. Figures from
a run: ``docs/results/detection.md``. Single process only: the mAP is not gathered across
ranks.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.utils import draw_bounding_boxes

from vision_tfm.config import apply_overrides, parse_cli_overrides
from vision_tfm.data import load_mnist
from vision_tfm.data.grasp import GraspView, find_cornell_views
from vision_tfm.detection import build_detector, coco_map
from vision_tfm.io import atomic_save
from vision_tfm.tasks.base import Task
from vision_tfm.tasks.config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig
from vision_tfm.train import Trainer
from vision_tfm.train.launch import run_cli

DIGITS = (0, 1, 2)  # the classes of the built-in set
CANVAS = 128  # its image side
DIGIT_SIZES = (28, 57)  # a pasted digit's side, [low, high)
SCENES = {"train": 240, "val": 60}
SCENE_SEED = 0  # the set is the same whatever --seed says
SMALL = {  # family prefix -> a config that trains in minutes on a CPU
    "swin": {"embed_dim": 32, "depths": [2, 2, 2, 2], "num_heads": [1, 2, 4, 8]},
    "vit": {"embed_dim": 96, "depth": 4, "num_heads": 3},
}
FASTER_RCNN_KW = {  # a few objects per image: far fewer proposals and sampled RoIs than COCO
    "rpn_pre_nms_top_n_train": 600,
    "rpn_post_nms_top_n_train": 300,
    "rpn_pre_nms_top_n_test": 300,
    "rpn_post_nms_top_n_test": 100,
    "box_batch_size_per_image": 64,
}


@dataclass
class DetSection:
    """What is specific to detection runs.

    Attributes:
        kind: ``fasterrcnn`` or ``retinanet``.
        data: Cornell root; empty: the built-in digits.
        min_size: Shorter side after torchvision's resize (640x480 views become 299x224).
        max_size: Cap on the longer side.
        out_channels: FPN / pyramid width.
        frozen_stages: Backbone stages to freeze.
        batch_size: Images per step.
        val_every: Every n-th Cornell view (by id) is held out.
        detector_kw: Passed to the torchvision detector.
    """

    kind: str = "fasterrcnn"
    data: str = ""
    min_size: int = 224
    max_size: int = 320
    out_channels: int = 64
    frozen_stages: int = 0
    batch_size: int = 4
    val_every: int = 5
    detector_kw: dict[str, Any] = field(default_factory=dict)


@dataclass
class DetConfig:
    """A detection run: the engine's sections plus ``det``."""

    model: ModelConfig = field(default_factory=ModelConfig)
    det: DetSection = field(default_factory=DetSection)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    run: RunConfig = field(default_factory=RunConfig)


class BoxImages(Dataset):
    """Images held in memory with their boxes, as ``(image (3, H, W) in [0, 1],
    {"boxes": (K, 4) xyxy, "labels": (K,)})``; ``flip``: mirror at random (training)."""

    def __init__(
        self,
        images: list[torch.Tensor],
        boxes: list[torch.Tensor],
        labels: list[torch.Tensor],
        names: list[str],
        flip: bool = False,
    ) -> None:
        self.images, self.boxes, self.labels, self.names = images, boxes, labels, names
        self.flip = flip

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        img = self.images[i].float() / 255
        h, w = img.shape[-2:]
        box = self.boxes[i].clone()
        box[:, 0::2] = box[:, 0::2].clamp(0, w)
        box[:, 1::2] = box[:, 1::2].clamp(0, h)
        if self.flip and torch.rand(()) < 0.5:  # torch RNG: the engine reseeds it every epoch
            img = img.flip(-1)
            box = torch.stack([w - box[:, 2], box[:, 1], w - box[:, 0], box[:, 3]], 1)
        return img, {"boxes": box, "labels": self.labels[i]}


def digit_scenes(split: str, n: int, seed: int = SCENE_SEED) -> BoxImages:
    """``n`` canvases of the embedded MNIST ``split``'s digits ``DIGITS`` (see the module
    docstring); labels are 1 + the digit's index in ``DIGITS`` (0 is the background)."""
    images, labels = load_mnist(split)
    pools = [images[labels == d] for d in DIGITS]
    rng = np.random.default_rng([seed, ("train", "val").index(split)])
    out: tuple[list, list, list] = ([], [], [])
    for _ in range(n):
        canvas = np.zeros((CANVAS, CANVAS), np.uint8)
        boxes: list[list[float]] = []
        classes: list[int] = []
        for _ in range(int(rng.integers(1, 4))):
            c = int(rng.integers(len(DIGITS)))
            side = int(rng.integers(*DIGIT_SIZES))
            digit = Image.fromarray(pools[c][rng.integers(len(pools[c]))])
            digit = np.asarray(digit.resize((side, side), Image.Resampling.BILINEAR))
            ys, xs = np.nonzero(digit > 64)  # the ink
            for _ in range(20):  # a place whose ink box meets no other
                x, y = (int(v) for v in rng.integers(0, CANVAS - side + 1, 2))
                box = [x + xs.min(), y + ys.min(), x + xs.max() + 1, y + ys.max() + 1]
                if all(box[0] >= o[2] or box[2] <= o[0] or box[1] >= o[3] or box[3] <= o[1]
                       for o in boxes):  # fmt: skip
                    break
            else:
                continue
            spot = canvas[y : y + side, x : x + side]  # a view: the paste writes the canvas
            np.maximum(spot, digit, out=spot)
            boxes.append([float(v) for v in box])
            classes.append(c + 1)
        out[0].append(torch.from_numpy(canvas)[None].expand(3, -1, -1).contiguous())  # (3, H, W)
        out[1].append(torch.tensor(boxes, dtype=torch.float32))
        out[2].append(torch.tensor(classes, dtype=torch.int64))
    return BoxImages(*out, names=[f"{split}{i:03d}" for i in range(n)])


def view_box(view: GraspView) -> torch.Tensor:
    """``(1, 4)`` xyxy box: the extent of the view's grasp rectangles (NaN ones already gone)."""
    pts = view.rects.reshape(-1, 2)  # (4K, 2) corners
    return torch.tensor([[*pts.min(0), *pts.max(0)]], dtype=torch.float32)


def cornell_boxes(views: Sequence[GraspView], flip: bool) -> BoxImages:
    """Cornell views, each boxed by :func:`view_box` as class 1."""
    images = [
        torch.from_numpy(np.array(Image.open(v.rgb_path).convert("RGB"))).permute(2, 0, 1)
        for v in views
    ]  # uint8 (3, H, W)
    ones = [torch.ones(1, dtype=torch.int64) for _ in views]
    return BoxImages(images, [view_box(v) for v in views], ones, [v.view_id for v in views], flip)


class DetectionTask(Task):
    """Detection as an engine task: torchvision's summed losses, COCO mAP on held-out images."""

    name = "det"
    title = "detection"
    metric = "map"

    def __init__(self, cfg: DetConfig, train: BoxImages, val: BoxImages, classes: list[str]):
        super().__init__(cfg)
        self.datasets, self.classes = (train, val), classes

    @property
    def batch_size(self) -> int:
        return self.cfg.det.batch_size

    @property
    def num_workers(self) -> int:
        return 0

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        d, m = self.cfg.det, self.cfg.model
        model = build_detector(
            d.kind,
            m.name,
            num_classes=len(self.classes) + 1,  # and the background
            pretrained=m.pretrained if pretrained else None,
            frozen_stages=d.frozen_stages,
            out_channels=d.out_channels,
            min_size=d.min_size,
            max_size=d.max_size,
            backbone_kw=m.kwargs,
            **d.detector_kw,
        )
        meta = {"task": "det", "model_name": m.name, "detector": d.kind, "classes": self.classes}
        return model, *self.datasets, meta

    @staticmethod
    def collate(batch: list) -> Any:
        return tuple(zip(*batch))  # (images, targets): detectors take lists

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        images, targets = batch
        images = [x.to(device) for x in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        return sum(model(images, targets).values()), len(images)

    def predict(self, model: nn.Module, loader: DataLoader, device: torch.device) -> tuple:
        """Predictions (on CPU) and targets for every image of ``loader``."""
        preds, targets = [], []
        for images, tgts in loader:
            out = model([x.to(device) for x in images])
            preds += [{k: v.cpu() for k, v in o.items()} for o in out]
            targets += list(tgts)
        return preds, targets

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        s = coco_map(*self.predict(model, loader, device))
        per_class = {f"ap_{c}": s.per_class.get(i + 1, 0.0) for i, c in enumerate(self.classes)}
        return {"map": s.map, "map50": s.map50, **(per_class if len(self.classes) > 1 else {})}

    def finish(self, model: nn.Module, loader: DataLoader, run_dir: Path, history: list) -> None:
        first, last = history[0]["train_loss"], history[-1]["train_loss"]
        print(f"train loss {first:.3f} -> {last:.3f} over {len(history)} epochs", flush=True)
        with torch.no_grad():
            preds, targets = self.predict(model.eval(), loader, next(model.parameters()).device)
        atomic_save({"preds": preds, "targets": targets}, run_dir / "val_predictions.pt")
        out = run_dir / "predictions"
        out.mkdir(exist_ok=True)
        data = loader.dataset
        for name, img, p, t in zip(data.names, data.images, preds, targets):
            drawn = draw_bounding_boxes(img, t["boxes"], colors="green", width=2)
            if len(p["scores"]):  # the best box, and any other scoring 0.5 or more
                keep = p["scores"] >= min(0.5, p["scores"].max().item())
                labels = [
                    f"{self.classes[c - 1]} {s:.2f}"
                    for c, s in zip(p["labels"][keep].tolist(), p["scores"][keep].tolist())
                ]
                drawn = draw_bounding_boxes(drawn, p["boxes"][keep], labels, colors="red", width=2)
            Image.fromarray(drawn.permute(1, 2, 0).numpy()).save(out / f"{name}.png")
        print(f"predictions drawn in {out}", flush=True)

    def summary(self, metrics: dict[str, float]) -> str:
        return f"val COCO mAP@[.5:.95]: {metrics['map']:.4f}, mAP@0.5: {metrics['map50']:.4f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="", help="Cornell root (pcd*r.png + cpos); none: digits")
    p.add_argument(
        "--steps", type=int, default=300, help="optimiser steps, rounded up to whole epochs"
    )
    p.add_argument("--backbone", default="swin_tiny_patch4_window7_224")
    p.add_argument("--backbone-kw", type=json.loads, help="JSON model overrides; {} = full size")
    p.add_argument("--detector", default="fasterrcnn", choices=["fasterrcnn", "retinanet"])
    p.add_argument(
        "--pretrained",
        default="",
        help="backbone weights: true (timm's published ones), a timm tag, or a checkpoint file",
    )
    p.add_argument("--frozen-stages", type=int, default=0)
    p.add_argument("--min-size", type=int, default=224, help="shorter side after resizing")
    p.add_argument("--max-size", type=int, default=320, help="cap on the longer side")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    p.add_argument("--out", default="runs/det", help="parent of the run directory")
    p.add_argument(
        "--scenes",
        type=int,
        nargs=2,
        default=(SCENES["train"], SCENES["val"]),
        metavar=("TRAIN", "VAL"),
        help="digit canvases to train on and hold out (a smoke run takes a few)",
    )
    args = p.parse_args()

    if args.data:
        views, _ = find_cornell_views(args.data)
        every = DetSection.val_every
        train = cornell_boxes([v for i, v in enumerate(views) if i % every], flip=True)
        val, classes = cornell_boxes(views[::every], flip=False), ["object"]
    else:
        train, val = digit_scenes("train", args.scenes[0]), digit_scenes("val", args.scenes[1])
        classes = [str(d) for d in DIGITS]
    steps_per_epoch = len(train) // args.batch_size
    kw = args.backbone_kw
    if kw is None:
        kw = next((c for f, c in SMALL.items() if args.backbone.startswith(f)), {})
    cfg = DetConfig(
        # read as train_cls.py reads model.pretrained=...: true, a tag, or a file
        model=apply_overrides(
            ModelConfig(name=args.backbone, kwargs=kw),
            parse_cli_overrides([f"pretrained={args.pretrained}"]),
        ),
        det=DetSection(
            kind=args.detector,
            data=args.data,
            min_size=args.min_size,
            max_size=args.max_size,
            frozen_stages=args.frozen_stages,
            batch_size=args.batch_size,
            detector_kw=FASTER_RCNN_KW if args.detector == "fasterrcnn" else {},
        ),
        optim=OptimConfig(lr=args.lr, clip_grad=5.0),
        sched=SchedConfig(epochs=max(1, math.ceil(args.steps / steps_per_epoch))),
        run=RunConfig(out_dir=args.out, seed=args.seed, threads=args.threads, tensorboard=False),
    )
    n_boxes = sum(len(b) for b in train.boxes)
    print(
        f"{len(train)} train images ({n_boxes} boxes) / {len(val)} val | classes {classes} | "
        f"{cfg.sched.epochs} epochs x {steps_per_epoch} steps | {args.detector} on "
        f"{args.backbone} {kw}",
        flush=True,
    )
    Trainer(cfg, DetectionTask(cfg, train, val, classes)).fit()


if __name__ == "__main__":
    run_cli(main)

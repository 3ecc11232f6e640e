"""A checkpoint opened once for export, parity, calibration and benchmarking.

Every step reads the model and its data the same way: the val split and preprocessing the
checkpoint was trained with. An exported model is judged on the inputs it will see, never
on random noise, and every format is scored by the same metric code.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, default_collate

from ..grasp import MAP_KEYS, GraspMaps, batch_grasp_correct
from ..models import get_model_entry
from ..train.checkpoint import load_checkpoint
from ..train.config import config_hash

__all__ = [
    "INPUT_NAME",
    "Evaluation",
    "ExportSource",
    "ImageList",
    "Runner",
    "list_images",
    "load_source",
    "max_abs_diff",
    "model_source",
]

INPUT_NAME = "image"
TASKS = ("cls", "grasp")

Runner = Callable[[torch.Tensor], Sequence[torch.Tensor]]
"""A model in any format: a float32 NCHW batch in, its outputs in ``output_names`` order out."""


@dataclass
class Evaluation:
    """One runner's outputs over the val batches, and the task metric they score (None on
    unlabelled images)."""

    metric: float | None
    outputs: list[torch.Tensor]  # one per output name, concatenated over the batches

    def top1_agreement(self, ref: Evaluation) -> float | None:
        """Share of images whose top-1 class matches ``ref`` (None for dense outputs)."""
        if self.outputs[0].ndim != 2:
            return None
        same = self.outputs[0].argmax(1) == ref.outputs[0].argmax(1)
        return same.float().mean().item()


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """Largest element-wise difference over all outputs: inf on a shape mismatch, NaN if any."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return math.inf
        diffs.append((x.float() - y.float()).abs().max().item())
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


@dataclass
class ExportSource:
    """The restored eval-mode model of a checkpoint plus what describes its inputs and data."""

    path: Path
    model: nn.Module
    cfg: Any  # ClsConfig or GraspConfig
    meta: dict[str, Any]
    _data: tuple[Dataset, Dataset] | None = field(default=None, repr=False)

    @property
    def task(self) -> str:
        return self.meta["task"]

    @property
    def model_name(self) -> str:
        return self.meta["model_name"]

    @property
    def in_chans(self) -> int:
        return int(self.meta["in_chans"])

    @property
    def img_size(self) -> tuple[int, int]:
        s = self.meta["img_size"]
        return (s, s) if isinstance(s, int) else (int(s[0]), int(s[1]))

    @property
    def output_names(self) -> list[str]:
        return list(MAP_KEYS) if self.task == "grasp" else ["logits"]

    @property
    def metric_name(self) -> str | None:
        return "grasp_acc" if self.task == "grasp" else "top1"

    def outputs_of(self, out: torch.Tensor | dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """A model's return value as a list in ``output_names`` order."""
        if isinstance(out, dict):
            return [out[k] for k in self.output_names]
        return [out]

    def torch_runner(self, model: nn.Module | None = None) -> Runner:
        """Run ``model`` (default: the checkpoint's) as a :data:`Runner`, without autograd."""
        model = model or self.model

        def run(x: torch.Tensor) -> list[torch.Tensor]:
            with torch.inference_mode():
                return self.outputs_of(model(x))

        return run

    # --- data ------------------------------------------------------------------------------

    def datasets(self) -> tuple[Dataset, Dataset]:
        """(train, val) with deterministic eval preprocessing; built once, then cached."""
        if self._data is None:
            d = self.cfg.data
            root = d.root if getattr(d, "name", None) != "mnist" else None  # mnist is embedded
            if root and not Path(root).exists():
                raise FileNotFoundError(
                    f"{self.path}: its data.root {root} does not exist from here (a relative "
                    "root is read from the current folder); pass --data with the dataset folder"
                )
            self._data = _grasp_datasets(self.cfg) if self.task == "grasp" else self._cls_data()
        return self._data

    def _cls_data(self) -> tuple[Dataset, Dataset]:
        from ..data import AugConfig, build_cls_datasets
        from ..train.classification import eval_data_config

        # kind="none" with every other augmentation at its default (off) makes the train
        # transform identical to the eval one, which is what calibration wants.
        data = build_cls_datasets(eval_data_config(self.cfg, self.meta), AugConfig(kind="none"))
        return data.train, data.val

    def batches(self, split: str, batch_size: int, limit: int = 0) -> list[tuple]:
        """The first ``limit`` (0 = all) items of ``split`` as collated batches held in memory."""
        ds = self.datasets()[0 if split == "train" else 1]
        if 0 < limit < len(ds):
            ds = Subset(ds, range(limit))
        collate = default_collate
        if self.task == "grasp":
            from ..data.grasp import grasp_collate

            collate = grasp_collate
        return list(DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=collate))

    def evaluate(self, runner: Runner, batches: Sequence[tuple]) -> Evaluation:
        """Run every batch through ``runner`` and score it with the checkpoint's metric."""
        hits, n, outs = 0, 0, []
        for batch in batches:
            x = batch[0]
            out = [t.float() for t in runner(x)]
            outs.append(out)
            if self.metric_name is None:
                pass
            elif self.task == "grasp":
                maps = dict(zip(MAP_KEYS, out))
                hits += sum(batch_grasp_correct(maps, batch[2], top_n=1, **self._decode_kw()))
            else:
                hits += (out[0].argmax(1) == batch[1]).sum().item()
            n += len(x)
        if n == 0:
            raise ValueError(f"{self.path}: the validation split is empty")
        metric = None if self.metric_name is None else hits / n
        return Evaluation(metric, [torch.cat(col) for col in zip(*outs)])

    def _decode_kw(self) -> dict[str, Any]:
        return self.cfg.eval.decode_kwargs(self.cfg.data.width_scale)

    # --- metadata --------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What a deployment needs besides the weights: names, sizes, normalisation, versions."""
        import vision_tfm

        m = self.meta
        info: dict[str, Any] = {
            "model_name": self.model_name,
            "task": self.task,
            "checkpoint": self.path.name,  # the name only: a path would leak the machine
            "config_hash": config_hash(self.cfg),
            "input_name": INPUT_NAME,
            "in_chans": self.in_chans,
            "img_size": list(self.img_size),
            "output_names": self.output_names,
            "versions": {"torch": torch.__version__, "vision_tfm": vision_tfm.__version__},
        }
        if self.task == "cls":
            info.update(mean=m["mean"], std=m["std"], class_names=m["class_names"])
        else:
            from ..data.grasp import DEPTH_CLIP, RGB_MEAN, RGB_STD

            per_image = self.cfg.data.normalise == "image"
            info.update(
                input=m.get("input"),
                mean="per view" if per_image else RGB_MEAN.tolist(),
                std="per view" if per_image else RGB_STD.tolist(),
                depth=f"metres minus the view's mean, clipped to +-{DEPTH_CLIP}"
                + (", then divided by its std" if per_image else ""),
                width_scale=m.get("width_scale"),
                crop_size=m.get("crop_size"),
            )
        info["preprocess"] = self._preprocess()
        return info

    def _preprocess(self) -> dict[str, Any]:
        """The val pipeline step by step, so a runtime without vision_tfm can reproduce it
        (with another resize filter, 1.3% of an ONNX-only Swin-MNIST's predictions changed)."""
        if self.task == "cls":
            m = self.meta
            d = self.cfg.data
            return cls_preprocess(self.img_size[0], d.crop_pct, self.in_chans, m["mean"], m["std"])
        from ..data.grasp import DEPTH_CLIP

        d = self.cfg.data
        order = {"rgb": ["R", "G", "B"], "depth": ["D"], "rgbd": ["R", "G", "B", "D"]}
        return {
            "channels": order[d.input],
            "crop": f"a square of crop_size ({d.crop_size or 'the short side'}) px at the "
            "image centre (as validation and vtfm grasp crop)",
            "resize": [d.output_size, d.output_size],
            "interpolation": "area when shrinking, else bilinear (OpenCV)",
            "rgb": _RGB_STEPS[d.normalise],
            "depth": "metres; holes (NaN, inf, <= 0) filled by cv2.inpaint (Navier-Stokes, "
            "radius 1) on depth scaled to [0, 1], before the resize; then minus the crop's "
            f"mean, clipped to +-{DEPTH_CLIP}" + _DEPTH_STEPS[d.normalise],
            "layout": "NCHW float32",
        }


_RGB_STEPS = {
    "fixed": "(pixel / 255 - mean) / std per channel",
    "image": "(pixel - m) / s, m and s the mean and std over all RGB values of the view",
}
_DEPTH_STEPS = {"fixed": "", "image": "; then minus its mean and divided by its std"}


class ImageList(Dataset):
    """Image files or uint8 arrays through a transform, each labelled -1 (no label)."""

    def __init__(self, items: Sequence[Any], in_chans: int, transform: Callable) -> None:
        self.items, self.in_chans, self.transform = items, in_chans, transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from ..data import load_image

        item = self.items[i]
        img = load_image(item, 1 if self.in_chans == 1 else 3) if isinstance(item, Path) else item
        return self.transform(img), -1


def list_images(root: Path, what: str = "images") -> Sequence[Any]:
    """Images (uint8 arrays) or image paths found at ``root``, in a fixed order: MNIST idx,
    CIFAR-10 batches, an ImageFolder root's train split, or every image file below it.

    Raises:
        ValueError: There are none.
    """
    from ..data import load_cifar10, read_idx, scan_image_folder
    from ..data.datasets import IMAGE_EXTENSIONS, find_cifar10_dir
    from ..data.mnist import IDX_IMAGES_MAGIC

    if root.is_file():
        if "idx3-ubyte" in root.name:
            return read_idx(root, IDX_IMAGES_MAGIC)
        return [root]
    idx = sorted(root.glob("*idx3-ubyte*"))
    if idx:
        return read_idx(idx[0], IDX_IMAGES_MAGIC)  # (N, H, W) uint8
    if find_cifar10_dir(root) is not None:
        return load_cifar10(root)[0]  # the training batches
    if (root / "train").is_dir():
        return [p for p, _ in scan_image_folder(root)[0]]
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise ValueError(
            f"{root}: no {what} (expected image files, an ImageFolder root, CIFAR-10 batches "
            "or MNIST idx files)"
        )
    return files


@dataclass
class ModelSource(ExportSource):
    """A registered classifier without a training run: random (seeded) or converted weights,
    scored on unlabelled images, so only agreement with fp32 PyTorch can be measured."""

    images: Path = Path()

    @property
    def metric_name(self) -> str | None:
        return None

    def datasets(self) -> tuple[Dataset, Dataset]:
        """The image folder, twice: it is both the calibration and the agreement set."""
        if self._data is None:
            from ..data import build_eval_transform
            from ..train.classification import eval_data_config

            transform = build_eval_transform(eval_data_config(self.cfg, self.meta))
            ds = ImageList(list_images(self.images), self.in_chans, transform)
            self._data = (ds, ds)
        return self._data


def model_source(
    name: str, img_size: int, images: str | os.PathLike, weights: str | os.PathLike | None = None
) -> ModelSource:
    """A registered classifier at ``img_size`` for speed and agreement rows (no accuracy).

    Args:
        name: A registered classifier (not a grasp model).
        img_size: Input side; ViT's position table and Swin's windows are built for it.
        images: Real images the formats are compared on (and static int8 calibrated on),
            preprocessed as ``vtfm predict`` would with ImageNet statistics.
        weights: timm / torchvision / official checkpoint to convert; default: seeded random.

    Raises:
        ValueError, FileNotFoundError: An unknown or grasp model, missing images or weights.
    """
    from ..config import apply_overrides
    from ..data.config import IMAGENET_MEAN, IMAGENET_STD
    from ..models.convert import load_pretrained
    from ..train.classification import ClsConfig, build_cls_model
    from ..train.config import grasp_models

    entry = get_model_entry(name)
    if name in grasp_models():
        raise ValueError(f"--model {name} is a grasp model; benchmark it from its checkpoint")
    images = Path(images)
    if not images.exists():
        raise FileNotFoundError(f"--data: {images} does not exist")
    if weights is not None and not Path(weights).is_file():
        raise FileNotFoundError(f"--weights: {weights} not found")
    over = {"model.name": name, "data.name": "imagefolder", "data.root": str(images)}
    cfg = apply_overrides(ClsConfig(), {**over, "data.img_size": img_size})
    in_chans = entry.cfg.in_chans
    torch.manual_seed(0)
    model = build_cls_model(cfg.model, entry.cfg.num_classes, in_chans, img_size)
    if weights is not None:
        load_pretrained(model, weights)
    gray = in_chans == 1
    meta = {
        "task": "cls",
        "model_name": name,
        "in_chans": in_chans,
        "img_size": img_size,
        "num_classes": entry.cfg.num_classes,
        "class_names": [str(i) for i in range(entry.cfg.num_classes)],
        "mean": [0.5] if gray else list(IMAGENET_MEAN),
        "std": [0.5] if gray else list(IMAGENET_STD),
        "weights": Path(weights).name if weights else "random (torch.manual_seed(0))",
    }
    path = Path(weights) if weights else Path(f"{name}-random-init")
    return ModelSource(path, model.eval(), cfg, meta, images=images)


CLS_CONTRACT = "vision_tfm.cls.preprocess/1"  # bump when a step below changes


def cls_preprocess(img_size: int, crop_pct: float, in_chans: int, mean: Any, std: Any) -> dict:
    """``vtfm predict``'s preprocessing as an exact contract: every library, dtype and rounding.

    ``examples/onnx_client.py`` follows it with Pillow and numpy alone and must agree with
    ``vtfm predict`` to 1e-5 in probability (tests/export/test_onnx_client.py).
    """
    short = int(img_size / crop_pct)
    mode = "L" if in_chans == 1 else "RGB"
    return {
        "contract": CLS_CONTRACT,
        "decode": "Pillow Image.open, no EXIF rotation. 16-bit (modes I;16*, or mode I with a "
        "pixel above 255): v -> (v + 128) // 257 as uint8 mode L; mode I with every pixel "
        "<= 255: v as uint8 mode L; mode F is refused",
        "channels": {
            "mode": mode,
            "rule": f"Pillow Image.convert('{mode}'): "
            + (
                "ITU-R 601 luma in Pillow's integer arithmetic, uint8"
                if in_chans == 1
                else "gray repeated, palette expanded, alpha dropped (not composited)"
            ),
        },
        "resize": {
            "short_side": short,
            "long_side": f"max(1, round(long * ({short} / short))): float64, round half to even",
            "skip": "when the size is unchanged",
            "filter": "bicubic on uint8 HWC, Keys kernel a = -0.75 (OpenCV's INTER_CUBIC); per "
            "axis, output d samples src = float32((d + 0.5) * (1 / (out / in)) - 0.5) (the "
            "quotients in float64); taps floor(src) - 1 .. floor(src) + 2, clamped to the "
            "edge; with t = src - floor(src), u = 1 - t and a = -0.75, evaluated left to right "
            "in float32: w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a, "
            "w1 = ((a + 2) * t - (a + 3)) * t * t + 1, w2 = ((a + 2) * u - (a + 3)) * u * u + 1, "
            "w3 = 1 - w0 - w1 - w2; each times 2048, rounded half to even to an integer",
            "arithmetic": "int64: along W first (sum of pixel x weight), then along H; then "
            "(v + 2**21) >> 22, clipped to 0..255, uint8",
            "reference": "vision_tfm.data.transforms.resize_bicubic",
        },
        "center_crop": {
            "size": [img_size, img_size],
            "offset": "top = (H - size) // 2, left = (W - size) // 2 (floored)",
        },
        "normalize": {
            "mean": list(mean),
            "std": list(std),
            "formula": "per channel, every operation in float32: "
            "(v - mean * 255) * (1 / (std * 255))",
        },
        "layout": f"NCHW float32 ({mode} channel order), batch axis first",
        "output": "logits; softmax over the last axis gives vtfm predict's probabilities",
    }


def _grasp_datasets(cfg: Any) -> tuple[Dataset, Dataset]:
    from ..data.grasp import build_grasp_datasets

    d = cfg.data
    if not d.root:
        raise ValueError("the grasp checkpoint names no data.root, so there is no val set")
    train, val, _ = build_grasp_datasets(
        d.dataset,
        d.root,
        split=d.split,
        train_frac=d.train_frac,
        seed=cfg.run.seed,
        augment=False,
        input=d.input,
        output_size=d.output_size,
        crop_size=d.crop_size or None,
        width_scale=d.width_scale,
    )
    return train, val


def load_source(
    path: str | os.PathLike, use_ema: bool | None = None, data_root: str | None = None
) -> ExportSource:
    """Restore a classification or grasp checkpoint for export.

    ``data_root`` replaces the checkpoint's ``data.root`` (the dataset moved, or training ran
    from another folder); the split and preprocessing stay the checkpoint's.

    Raises:
        FileNotFoundError: No such checkpoint.
        ValueError: Not a checkpoint, an unknown task, or a model this install does not know.
    """
    from ..train.classification import restore_cls_model
    from ..train.grasp import restore_grasp_model

    path = Path(path)
    ckpt = load_checkpoint(path)
    meta = dict(ckpt.get("meta") or {})
    task = meta.get("task")
    if task not in TASKS:
        raise ValueError(
            f"{path}: unknown task {task!r} in the checkpoint; expected one of {TASKS}"
        )
    name = meta.get("model_name") or ckpt["config"].get("model", {}).get("name")
    try:
        get_model_entry(str(name))
    except ValueError as e:
        raise ValueError(f"{path}: checkpoint of an {e}") from None
    meta["model_name"] = name
    restore = restore_cls_model if task == "cls" else restore_grasp_model
    model, cfg = restore(ckpt, use_ema=use_ema, source=str(path))  # shapes checked on meta
    if data_root is not None:
        if not Path(data_root).exists():
            raise FileNotFoundError(f"--data: {data_root} does not exist")
        cfg = replace(cfg, data=replace(cfg.data, root=str(data_root)))
    if task == "grasp":
        meta.setdefault("img_size", cfg.data.output_size)
        model = GraspMaps(model)  # the graph ends in the activations, not the logits
    return ExportSource(path, model.eval(), cfg, meta)

"""A checkpoint opened once for export, parity, calibration and benchmarking.

Every step reads the val split and preprocessing the checkpoint was trained with, so an
exported model is judged on the inputs it will see, and every format by the same metric code.
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
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, default_collate

from ..grasp import (
    ANGLE_THRESHOLD,
    MAP_KEYS,
    GraspMaps,
    angle_difference,
    decode_grasps,
    split_maps,
)
from ..grasp.metric import grasp_correct
from ..grasp.predict import flip_averaged
from ..models import get_model_entry
from ..train.checkpoint import check_meta, load_checkpoint
from ..train.config import config_hash

INPUT_NAME = "image"

Runner = Callable[[torch.Tensor], Sequence[torch.Tensor]]
"""A model in any format: a float32 NCHW batch in, its outputs in ``output_names`` order out."""


@dataclass
class Evaluation:
    """One runner's outputs over the val batches, and the task metric they score (None on
    unlabelled images)."""

    metric: float | None
    outputs: list[torch.Tensor]  # one per output name, concatenated over the batches
    top_grasps: list[tuple[float, float, float] | None] | None = None  # (x, y, angle) per view

    def top1_agreement(self, ref: Evaluation) -> float | None:
        """Share of images whose top-1 class matches ``ref``; for grasp maps, whose top grasp
        does (:func:`same_grasp`)."""
        if self.top_grasps is not None and ref.top_grasps is not None:
            pairs = zip(self.top_grasps, ref.top_grasps, strict=True)
            return sum(same_grasp(a, b) for a, b in pairs) / max(len(self.top_grasps), 1)
        if self.outputs[0].ndim != 2:
            return None
        same = self.outputs[0].argmax(1) == ref.outputs[0].argmax(1)
        return same.float().mean().item()


def same_grasp(a: tuple[float, float, float] | None, b: tuple[float, float, float] | None) -> bool:
    """Two top grasps ``(x, y, angle)`` agree on the same peak pixel with angles within the
    rectangle metric's 30 degrees (modulo pi); two views without a grasp agree too."""
    if a is None or b is None:
        return a is b
    return a[:2] == b[:2] and angle_difference(a[2], b[2]) <= ANGLE_THRESHOLD


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
        return ["maps"] if self.task == "grasp" else ["logits"]

    @property
    def metric_name(self) -> str | None:
        return "grasp_acc" if self.task == "grasp" else "top1"

    def torch_runner(self, *, bf16: bool = False, model: nn.Module | None = None) -> Runner:
        """The model (or ``model``, a faster form of it) as a :data:`Runner`, without
        autograd; with ``bf16`` under CPU bf16 autocast (weights stay fp32; matmuls run in
        bf16)."""
        model = self.model if model is None else model

        def run(x: torch.Tensor) -> list[torch.Tensor]:
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                out = model(x)
                outs = [out[k] for k in self.output_names] if isinstance(out, dict) else [out]
                return [o.float() for o in outs]

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
            if self.task == "cls":
                self._data = self._cls_data()
            elif not root:
                raise ValueError("the grasp checkpoint names no data.root, so there is no val set")
            else:
                self._data = grasp_split(self.cfg, root)
        return self._data

    def _cls_data(self) -> tuple[Dataset, Dataset]:
        from ..data import AugConfig, build_cls_datasets
        from ..train.classification import eval_data_config

        # kind="none" with every other augmentation at its default (off) makes the train
        # transform identical to the eval one, which is what calibration wants.
        data = build_cls_datasets(eval_data_config(self.cfg, self.meta), AugConfig(kind="none"))
        return data.train, data.val

    def folder_dataset(self, root: Path, what: str = "images") -> Dataset:
        """Every image under ``root`` with eval preprocessing: a grasp dataset's views
        (cropped as validation crops them), or what :func:`list_images` finds."""
        if self.task == "grasp":
            return ConcatDataset(grasp_split(self.cfg, root, folder=True))
        from ..data import build_eval_transform
        from ..train.classification import eval_data_config

        transform = build_eval_transform(eval_data_config(self.cfg, self.meta))
        return ImageList(list_images(root, what), self.in_chans, transform)

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
        """Run every batch through ``runner`` and score it with the checkpoint's metric.

        Grasp maps are decoded as validation decodes them (``eval.flip_tta`` included) into
        each view's top grasp, which the rectangle metric scores on labelled views.
        """
        hits, n, outs = 0, 0, []
        tops: list[tuple[float, float, float] | None] | None = None
        for batch in batches:
            x = batch[0]
            if self.task == "grasp":
                run = lambda v: split_maps(runner(v)[0])  # noqa: E731
                maps = flip_averaged(run, x, self.cfg.eval.flip_tta)
                out = [maps[k].float() for k in MAP_KEYS]
                tops = tops if tops is not None else []
                for i in range(len(x)):
                    view = [o[i] for o in out]
                    kw = self.cfg.eval.decode_kwargs(self.cfg.data.width_scale)
                    preds = decode_grasps(*view, num_grasps=1, **kw)
                    tops.append((preds[0].x, preds[0].y, preds[0].angle) if preds else None)
                    if self.metric_name is not None:
                        hits += grasp_correct(preds, batch[2][i])
            else:
                out = [t.float() for t in runner(x)]
                if self.metric_name is not None:
                    hits += (out[0].argmax(1) == batch[1]).sum().item()
            outs.append(out)
            n += len(x)
        if n == 0:
            raise ValueError(f"{self.path}: the validation split is empty")
        metric = None if self.metric_name is None else hits / n
        return Evaluation(metric, [torch.cat(col) for col in zip(*outs)], tops)

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
            size, d = self.img_size[0], self.cfg.data
            info.update(
                mean=m["mean"],
                std=m["std"],
                class_names=m["class_names"],
                # the val pipeline step by step, so a runtime without vision_tfm can reproduce it
                preprocess=cls_preprocess(size, d.crop_pct, self.in_chans, m["mean"], m["std"]),
            )
        else:
            from ..data.grasp import DEPTH_CLIP, RGB_MEAN, RGB_STD

            per_image = self.cfg.data.normalise == "image"
            info.update(
                input=m.get("input"),
                mean="per view" if per_image else RGB_MEAN.tolist(),
                std="per view" if per_image else RGB_STD.tolist(),
                depth_clip=DEPTH_CLIP,
                width_scale=m.get("width_scale"),
                crop_size=m.get("crop_size"),
                preprocess=grasp_preprocess(self.cfg),
                postprocess=grasp_postprocess(self.cfg),
            )
        return info


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
    """A registered model without a training run: random (seeded) or converted weights,
    scored on real images without their labels, so only agreement with fp32 PyTorch can be
    measured."""

    images: Path = Path()

    @property
    def metric_name(self) -> str | None:
        return None

    def datasets(self) -> tuple[Dataset, Dataset]:
        """The image folder (a grasp dataset's every view, for a grasp model), twice: it is
        both the calibration and the agreement set."""
        if self._data is None:
            ds = self.folder_dataset(self.images)
            self._data = (ds, ds)
        return self._data


def model_source(
    name: str, img_size: int, images: str | os.PathLike, weights: str | os.PathLike | None = None
) -> ModelSource:
    """A registered model at ``img_size`` for speed and agreement rows (no accuracy).

    Args:
        name: A registered classifier or grasp model.
        img_size: Input side; ViT's position table and Swin's windows are built for it.
        images: Real images to compare the formats on, with ImageNet statistics; for a grasp
            model, a Cornell or Jacquard folder.
        weights: timm / torchvision / official classifier weights; default: seeded random.

    Raises:
        ValueError, FileNotFoundError: An unknown model, weights for a grasp model, missing
            images or weights.
    """
    from ..config import apply_overrides
    from ..data.config import IMAGENET_MEAN, IMAGENET_STD
    from ..data.grasp import IN_CHANS
    from ..models.convert import load_pretrained
    from ..train.classification import ClsConfig, build_cls_model
    from ..train.config import grasp_models
    from ..train.grasp import GraspConfig, build_grasp_model

    entry = get_model_entry(name)
    grasp = name in grasp_models()
    if grasp and weights is not None:
        raise ValueError(f"--weights converts classifier weights; {name} is a grasp model")
    images = Path(images)
    if not images.exists():
        raise FileNotFoundError(f"--data: {images} does not exist")
    if weights is not None and not Path(weights).is_file():
        raise FileNotFoundError(f"--weights: {weights} not found")
    torch.manual_seed(0)
    meta: dict[str, Any] = {"task": "grasp" if grasp else "cls", "model_name": name}
    if grasp:
        jacquard = next(images.rglob("*_perfect_depth.tiff"), None) is not None
        over = {
            "model.name": name,
            "data.dataset": "jacquard" if jacquard else "cornell",
            "data.root": str(images),
            "data.output_size": img_size,
        }
        cfg: Any = apply_overrides(GraspConfig(), over)
        model = GraspMaps(build_grasp_model(cfg))
        d = cfg.data
        meta.update(
            in_chans=IN_CHANS[d.input],
            input=d.input,
            crop_size=d.crop_size,
            width_scale=d.width_scale,
        )
    else:
        over = {"model.name": name, "data.name": "imagefolder", "data.root": str(images)}
        cfg = apply_overrides(ClsConfig(), {**over, "data.img_size": img_size})
        in_chans = entry.cfg.in_chans
        model = build_cls_model(cfg.model, entry.cfg.num_classes, in_chans, img_size)
        if weights is not None:
            load_pretrained(model, weights)
        gray = in_chans == 1
        meta.update(
            in_chans=in_chans,
            num_classes=entry.cfg.num_classes,
            class_names=[str(i) for i in range(entry.cfg.num_classes)],
            mean=[0.5] if gray else list(IMAGENET_MEAN),
            std=[0.5] if gray else list(IMAGENET_STD),
        )
    meta.update(
        img_size=img_size,
        weights=Path(weights).name if weights else "random (torch.manual_seed(0))",
    )
    path = Path(weights) if weights else Path(f"{name}-random-init")
    return ModelSource(path, model.eval(), cfg, meta, images=images)


CLS_CONTRACT = "vision_tfm.cls.preprocess/1"  # bump when a step below changes
_DECODE = (
    "Pillow Image.open, no EXIF rotation. 16-bit (modes I;16*, or mode I with a pixel above "
    "255): v -> (v + 128) // 257 as uint8 mode L; mode I with every pixel <= 255: v as uint8 "
    "mode L; mode F is refused"
)


def cls_preprocess(img_size: int, crop_pct: float, in_chans: int, mean: Any, std: Any) -> dict:
    """``vtfm predict``'s preprocessing as an exact contract: every library, dtype and rounding,
    so that ``examples/onnx_client.py`` can follow it with Pillow and numpy alone."""
    short = int(img_size / crop_pct)
    mode = "L" if in_chans == 1 else "RGB"
    return {
        "contract": CLS_CONTRACT,
        "decode": _DECODE,
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


def grasp_split(cfg: Any, root: str | os.PathLike, folder: bool = False) -> tuple[Dataset, Dataset]:
    """(train, val) of the checkpoint's grasp split under ``root``, both preprocessed as
    validation is. ``folder``: any folder of views (calibration), split by default rules, so
    a fold checkpoint's ``data.folds`` does not ask a small folder for that many views."""
    from ..data.grasp import grasp_datasets_from_config

    d, seed = cfg.data, cfg.run.seed
    if folder:
        d, seed = replace(d, split="image", folds=0, fold=0), 0
    train, val, _ = grasp_datasets_from_config(d, seed, root)
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
    meta = dict(ckpt["meta"])
    check_meta(meta, str(path))  # the task and what rebuilding the model reads
    task = meta["task"]
    meta["model_name"] = meta.get("model_name") or ckpt["config"].get("model", {}).get("name")
    get_model_entry(str(meta["model_name"]))  # the name the exported files will carry
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


# bump when a step below or the graph's outputs (grasp_postprocess) change; /3: one "maps"
GRASP_CONTRACT = "vision_tfm.grasp.preprocess/3"


_PER_VIEW = (
    "x = {} as float32; (x - m) / max(s, 1e-6) with m = x.mean() and s = x.std() as numpy "
    "computes them on a float32 array (reference: vision_tfm.data.grasp.images.standardise)"
)


def grasp_preprocess(cfg: Any) -> dict[str, Any]:
    """``vtfm grasp``'s preprocessing of an RGB-D pair as an exact contract, which
    ``examples/onnx_client.py`` follows (with :func:`grasp_postprocess`) in Pillow and numpy."""
    from ..data.grasp import DEPTH_CLIP, RGB_MEAN, RGB_STD

    d = cfg.data
    S = d.output_size
    order = {"rgb": ["R", "G", "B"], "depth": ["D"], "rgbd": ["R", "G", "B", "D"]}
    return {
        "contract": GRASP_CONTRACT,
        "channels": order[d.input],
        "decode": {
            "rgb": _DECODE + "; then Pillow convert('RGB'), uint8 HWC",
            "depth": "Pillow Image.open, read as float32 metres (H, W), the RGB image's size",
        },
        "crop": {
            "size": d.crop_size or None,
            "side": "min(size, H, W); min(H, W) when size is null",
            "offset": "x0 = (W - side) // 2, y0 = (H - side) // 2 (the image centre, floored)",
        },
        "resize": {
            "size": [S, S],
            "rule": "area average, separable: along each axis output pixel d covers input "
            "[d * k, (d + 1) * k) with k = n_in / n_out; input pixel s covers [s, s + 1); "
            "the weight is the overlap length / k (float64)",
            "arithmetic": "float64: out = Wy @ img @ Wx.T per channel; uint8 RGB: rounded half "
            "to even, clipped to 0..255, uint8; depth: cast to float32",
            "reference": "vision_tfm.data.grasp.images.resize_area",
        },
        "depth": {
            "clip": DEPTH_CLIP,
            "holes": "NaN, inf or <= 0, filled on the crop before the resize: in rounds until "
            "none is left, every hole with a valid pixel among its 8 neighbours becomes the "
            "float64 sum of those neighbours divided by their count, stored as float32, and "
            "is valid from the next round on; a crop without any valid pixel becomes zeros "
            "(reference: vision_tfm.data.grasp.images.fill_depth_holes)",
            "normalise": "after the resize: mean over the map in float64, cast to float32; "
            "float32 (d - mean) clipped to [-clip, clip] metres"
            + ("" if d.normalise == "fixed" else "; then " + _PER_VIEW.format("that map")),
        },
        "normalise": d.normalise,
        "rgb": {
            "mean": RGB_MEAN.tolist(),
            "std": RGB_STD.tolist(),
            "formula": "per channel, every operation in float32: (v / 255 - mean) / std"
            if d.normalise == "fixed"
            else _PER_VIEW.format("the resized uint8 RGB crop, all three channels together"),
        },
        "layout": "NCHW float32, channels in the order above (depth last), batch axis first",
    }


def grasp_postprocess(cfg: Any) -> dict[str, Any]:
    """How ``vtfm grasp`` turns the graph's four maps into grasps on the raw image."""
    from ..grasp import MAP_ACTIVATIONS

    e = cfg.eval
    kw = e.decode_kwargs(cfg.data.width_scale)
    return {
        "outputs": {
            "maps": f"(N, {len(MAP_KEYS)}, H, W) float32, channels {', '.join(MAP_KEYS)}",
            "activations": {
                k: f"{v}, applied inside the graph" for k, v in MAP_ACTIVATIONS.items()
            },
        },
        "flip_tta": e.flip_tta,
        "flip_rule": "when flip_tta: the float32 mean (x + lr + ud) / 3 of the maps of the "
        "input, of the input flipped along W (lr) and along H (ud), each flipped back, with "
        "sin negated in lr and ud",
        "filter": {
            "sigma": {
                "quality": kw["quality_sigma"],
                "cos": kw["angle_sigma"],
                "sin": kw["angle_sigma"],
                "width": kw["width_sigma"],
            },
            "rule": "sigma 0: none. Else OpenCV GaussianBlur(map, (0, 0), sigma) on float32: "
            "ksize = round(8 * sigma + 1) | 1 (half to even), taps g_i = "
            "exp(-(i - (ksize - 1) / 2)^2 / (2 * sigma^2)) normalised to sum 1, along W then H, "
            "border reflect-101 "
            "(dcb|abcd|cba)",
        },
        "peaks": {
            "min_distance": kw["min_distance"],
            "threshold": kw["threshold"],
            "rule": "on the filtered quality q: a candidate equals the max of q over the "
            "(2 * min_distance + 1)^2 window around it (clipped at the border) and is >= "
            "threshold; when min_distance > 0, 8-connected candidates form one peak at the "
            "candidate nearest their centroid (squared distance, ties in raster order); peaks "
            "sorted by q descending (ties: raster order of each group's first pixel) and kept "
            "greedily when their Chebyshev distance to every kept peak is > min_distance",
        },
        "grasp": {
            "angle": "0.5 * atan2(sin, cos) at the peak, wrapped into [-pi/2, pi/2) as "
            "((a + pi/2) mod pi) - pi/2: radians from the image +x axis to the opening "
            "direction, counter-clockwise on screen (y points down)",
            "width_scale": kw["width_scale"],
            "opening": "width * width_scale map pixels",
            "jaw": "opening * 0.5",
            "quality": "filtered q at the peak",
        },
        "to_image": "float32: x = (col + 0.5) / float32(size / side) - 0.5 + x0, y = (row + "
        "0.5) / float32(size / side) - 0.5 + y0; opening and jaw (float64) times side / size",
        "reference": "vision_tfm.grasp.predict_grasps (what vtfm grasp prints)",
    }

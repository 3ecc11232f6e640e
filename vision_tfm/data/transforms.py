"""Albumentations pipelines for classification, built from `DataConfig` and `AugConfig`.

Every transform takes a uint8 image (numpy HW / HWC, or a PIL image) and returns a float32
CHW tensor with `in_chans` channels, so training, validation and `vtfm predict` share one
path. Images stay numpy arrays throughout; PIL is used only when timm RandAugment is on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image
from torch.utils.data import get_worker_info

from ..errors import ConfigError, InputError
from .config import (
    LUMA_WEIGHTS,
    AugConfig,
    DataConfig,
    resolve_in_chans,
    resolve_mean_std,
)

# Bicubic, as timm uses for ViT/Swin preprocessing.
_INTERP = cv2.INTER_CUBIC
_COEF_BITS = 11  # fixed-point weights, as OpenCV's integer resize: 1.0 -> 2048


def _cubic_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Source indices ``(n_out, 4)`` (edge-replicated) and int weights ``(n_out, 4)``.

    Half-pixel centres: output ``d`` samples the input at ``(d + 0.5) * n_in / n_out - 0.5``,
    taken in float32 as OpenCV does; Keys' kernel with a = -0.75 (OpenCV's, not Pillow's -0.5).
    """
    f = ((np.arange(n_out) + 0.5) * (1.0 / (n_out / n_in)) - 0.5).astype(np.float32)
    base = np.floor(f)
    x = f - base
    a, one = np.float32(-0.75), np.float32(1.0)
    x1, y = x + one, one - x
    c0 = ((a * x1 - np.float32(5) * a) * x1 + np.float32(8) * a) * x1 - np.float32(4) * a
    c1 = ((a + np.float32(2)) * x - (a + np.float32(3))) * x * x + one
    c2 = ((a + np.float32(2)) * y - (a + np.float32(3))) * y * y + one
    c3 = one - c0 - c1 - c2
    coef = np.stack([c0, c1, c2, c3], axis=1) * np.float32(1 << _COEF_BITS)
    idx = base.astype(np.int64)[:, None] + np.arange(-1, 3)
    return np.clip(idx, 0, n_in - 1), np.rint(coef).astype(np.int64)


def resize_bicubic(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bicubic resize of an HWC uint8 image in integer arithmetic, exactly reproducible.

    OpenCV's INTER_CUBIC as its scalar code states it (kernel, taps, 11-bit weights, rows
    then columns, ``(v + 2**21) >> 22`` clipped to 0..255); its vectorised paths round in
    float32 instead and, depending on the CPU, differ by one level on some pixels. A runtime
    without OpenCV repeats this in a few lines of numpy (examples/onnx_client.py).
    """
    h, w, _ = img.shape
    if (h, w) == (height, width):
        return img
    xi, xw = _cubic_taps(w, width)
    yi, yw = _cubic_taps(h, height)
    rows = np.einsum("hwkc,wk->hwc", img.astype(np.int64)[:, xi], xw)  # (h, width, C)
    out = np.einsum("hkwc,hk->hwc", rows[yi], yw)  # (height, width, C)
    return np.clip((out + (1 << (2 * _COEF_BITS - 1))) >> (2 * _COEF_BITS), 0, 255).astype(np.uint8)


def resize_short_side(img: np.ndarray, size: int) -> np.ndarray:
    """Short side to ``size``, the long one to ``round(long * size / short)`` (half to even,
    as albumentations' SmallestMaxSize, which this replaces), bicubic."""
    h, w, _ = img.shape
    scale = size / min(h, w)
    return resize_bicubic(img, max(1, round(h * scale)), max(1, round(w * scale)))


def to_in_chans(img: np.ndarray | Image.Image, in_chans: int) -> np.ndarray:
    """Convert an image to HWC uint8 with exactly `in_chans` (1 or 3) channels.

    Gray becomes RGB by repetition; RGB becomes gray with ITU-R 601 luma (as PIL's "L");
    an alpha channel is dropped.
    """
    if isinstance(img, Image.Image):
        img = np.asarray(img.convert("L" if in_chans == 1 else "RGB"))
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise InputError(f"expected a uint8 image, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise InputError(f"expected an HW or HWC image with 1, 3 or 4 channels, got {arr.shape}")
    arr = arr[:, :, :3]
    if arr.shape[2] == in_chans:
        return arr
    if in_chans == 3:
        return np.repeat(arr, 3, axis=2)
    gray = arr.astype(np.float32) @ np.asarray(LUMA_WEIGHTS, dtype=np.float32)
    return np.clip(np.rint(gray), 0, 255).astype(np.uint8)[:, :, None]


class ClsTransform:
    """Channel conversion, optional PIL-side ops, then an albumentations pipeline to a tensor.

    Albumentations keeps its own RNG, which forked DataLoader workers would all inherit, and
    re-inherit unchanged every epoch. So the pipeline is seeded from torch: from
    `torch.initial_seed()` at construction (reproducible under `torch.manual_seed`) and again
    from each worker's seed inside a worker, so workers and epochs draw different augmentations.
    timm's RandAugment draws from Python's `random`, which DataLoader workers seed themselves.
    """

    def __init__(
        self,
        pipeline: A.Compose,
        in_chans: int,
        pil_ops: Callable[[Image.Image], Image.Image] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.in_chans = in_chans
        self.pil_ops = pil_ops
        self._seed = torch.initial_seed()
        self._rngs: tuple[np.random.Generator, random.Random] | None = None
        self.reseed(self._seed)

    def reseed(self, seed: int) -> None:
        """Restart the augmentation stream (the engine does this per item, for exact resume).

        Inside a worker this replaces the worker's own seeding, which would otherwise follow.
        """
        worker = get_worker_info()
        if worker is not None:
            self._seed = worker.seed
        # One shared stream for all ops; Compose(seed=...) would give each op the same stream.
        # Later reseeds restart it in place (the ops hold it), cheap enough for every item.
        if self._rngs is None:
            self._rngs = (np.random.default_rng(seed), random.Random(seed))
            self.pipeline.set_random_state(*self._rngs)
        else:
            self._rngs[0].bit_generator.state = np.random.PCG64(seed).state
            self._rngs[1].seed(seed)

    def __call__(self, img: np.ndarray | Image.Image) -> torch.Tensor:
        worker = get_worker_info()
        if worker is not None and worker.seed != self._seed:
            self._seed = worker.seed
            self.reseed(worker.seed)
        arr = to_in_chans(img, self.in_chans)
        if self.pil_ops is not None:
            # timm's RandAugment fills with an RGB mean, so run it in RGB and convert back.
            arr = to_in_chans(self.pil_ops(Image.fromarray(to_in_chans(arr, 3))), self.in_chans)
        return self.pipeline(image=arr)["image"]

    def __repr__(self) -> str:
        names = [type(t).__name__ for t in self.pipeline.transforms]
        extra = f"{self.pil_ops!r}, " if self.pil_ops is not None else ""
        return f"ClsTransform(in_chans={self.in_chans}, {extra}{' -> '.join(names)})"


def _resize_center_crop(cfg: DataConfig) -> list[A.BasicTransform]:
    # Short side to img_size / crop_pct, then the centre img_size square (timm's eval recipe).
    # CenterCrop's offsets are floored: (H - img_size) // 2, (W - img_size) // 2.
    short = partial(_resize_image, size=int(cfg.img_size / cfg.crop_pct))
    return [
        A.Lambda(image=short, name="resize_short_side"),
        A.CenterCrop(height=cfg.img_size, width=cfg.img_size),
    ]


def _resize_image(img: np.ndarray, size: int, **_: object) -> np.ndarray:
    return resize_short_side(img, size)


def _normalize_to_tensor(cfg: DataConfig) -> list[A.BasicTransform]:
    mean, std = resolve_mean_std(cfg)
    return [A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()]


def build_eval_transform(cfg: DataConfig) -> ClsTransform:
    """Deterministic validation / prediction preprocessing: resize, centre crop, normalise."""
    pipeline = A.Compose([*_resize_center_crop(cfg), *_normalize_to_tensor(cfg)])
    return ClsTransform(pipeline, resolve_in_chans(cfg))


def build_train_transform(cfg: DataConfig, aug: AugConfig) -> ClsTransform:
    """Training augmentation, ending in the same normalisation as `build_eval_transform`.

    Order: [RandAugment (PIL)] -> geometry (affine | rrc | none) -> hflip -> colour jitter
    (3-channel only: saturation/hue mean nothing for gray) -> normalise -> random erasing.
    Erasing runs after normalisation with fill 0, i.e. the dataset mean colour, like timm's
    default "const" mode.
    """
    in_chans = resolve_in_chans(cfg)
    size = cfg.img_size
    ops: list[A.BasicTransform] = []
    if aug.kind == "rrc":
        ops.append(
            A.RandomResizedCrop(
                size=(size, size), scale=aug.crop_scale, ratio=aug.crop_ratio, interpolation=_INTERP
            )
        )
    else:
        ops += _resize_center_crop(cfg)
    if aug.kind == "affine":
        ops.append(
            A.Affine(
                scale=aug.scale,
                translate_percent=(-aug.translate, aug.translate),
                rotate=(-aug.rotate, aug.rotate),
                interpolation=cv2.INTER_LINEAR,
                fill=0,
                p=1.0,
            )
        )
    if aug.hflip > 0:
        ops.append(A.HorizontalFlip(p=aug.hflip))
    if aug.color_jitter > 0 and in_chans == 3:
        cj = aug.color_jitter
        ops.append(A.ColorJitter(brightness=cj, contrast=cj, saturation=cj, hue=0.0, p=1.0))
    ops += _normalize_to_tensor(cfg)
    if aug.random_erasing > 0:
        # ToTensorV2 must stay last, so erasing goes just before it.
        ops.insert(
            len(ops) - 1,
            A.CoarseDropout(
                num_holes_range=(1, 1),
                hole_height_range=(0.1, 0.5),
                hole_width_range=(0.1, 0.5),
                fill=0.0,
                p=aug.random_erasing,
            ),
        )
    return ClsTransform(A.Compose(ops), in_chans, _rand_augment(cfg, aug))


def _rand_augment(cfg: DataConfig, aug: AugConfig) -> Callable[[Image.Image], Image.Image] | None:
    if not aug.rand_augment:
        return None
    from timm.data.auto_augment import rand_augment_transform

    mean = resolve_mean_std(cfg)[0]
    fill = tuple(round(255 * m) for m in (mean * 3 if len(mean) == 1 else mean))
    hparams = {"translate_const": int(cfg.img_size * 0.45), "img_mean": fill}
    try:
        return rand_augment_transform(aug.rand_augment, hparams)
    except (AssertionError, KeyError, ValueError, IndexError) as e:
        why = f"aug.rand_augment={aug.rand_augment!r} is not a timm spec: {e}"
        raise ConfigError(why) from None

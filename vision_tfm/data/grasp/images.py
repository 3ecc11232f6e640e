"""Image side of a grasp view: decoding, depth cleaning, crops, normalisation, augmentation.

Hole filling and resizing are plain numpy rules rather than OpenCV's inpainting and
``INTER_AREA``, so that ``model.json`` can state them exactly and a runtime without OpenCV
(``examples/onnx_client.py``) reproduces them; the area resize is OpenCV's ``INTER_AREA``
when shrinking, up to float rounding (tests/grasp/test_grasp_data.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import torch

from vision_tfm.constants import IMAGENET_MEAN, IMAGENET_STD
from vision_tfm.data.datasets import load_image, open_image
from vision_tfm.errors import ConfigError, MissingFileError

from .annotations import GraspDataError

RGB_MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)  # for backbones pre-trained on ImageNet
RGB_STD = np.array(IMAGENET_STD, dtype=np.float32)
DEPTH_CLIP: float = 1.0
"""Metres either side of the crop's mean depth that survive normalisation (as in GG-CNN)."""


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


def load_rgb(path: str | Path) -> np.ndarray:
    """Decode an RGB view as classification decodes images (:func:`~vision_tfm.data.load_image`:
    16-bit data scaled, not clipped; a missing or corrupt file is a one-line error naming it)."""
    return load_image(path, 3)


DEPTH_SCALE: float = 0.001
"""Metres per unit of an integer (16-bit) depth image: millimetres, what RealSense and Kinect
drivers write. A float depth image is read as metres."""

_FLOAT_MODES = ("F",)
_INTEGER_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_UNITS = "expected a float32 TIFF in metres or a 16-bit PNG/TIFF in millimetres (--depth-scale)"


def load_depth(path: str | Path, scale: float | None = None) -> np.ndarray:
    """Decode a depth image into float32 metres.

    A float TIFF (Cornell's and Jacquard's LZW files) is metres already; a 16-bit (or 32-bit
    integer) PNG or TIFF is multiplied by ``scale`` (default :data:`DEPTH_SCALE`, millimetres).
    An 8-bit or colour image is an error: 256 levels cannot hold a depth range, and reading
    either as metres would feed the model nonsense without a word.

    A map with no valid pixel is an error naming the file: it would silently become zeros.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"depth file not found: {path}")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"depth scale must be a finite number > 0 (metres per unit), got {scale}")
    with open_image(path) as im:
        if im.mode in _FLOAT_MODES:
            depth = np.asarray(im, dtype=np.float32)
        elif im.mode in _INTEGER_MODES:
            units = np.asarray(im).astype(np.float32)
            depth = units * np.float32(DEPTH_SCALE if scale is None else scale)
        else:
            bands = len(im.getbands())
            what = "8-bit" if bands == 1 else f"{bands}-channel ({im.mode})"
            raise GraspDataError(f"{path}: {what} image is not a depth map; {_UNITS}")
    if depth.ndim != 2:
        raise GraspDataError(f"{path}: expected a single-channel depth image, got {depth.shape}")
    if not (np.isfinite(depth) & (depth > 0)).any():  # would be inpainted to a flat zero map
        raise GraspDataError(f"{path}: depth map has no valid pixel (all NaN, inf or <= 0)")
    return depth


NEIGHBOURS: tuple[tuple[int, int], ...] = (
    (-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1),
)  # fmt: skip
"""The 8 neighbours ``(dy, dx)`` a hole pixel is filled from."""


def fill_depth_holes(depth: np.ndarray) -> np.ndarray:
    """Fill NaN, inf and non-positive depth so means and resizing are not poisoned by holes.

    Rounds until none is left: every hole with a valid 8-neighbour takes the mean of its valid
    neighbours (summed and divided in float64, stored as float32) and counts as valid from the
    next round on. Summing at most 8 float32 values in float64 is exact, so any runtime gets the
    same bits. A map with no valid pixel becomes zeros.
    """
    depth = np.asarray(depth, dtype=np.float32)
    valid = np.isfinite(depth) & (depth > 0)
    if valid.all():
        return depth
    if not valid.any():
        return np.zeros_like(depth)
    # padded by one ring of holes that never fill; a round reads only the hole pixels' own
    # neighbours (a few percent of the map), then fills them all at once
    vals = np.pad(np.where(valid, depth, 0).astype(np.float64), 1)  # holes hold 0 until filled
    known = np.pad(valid, 1)
    ys, xs = np.nonzero(~valid)
    ys, xs = ys + 1, xs + 1
    while len(ys):
        total, count = np.zeros(len(ys)), np.zeros(len(ys), np.int64)
        for dy, dx in NEIGHBOURS:
            k = known[ys + dy, xs + dx]
            total += np.where(k, vals[ys + dy, xs + dx], 0.0)
            count += k
        new = count > 0
        vals[ys[new], xs[new]] = (total[new] / count[new]).astype(np.float32)
        known[ys[new], xs[new]] = True
        ys, xs = ys[~new], xs[~new]
    return vals[1:-1, 1:-1].astype(np.float32)


def area_weights(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` float64 weights of the area resize along one axis.

    Output pixel ``d`` covers input ``[d * k, (d + 1) * k)`` with ``k = n_in / n_out``; input
    pixel ``s`` covers ``[s, s + 1)``; the weight is the overlap divided by ``k``.
    """
    k = n_in / n_out
    d = np.arange(n_out, dtype=np.float64)[:, None]
    s = np.arange(n_in, dtype=np.float64)[None]
    return np.clip(np.minimum((d + 1) * k, s + 1) - np.maximum(d * k, s), 0, None) / k


def resize_area(img: np.ndarray, size: int) -> np.ndarray:
    """Resize an ``(H, W)`` or ``(H, W, C)`` image to ``size x size`` by area averaging.

    Computed in float64 as ``Wy @ img @ Wx.T`` (:func:`area_weights`); uint8 is rounded half to
    even and clipped, float is returned as float32. Unchanged size returns the image as is.
    """
    H, W = img.shape[:2]
    if H == W == size:
        return img
    x = img.astype(np.float64).reshape(H, W, -1)
    C = x.shape[2]
    rows = (area_weights(H, size) @ x.reshape(H, W * C)).reshape(size, W, C)  # along H
    cols = area_weights(W, size) @ rows.transpose(1, 0, 2).reshape(W, size * C)  # along W
    out = cols.reshape(size, size, C).transpose(1, 0, 2).reshape(size, size, *img.shape[2:])
    if img.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out.astype(np.float32)


def normalise_depth(depth: np.ndarray, clip: float = DEPTH_CLIP) -> np.ndarray:
    """Subtract the mean depth (taken in float64, then float32) and clip to ``±clip`` metres
    in float32; call on hole-free depth."""
    depth = np.asarray(depth, dtype=np.float32)
    mean = np.float32(depth.mean(dtype=np.float64))
    return np.clip(depth - mean, np.float32(-clip), np.float32(clip))


NORMALISE_MODES = ("fixed", "image")


def standardise(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit std over the whole array: one mean and std for all channels, as
    TensorFlow's ``per_image_standardization``, so colour ratios survive; a flat array -> 0."""
    x = x.astype(np.float32)
    return (x - x.mean()) / max(float(x.std()), 1e-6)


def to_input(
    rgb: np.ndarray | None, depth: np.ndarray | None, normalise: str = "fixed"
) -> torch.Tensor:
    """Stack normalised RGB and depth into a ``(C, S, S)`` float32 tensor.

    ``normalise``: ``"fixed"`` gives ImageNet-normalised RGB and depth as it comes (metres
    minus the crop's mean); ``"image"`` standardises RGB and depth per view, each on its own
    statistics, so lighting and the camera's distance to the table do not shift the input.
    """
    channels = []
    if rgb is not None:
        if normalise == "image":
            rgb = standardise(rgb)
        else:
            rgb = (rgb.astype(np.float32) / 255.0 - RGB_MEAN) / RGB_STD
        channels.append(rgb.transpose(2, 0, 1))
    if depth is not None:
        channels.append((standardise(depth) if normalise == "image" else depth)[None])
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(channels, axis=0), np.float32))


# ---------------------------------------------------------------------------------------------
# Augmentation
# ---------------------------------------------------------------------------------------------


class GraspAugment:
    """Grasp-aware augmentation: the rectangle corners move with the image as keypoints.

    RGB, depth and corners share the geometry: an affine map about the image centre, then
    flips; uncovered borders are 0 (black RGB, mean depth). Colour jitter touches RGB only,
    Gaussian noise depth only. A DataLoader worker reseeds from its own torch seed, so
    workers do not repeat each other's augmentations.
    """

    def __init__(
        self,
        *,
        rotate: tuple[float, float] = (-180.0, 180.0),
        zoom: tuple[float, float] = (1.0, 1.25),
        translate: float = 0.05,
        hflip: float = 0.5,
        vflip: float = 0.5,
        color_jitter: float = 0.2,
        color_p: float = 0.8,
        depth_noise: float = 0.005,
        seed: int | None = None,
    ) -> None:
        """Configure the pipeline.

        Args:
            rotate: Range in degrees, counter-clockwise on screen (albumentations' sign).
            zoom: Scale range; values above 1 zoom in on the objects.
            translate: Largest shift as a fraction of the image size, per axis.
            hflip, vflip: Probabilities of a horizontal and of a vertical flip.
            color_jitter: Brightness, contrast and saturation range (0 disables; hue ±0.02).
            color_p: Probability of the colour jitter.
            depth_noise: Standard deviation of the depth noise in metres (0 disables).
            seed: Seed for reproducible augmentation outside DataLoader workers.
        """
        transforms = [
            A.Affine(
                rotate=rotate,
                scale=zoom,
                translate_percent={"x": (-translate, translate), "y": (-translate, translate)},
                interpolation=cv2.INTER_LINEAR,
                mask_interpolation=cv2.INTER_LINEAR,
                border_mode=cv2.BORDER_CONSTANT,
                fill=0,
                fill_mask=0,
                p=1.0,
            ),
            A.HorizontalFlip(p=hflip),
            A.VerticalFlip(p=vflip),
        ]
        if color_jitter > 0:
            j = color_jitter
            transforms.append(
                A.ColorJitter(
                    brightness=(1 - j, 1 + j),
                    contrast=(1 - j, 1 + j),
                    saturation=(1 - j, 1 + j),
                    hue=(-0.02, 0.02),
                    p=color_p,
                )
            )
        self.transform = A.Compose(
            transforms,
            keypoint_params=A.KeypointParams(format="xy", remove_invisible=False),
            seed=seed,
        )
        self.depth_noise = depth_noise
        self.rng = np.random.default_rng(seed)
        self._worker_seed: int | None = None

    def reseed(self, seed: int) -> None:
        """Restart the random streams (the training engine does this per item).

        Inside a worker this replaces the worker's own seeding, which would otherwise follow.
        """
        info = torch.utils.data.get_worker_info()
        if info is not None:
            self._worker_seed = info.seed
        self.transform.set_random_seed(seed % 2**32)
        self.rng = np.random.default_rng(seed)

    def _reseed_in_worker(self) -> None:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.seed != self._worker_seed:
            self.reseed(info.seed)

    def __call__(
        self, rgb: np.ndarray | None, depth: np.ndarray | None, rects: np.ndarray
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        """Augment one view.

        Args:
            rgb: ``(H, W, 3)`` uint8 or None.
            depth: ``(H, W)`` float32 or None (at least one of rgb/depth is required).
            rects: ``(K, 4, 2)`` corners in the same pixel frame.

        Returns:
            ``(rgb, depth, rects)`` transformed alike; None stays None.
        """
        self._reseed_in_worker()
        shape = (rgb if rgb is not None else depth).shape[:2]
        targets = {
            "image": rgb if rgb is not None else np.zeros((*shape, 3), np.uint8),
            "keypoints": np.asarray(rects, dtype=np.float32).reshape(-1, 2),
        }
        if depth is not None:
            targets["mask"] = depth
        out = self.transform(**targets)
        rects = np.asarray(out["keypoints"], dtype=np.float32).reshape(-1, 4, 2)
        if depth is not None:
            depth = out["mask"]
            if self.depth_noise > 0:
                depth = depth + self.rng.normal(0, self.depth_noise, depth.shape).astype(np.float32)
        return (out["image"] if rgb is not None else None), depth, rects


def crop_box(
    shape: tuple[int, int], side: int, centre: np.ndarray | None = None
) -> tuple[int, int, int]:
    """The square ``(x0, y0, side)`` around ``centre`` (x, y), or the image centre (deployment
    and validation) when None, shifted to stay inside an image of ``shape = (H, W)``."""
    H, W = shape
    if centre is None:
        return (W - side) // 2, (H - side) // 2, side
    cx, cy = centre
    x0 = int(np.clip(round(cx - side / 2), 0, W - side))
    y0 = int(np.clip(round(cy - side / 2), 0, H - side))
    return x0, y0, side


def crop_resize(
    rgb: np.ndarray | None,
    depth: np.ndarray | None,
    box: tuple[int, int, int],
    size: int,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Cut the square ``box = (x0, y0, side)`` and resize it to ``size``; clean the depth.

    Shared by the datasets and by single-image inference (``vtfm grasp``), so a deployed
    model sees exactly the preprocessing it was trained on.
    """
    x0, y0, crop = box
    if rgb is not None:
        rgb = resize_area(rgb[y0 : y0 + crop, x0 : x0 + crop], size)
    if depth is not None:
        depth = fill_depth_holes(depth[y0 : y0 + crop, x0 : x0 + crop])
        depth = normalise_depth(resize_area(depth, size))
    return rgb, depth


def crop_to_output(points: np.ndarray, box: tuple[int, int, int], size: int) -> np.ndarray:
    """Image pixel coordinates -> output-map coordinates of :func:`crop_resize`.

    Pixel centres sit at integer coordinates; the area resize maps x to (x + 0.5) * scale - 0.5.
    """
    x0, y0, crop = box
    scale = size / crop
    return ((points - np.array([x0, y0], np.float32) + 0.5) * scale - 0.5).astype(np.float32)


def output_to_crop(points: np.ndarray, box: tuple[int, int, int], size: int) -> np.ndarray:
    """Inverse of :func:`crop_to_output`: map predictions back onto the original image."""
    x0, y0, crop = box
    scale = size / crop
    return ((points + 0.5) / scale - 0.5 + np.array([x0, y0], np.float32)).astype(np.float32)

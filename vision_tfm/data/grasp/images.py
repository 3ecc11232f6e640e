"""Image side of a grasp view: decoding, depth cleaning, crops, normalisation, augmentation.

Depth: holes (NaN, inf, <= 0) are filled with ``cv2.inpaint`` (Navier-Stokes), then the crop's
mean is subtracted and the result clipped to ``±depth_clip`` metres. RGB is ImageNet-normalised,
or (``normalise="image"``) RGB and depth are each standardised on the view's own statistics.
"""

from __future__ import annotations

from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import torch

from vision_tfm.data.datasets import open_image

from .annotations import GraspDataError

RGB_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # ImageNet, for pretrained backbones
RGB_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
DEPTH_CLIP: float = 1.0
"""Metres either side of the crop's mean depth that survive normalisation (as in GG-CNN)."""


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


def load_rgb(path: str | Path) -> np.ndarray:
    """Decode an RGB view; a missing or corrupt file is a one-line error naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    with open_image(path) as im:
        return np.asarray(im.convert("RGB"))


def load_depth(path: str | Path) -> np.ndarray:
    """Decode a float depth TIFF (Pillow reads Cornell's and Jacquard's LZW files).

    A map with no valid pixel is an error naming the file: it would silently become zeros.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"depth file not found: {path}")
    with open_image(path) as im:
        depth = np.asarray(im, dtype=np.float32)
    if depth.ndim != 2:
        raise GraspDataError(f"{path}: expected a single-channel depth image, got {depth.shape}")
    if not (np.isfinite(depth) & (depth > 0)).any():  # would be inpainted to a flat zero map
        raise GraspDataError(f"{path}: depth map has no valid pixel (all NaN, inf or <= 0)")
    return depth


def fill_depth_holes(depth: np.ndarray) -> np.ndarray:
    """Inpaint NaN, inf and non-positive depth so means and resizing are not poisoned by holes.

    Uses ``cv2.inpaint`` (Navier-Stokes, radius 1) on depth scaled to [0, 1]; a map with no valid
    pixel becomes zeros.
    """
    depth = np.asarray(depth, dtype=np.float32)
    holes = ~np.isfinite(depth) | (depth <= 0)
    if not holes.any():
        return depth
    if holes.all():
        return np.zeros_like(depth)
    scale = float(depth[~holes].max())
    scaled = np.where(holes, 0.0, depth / scale).astype(np.float32)
    return cv2.inpaint(scaled, holes.astype(np.uint8), 1, cv2.INPAINT_NS) * scale


def normalise_depth(depth: np.ndarray, clip: float = DEPTH_CLIP) -> np.ndarray:
    """Subtract the mean depth and clip to ``±clip`` metres; call on hole-free depth."""
    return np.clip(depth - depth.mean(), -clip, clip).astype(np.float32)


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

    Geometry (shared by RGB, depth and corners): an affine map with rotation by any angle, zoom
    and a small shift about the image centre (the objects, after the dataset's crop), then
    horizontal and vertical flips. Uncovered borders are 0 (black RGB; mean depth, since depth
    is already mean-subtracted). Colour jitter touches RGB only (depth rides as an albumentations
    mask); Gaussian depth noise touches depth only.

    In a DataLoader worker the random state is re-seeded from the worker's torch seed, so
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
            hflip: Probability of a horizontal flip.
            vflip: Probability of a vertical flip.
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
            self._worker_seed = info.seed
            self.transform.set_random_seed(info.seed % 2**32)
            self.rng = np.random.default_rng(info.seed)

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
    """The square ``(x0, y0, side)`` around ``centre`` (x, y), or the image centre when None,
    shifted to stay inside an image of ``shape = (H, W)``.

    The image centre is the deployment crop: :func:`vision_tfm.grasp.predict_grasps` and the
    validation of every run use it, so the reported figure is what a robot's camera gets.
    """
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
    depth_clip: float = DEPTH_CLIP,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Cut the square ``box = (x0, y0, side)`` and resize it to ``size``; clean the depth.

    Shared by the datasets and by single-image inference (``vtfm grasp``), so a deployed
    model sees exactly the preprocessing it was trained on.
    """
    x0, y0, crop = box
    interp = cv2.INTER_AREA if size < crop else cv2.INTER_LINEAR
    if rgb is not None:
        rgb = cv2.resize(rgb[y0 : y0 + crop, x0 : x0 + crop], (size, size), interpolation=interp)
    if depth is not None:
        depth = fill_depth_holes(depth[y0 : y0 + crop, x0 : x0 + crop])
        depth = normalise_depth(cv2.resize(depth, (size, size), interpolation=interp), depth_clip)
    return rgb, depth


def crop_to_output(points: np.ndarray, box: tuple[int, int, int], size: int) -> np.ndarray:
    """Image pixel coordinates -> output-map coordinates of :func:`crop_resize`.

    Pixel centres sit at integer coordinates; cv2.resize maps x to (x + 0.5) * scale - 0.5.
    """
    x0, y0, crop = box
    scale = size / crop
    return ((points - np.array([x0, y0], np.float32) + 0.5) * scale - 0.5).astype(np.float32)


def output_to_crop(points: np.ndarray, box: tuple[int, int, int], size: int) -> np.ndarray:
    """Inverse of :func:`crop_to_output`: map predictions back onto the original image."""
    x0, y0, crop = box
    scale = size / crop
    return ((points + 0.5) / scale - 0.5 + np.array([x0, y0], np.float32)).astype(np.float32)

"""Cornell and Jacquard grasp datasets, train/val splits and grasp-aware augmentation.

Pipeline of one item (``GraspDataset.__getitem__``):

1. Load RGB (Pillow) and/or depth (float32 metres, Pillow; Jacquard's TIFFs are LZW).
2. Crop a ``crop_size`` square centred on the mean of the view's ground-truth corners, shifted to
   stay inside the image (GG-CNN's 300-pixel Cornell crop around the object), then resize it to
   ``output_size``. Jacquard crops default to the whole (square) image.
3. Depth: fill holes (NaN, inf, <= 0) with ``cv2.inpaint`` (Navier-Stokes), subtract the crop's
   mean and clip to ``±depth_clip`` metres.
4. Optional :class:`GraspAugment` (albumentations; corners ride along as keypoints).
5. Encode the rectangles into ``quality, cos, sin, width`` maps (:mod:`vision_tfm.grasp.maps`).

The input tensor is ``(C, S, S)`` float32: channels ``R, G, B`` (ImageNet mean/std), ``D`` or
``R, G, B, D``. Rectangles follow :mod:`vision_tfm.grasp.rect` (pixel centres at integer
coordinates, opening along corner 0 -> 1).

Bad data policy: a Cornell rectangle holding NaN values (a quirk of the real files) is skipped
and counted (``CornellGrasp.skipped_rects``, one warning per dataset); every other problem (empty
file, line count not a multiple of 4, wrong number of fields, other non-numeric text, missing
file, image smaller than the crop, no views) raises a one-line error naming the file.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import albumentations as A
import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

from vision_tfm.data.datasets import open_image
from vision_tfm.errors import DataError
from vision_tfm.grasp.maps import MAP_KEYS, WIDTH_SCALE, encode_grasp_maps
from vision_tfm.grasp.rect import corners_to_params, params_to_corners

__all__ = [
    "DEPTH_CLIP",
    "RGB_MEAN",
    "RGB_STD",
    "CornellGrasp",
    "GraspAugment",
    "GraspDataError",
    "GraspDataset",
    "GraspView",
    "JacquardGrasp",
    "Split",
    "build_grasp_datasets",
    "corners_to_jacquard",
    "fill_depth_holes",
    "find_cornell_views",
    "find_jacquard_views",
    "grasp_collate",
    "jacquard_to_corners",
    "normalise_depth",
    "read_cornell_rects",
    "read_jacquard_grasps",
    "split_ids",
]

InputMode = Literal["rgb", "depth", "rgbd"]
RGB_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)  # ImageNet, for pretrained backbones
RGB_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
DEPTH_CLIP: float = 1.0
"""Metres either side of the crop's mean depth that survive normalisation (as in GG-CNN)."""


class GraspDataError(DataError):
    """Malformed grasp data; the message starts with the offending file."""


MAX_COORD = 1e5
"""Largest corner coordinate, opening or jaw (pixels) an annotation may hold; anything beyond
is a corrupt file, not an image (it would encode to empty maps and train to nothing)."""


def _read_lines(path: Path) -> list[str]:
    """An annotation file's lines; a binary file is a one-line error naming it."""
    try:
        return path.read_text().splitlines()
    except UnicodeDecodeError:
        raise GraspDataError(f"{path}: not a text annotation file (binary data)") from None


def _check_rect(corners: np.ndarray, path: Path, lineno: int) -> None:
    """A rectangle must lie within :data:`MAX_COORD` and have a non-zero opening and jaw."""
    if np.abs(corners).max() > MAX_COORD:
        raise GraspDataError(f"{path}:{lineno}: rectangle coordinate beyond {MAX_COORD:g} pixels")
    sides = np.linalg.norm(np.diff(corners[:3], axis=0), axis=1)  # opening, jaw
    if not (sides > 1e-6).all():
        raise GraspDataError(f"{path}:{lineno}: zero-size rectangle (opening or jaw is 0)")


# ---------------------------------------------------------------------------------------------
# Annotation files
# ---------------------------------------------------------------------------------------------


def read_cornell_rects(path: str | Path) -> tuple[np.ndarray, int]:
    """Read a Cornell ``pcdXXXXcpos.txt``: 4 lines of ``x y`` per rectangle.

    Blank lines and trailing spaces are ignored. Rectangles holding NaN values (a known Cornell
    quirk) are dropped and counted; any other non-numeric text is an error.

    Returns:
        ``(rects, skipped)``: float32 ``(K, 4, 2)`` corners and the number of dropped rectangles.

    Raises:
        GraspDataError: Empty or binary file, a line without exactly two numbers, a rectangle
            beyond :data:`MAX_COORD` or of zero size (each naming file and line), a line count
            that is not a multiple of 4, or no valid rectangle left.
    """
    path = Path(path)
    rows, linenos = [], []
    for lineno, line in enumerate(_read_lines(path), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise GraspDataError(f"{path}:{lineno}: expected 'x y', got {line.strip()!r}")
        rows.append(_numbers(fields, path, lineno, line))
        linenos.append(lineno)
    if not rows:
        raise GraspDataError(f"{path}: empty annotation file")
    if len(rows) % 4:
        raise GraspDataError(f"{path}: {len(rows)} corner lines, not a multiple of 4")
    rects = np.array(rows, dtype=np.float64).reshape(-1, 4, 2)
    valid = ~np.isnan(rects).any(axis=(1, 2))  # NaN: the known quirk; inf is checked below
    for k in np.flatnonzero(valid):
        _check_rect(rects[k], path, linenos[4 * k])
    if not valid.any():
        raise GraspDataError(f"{path}: no rectangle without NaN values")
    return rects[valid].astype(np.float32), int((~valid).sum())


def _numbers(fields: list[str], path: Path, lineno: int, line: str) -> list[float]:
    """Parse one annotation line; a literal NaN parses (callers decide), free text is an error."""
    try:
        return [float(f) for f in fields]
    except ValueError:
        raise GraspDataError(f"{path}:{lineno}: non-numeric field in {line.strip()!r}") from None


def read_jacquard_grasps(path: str | Path) -> np.ndarray:
    """Read a Jacquard ``*_grasps.txt``: ``x;y;theta_deg;opening;jaw`` per line (CRLF tolerated).

    Exact duplicate rows are removed, keeping file order. Rows that differ only in the jaw size
    are distinct rectangles and are kept.

    Returns:
        float64 ``(K, 5)`` rows in Jacquard's own units (see :func:`jacquard_to_corners`).

    Raises:
        GraspDataError: A line without 5 finite numbers, with an opening or jaw <= 0 or a value
            beyond :data:`MAX_COORD` (naming file and line), or no grasp at all.
    """
    path = Path(path)
    rows = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.strip().split(";")
        if len(fields) != 5:
            raise GraspDataError(
                f"{path}:{lineno}: expected 5 ';'-separated fields (x;y;theta;opening;jaw), "
                f"got {len(fields)}"
            )
        row = _numbers(fields, path, lineno, line)
        opening, jaw = row[3:]
        if not all(abs(v) <= MAX_COORD for v in row):  # also NaN and inf
            raise GraspDataError(f"{path}:{lineno}: values must be finite, within {MAX_COORD:g}")
        if opening <= 0 or jaw <= 0:
            raise GraspDataError(
                f"{path}:{lineno}: opening and jaw must be > 0, got {opening:g} and {jaw:g}"
            )
        rows.append(row)
    if not rows:
        raise GraspDataError(f"{path}: empty annotation file")
    _, first = np.unique(np.array(rows), axis=0, return_index=True)
    return np.array(rows)[np.sort(first)]


def jacquard_to_corners(grasps: np.ndarray) -> np.ndarray:
    """Convert Jacquard rows ``(x, y, theta_deg, opening, jaw)`` into ``(K, 4, 2)`` corners.

    Jacquard measures theta in degrees clockwise as seen on screen (the opening points along
    ``(cos t, sin t)`` with y down), so our angle is ``-radians(theta)``; the opening becomes
    corner 0 -> 1. Checked on the samples: the plates then straddle the object (GG-CNN negates too).
    """
    grasps = np.asarray(grasps, dtype=np.float64).reshape(-1, 5)
    params = grasps.copy()
    params[:, 2] = -np.radians(grasps[:, 2])
    return params_to_corners(params).astype(np.float32)


def corners_to_jacquard(corners: np.ndarray) -> np.ndarray:
    """Inverse of :func:`jacquard_to_corners`; theta comes back in ``(-90, 90]`` degrees."""
    params = corners_to_params(np.asarray(corners).reshape(-1, 4, 2))
    params[:, 2] = -np.degrees(params[:, 2])
    return params


# ---------------------------------------------------------------------------------------------
# Finding views
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraspView:
    """One annotated view: file paths and ground truth in source-image pixels.

    Attributes:
        view_id: Unique id, e.g. ``pcd0100`` or ``<object>_<view>`` for Jacquard.
        object_id: Object the view shows (the view id for Cornell, which has no object labels).
        rgb_path: Colour image.
        depth_path: Float32 depth TIFF in metres, or None when absent.
        rects: float32 ``(K, 4, 2)`` corners.
    """

    view_id: str
    object_id: str
    rgb_path: Path
    depth_path: Path | None
    rects: np.ndarray


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None


def _required(path: Path, what: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing {what}")
    return path


def find_cornell_views(root: str | Path) -> tuple[list[GraspView], int]:
    """Find ``pcdXXXXr.png`` views under ``root/*/`` or directly in ``root``.

    Returns:
        ``(views sorted by id, rectangles skipped for NaN values)``.

    Raises:
        FileNotFoundError: No view under ``root``, or a view without its ``cpos.txt``.
    """
    root = Path(root)
    images = sorted([*root.glob("pcd*r.png"), *root.glob("*/pcd*r.png")], key=lambda p: p.name)
    if not images:
        raise FileNotFoundError(f"{root}: no Cornell views (pcdXXXXr.png) here or one level down")
    views, skipped = [], 0
    for rgb in images:
        view_id = rgb.name[: -len("r.png")]
        rects, n = read_cornell_rects(_required(rgb.with_name(f"{view_id}cpos.txt"), "annotations"))
        depth = _existing(rgb.with_name(f"{view_id}d.tiff"))
        views.append(GraspView(view_id, view_id, rgb, depth, rects))
        skipped += n
    return views, skipped


def find_jacquard_views(root: str | Path) -> list[GraspView]:
    """Find ``<object>/<view>_<object>_RGB.png`` views anywhere under ``root``, sorted by object.

    Raises:
        FileNotFoundError: No view under ``root``, or a view without its ``_grasps.txt``.
    """
    root = Path(root)
    images = sorted(root.rglob("*_RGB.png"))
    if not images:
        raise FileNotFoundError(f"{root}: no Jacquard views (*_RGB.png) found")
    views = []
    for rgb in images:
        stem = rgb.name[: -len("_RGB.png")]
        view, _, obj = stem.partition("_")
        grasps = read_jacquard_grasps(_required(rgb.with_name(f"{stem}_grasps.txt"), "grasps"))
        depth = _existing(rgb.with_name(f"{stem}_perfect_depth.tiff"))
        views.append(GraspView(f"{obj}_{view}", obj, rgb, depth, jacquard_to_corners(grasps)))
    return sorted(views, key=lambda v: v.view_id)


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------


class Split(NamedTuple):
    """Train and validation view ids plus a name to print beside every reported figure."""

    train: list[str]
    val: list[str]
    name: str


def split_ids(
    ids: Sequence[str],
    split: Literal["image", "object"] = "image",
    train_frac: float = 0.8,
    seed: int = 0,
    groups: Sequence[str] | None = None,
) -> Split:
    """Split view ids into train and validation sets.

    ``"image"`` shuffles the views with ``seed``; ``"object"`` takes consecutive sorted ids, which
    is roughly object-wise on Cornell (an object fills several consecutive views). When ``groups``
    (one object id per view) is given, the object cut moves forward to the next object boundary
    so no object straddles the two sets.

    Returns:
        ``Split(train, val, name)``, e.g. 56/14 ids for 70 views at 0.8.
    """
    ids = list(ids)
    if len(ids) < 2:
        raise ValueError(f"need at least 2 views to split, got {len(ids)}")
    if not 0 < train_frac < 1:
        raise ValueError(f"train_frac must be in (0, 1), got {train_frac}")
    n_train = min(max(round(train_frac * len(ids)), 1), len(ids) - 1)
    if split == "image":
        order = np.random.default_rng(seed).permutation(len(ids))
        train = sorted(ids[i] for i in order[:n_train])
        val = sorted(ids[i] for i in order[n_train:])
        how = f"image-wise (shuffled, seed {seed})"
    elif split == "object":
        order = np.argsort(ids, kind="stable")
        ordered = [ids[i] for i in order]
        if groups is not None:
            group = [groups[i] for i in order]
            while n_train < len(ids) - 1 and group[n_train] == group[n_train - 1]:
                n_train += 1
        train, val = ordered[:n_train], ordered[n_train:]
        how = "object-wise (consecutive ids)"
    else:
        raise ValueError(f"split must be 'image' or 'object', got {split!r}")
    return Split(train, val, f"{how} {len(train)} train / {len(val)} val")


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


def to_input(rgb: np.ndarray | None, depth: np.ndarray | None) -> torch.Tensor:
    """Stack ImageNet-normalised RGB and depth into a ``(C, S, S)`` float32 tensor."""
    channels = []
    if rgb is not None:
        channels.append(((rgb.astype(np.float32) / 255.0 - RGB_MEAN) / RGB_STD).transpose(2, 0, 1))
    if depth is not None:
        channels.append(depth[None].astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(channels, axis=0)))


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
        """Restart the random streams (the training engine does this every epoch)."""
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


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


class GraspDataset(Dataset):
    """Views -> ``(input, maps, rects)``; see the module docstring for the pipeline.

    Items:
        input: float32 ``(C, S, S)``, C = 3 (rgb), 1 (depth) or 4 (rgbd, depth last).
        maps: dict ``quality, cos, sin, width`` of float32 ``(1, S, S)`` tensors.
        rects: float32 numpy ``(K, 4, 2)`` ground-truth corners in output pixels, for the metric.
    """

    def __init__(
        self,
        views: Sequence[GraspView],
        *,
        input: InputMode = "rgbd",
        output_size: int = 224,
        crop_size: int | None = None,
        augment: GraspAugment | None = None,
        width_scale: float = WIDTH_SCALE,
        depth_clip: float = DEPTH_CLIP,
        repeat: int = 1,
        cache: bool = False,
    ) -> None:
        """Wrap already-discovered views.

        Args:
            views: Views to serve, in order.
            input: Which channels to feed the model.
            output_size: Side S of the square model input and maps.
            crop_size: Side of the square crop around the grasps; None means the shorter image side.
            augment: Applied after crop and resize (pass one only for training).
            width_scale: Width-map normaliser; must match decoding.
            depth_clip: See :func:`normalise_depth`.
            repeat: Serve every view this many times per pass (each with its own augmentation),
                so a tiny training set still gives an epoch enough steps.
            cache: Keep every view's decoded crop in memory (~0.8 MB per view at 224 RGB-D):
                decoding and depth inpainting are most of an item's cost. For small datasets.

        Raises:
            FileNotFoundError: ``input`` needs depth and a view has no depth file.
        """
        if input not in ("rgb", "depth", "rgbd"):
            raise ValueError(f"input must be 'rgb', 'depth' or 'rgbd', got {input!r}")
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        if output_size < 1:
            raise ValueError(f"output_size must be >= 1, got {output_size}")
        if crop_size is not None and crop_size < 0:
            raise ValueError(
                f"crop_size must be >= 0 (0 or None: the shorter side), got {crop_size}"
            )
        if input != "rgb":
            for v in views:
                if v.depth_path is None:
                    raise FileNotFoundError(f"{_depth_name(v)}: missing depth for input={input!r}")
        if crop_size:
            for v in views:  # header only: fail before a run starts, not at the first batch
                path = v.rgb_path if input != "depth" else v.depth_path
                with open_image(path) as im:
                    w, h = im.size
                if crop_size > min(w, h):
                    raise GraspDataError(
                        f"{path}: image {w}x{h} is smaller than the {crop_size}x{crop_size} crop"
                    )
        self.views = list(views)
        self.input = input
        self.output_size = output_size
        self.crop_size = crop_size
        self.augment = augment
        self.width_scale = width_scale
        self.depth_clip = depth_clip
        self.repeat = repeat
        self.cache: dict[int, tuple] | None = {} if cache else None

    @property
    def ids(self) -> list[str]:
        """View ids in item order."""
        return [v.view_id for v in self.views]

    @property
    def in_chans(self) -> int:
        """Channels of the input tensor."""
        return {"rgb": 3, "depth": 1, "rgbd": 4}[self.input]

    def __len__(self) -> int:
        return len(self.views) * self.repeat

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], np.ndarray]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"view index {index} out of range for {len(self)} items")
        i = index % len(self.views)
        if self.cache is not None and i in self.cache:
            rgb, depth, rects = self.cache[i]
        else:
            rgb, depth, rects = self._load(self.views[i])
            if self.cache is not None:
                self.cache[i] = (rgb, depth, rects)
        if self.augment is not None:
            rgb, depth, rects = self.augment(rgb, depth, rects)
        S = self.output_size
        maps = encode_grasp_maps(rects, (S, S), width_scale=self.width_scale)
        targets = {k: torch.from_numpy(maps[k][None]) for k in MAP_KEYS}
        return to_input(rgb, depth), targets, rects

    def _load(self, view: GraspView) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        """Decode one view and cut its crop: ``(rgb, depth, rects)`` at the output size."""
        rgb = load_rgb(view.rgb_path) if self.input != "depth" else None
        depth = load_depth(view.depth_path) if self.input != "rgb" else None
        if rgb is not None and depth is not None and rgb.shape[:2] != depth.shape:
            raise GraspDataError(
                f"{view.depth_path}: depth {depth.shape} does not match RGB {rgb.shape[:2]}"
            )
        H, W = (rgb if rgb is not None else depth).shape[:2]
        crop = self.crop_size or min(H, W)
        if crop > min(H, W):
            raise GraspDataError(
                f"{view.rgb_path}: image {W}x{H} is smaller than the {crop}x{crop} crop"
            )
        cx, cy = view.rects.reshape(-1, 2).mean(axis=0)
        x0 = int(np.clip(round(cx - crop / 2), 0, W - crop))
        y0 = int(np.clip(round(cy - crop / 2), 0, H - crop))
        S = self.output_size
        rgb, depth = crop_resize(rgb, depth, (x0, y0, crop), S, self.depth_clip)
        return rgb, depth, crop_to_output(view.rects, (x0, y0, crop), S)


def _depth_name(view: GraspView) -> Path:
    """The depth file a view would need (for error messages)."""
    name = view.rgb_path.name
    if name.endswith("_RGB.png"):
        return view.rgb_path.with_name(name[: -len("_RGB.png")] + "_perfect_depth.tiff")
    return view.rgb_path.with_name(name[: -len("r.png")] + "d.tiff")


def _select(views: list[GraspView], ids: Sequence[str] | None) -> list[GraspView]:
    """Keep ``ids`` (in the given order) or all views; unknown ids are an error."""
    if ids is None:
        return views
    by_id = {v.view_id: v for v in views}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise KeyError(f"unknown view ids: {missing[:5]}")
    return [by_id[i] for i in ids]


class CornellGrasp(GraspDataset):
    """Cornell grasping dataset (positive rectangles only), GG-CNN-style 300-pixel crop."""

    def __init__(
        self,
        root: str | Path,
        *,
        ids: Sequence[str] | None = None,
        crop_size: int = 300,
        **kwargs: Any,
    ) -> None:
        """Discover views under ``root`` (``root/*/pcdXXXX*`` or ``root/pcdXXXX*``).

        Args:
            root: Dataset folder.
            ids: Subset of view ids (e.g. from :func:`split_ids`); None keeps all.
            crop_size: Side of the crop around the grasps before resizing.
            **kwargs: :class:`GraspDataset` options (``input``, ``output_size``, ``augment`` ...).
        """
        views, self.skipped_rects = find_cornell_views(root)
        if self.skipped_rects:
            warnings.warn(
                f"{root}: skipped {self.skipped_rects} Cornell rectangles with NaN values",
                stacklevel=2,
            )
        super().__init__(_select(views, ids), crop_size=crop_size, **kwargs)


class JacquardGrasp(GraspDataset):
    """Jacquard dataset (``*_RGB.png``, ``*_perfect_depth.tiff``, ``*_grasps.txt``)."""

    def __init__(
        self,
        root: str | Path,
        *,
        ids: Sequence[str] | None = None,
        crop_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Discover views anywhere under ``root``.

        Args:
            root: Dataset folder (one sub-folder per object).
            ids: Subset of view ids ``<object>_<view>``; None keeps all.
            crop_size: Crop side; None keeps the whole square image.
            **kwargs: :class:`GraspDataset` options.
        """
        super().__init__(_select(find_jacquard_views(root), ids), crop_size=crop_size, **kwargs)


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


def grasp_collate(
    batch: Sequence[tuple[torch.Tensor, dict[str, torch.Tensor], np.ndarray]],
) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[np.ndarray]]:
    """Stack inputs and maps; keep the per-view rectangles as a list since K varies.

    Returns:
        ``(inputs (B, C, S, S), {key: (B, 1, S, S)}, [rects (K_i, 4, 2)])``.
    """
    inputs = torch.stack([item[0] for item in batch])
    maps = {k: torch.stack([item[1][k] for item in batch]) for k in MAP_KEYS}
    return inputs, maps, [item[2] for item in batch]


def build_grasp_datasets(
    name: Literal["cornell", "jacquard"],
    root: str | Path,
    *,
    split: Literal["image", "object"] = "image",
    train_frac: float = 0.8,
    seed: int = 0,
    augment: GraspAugment | bool = True,
    repeat: int = 1,
    cache: bool = False,
    **kwargs,
) -> tuple[GraspDataset, GraspDataset, str]:
    """Build the train and validation datasets of one split.

    Args:
        name: ``"cornell"`` or ``"jacquard"``.
        root: Dataset folder.
        split: ``"image"`` (shuffled) or ``"object"`` (consecutive ids / whole objects).
        train_frac: Share of views for training.
        seed: Shuffle seed of the image-wise split.
        augment: True for the default :class:`GraspAugment`, False for none, or an instance;
            applied to the training set only.
        repeat: Passes over the training views per epoch (see :class:`GraspDataset`).
        cache: Keep decoded crops in memory, both splits (see :class:`GraspDataset`).
        **kwargs: Dataset options (``input``, ``output_size``, ``crop_size``, ``width_scale``).

    Returns:
        ``(train, val, split_name)``; print ``split_name`` beside every reported figure.
    """
    classes = {"cornell": CornellGrasp, "jacquard": JacquardGrasp}
    if name not in classes:
        raise ValueError(f"unknown grasp dataset {name!r}; expected one of {sorted(classes)}")
    cls = classes[name]
    full = cls(root, **kwargs)
    groups = [v.object_id for v in full.views]
    train_ids, val_ids, how = split_ids(full.ids, split, train_frac, seed, groups=groups)
    if augment is True:
        augment = GraspAugment()
    train = GraspDataset(
        _select(full.views, train_ids),
        **{**_options(full), "augment": augment or None, "repeat": repeat, "cache": cache},
    )
    val = GraspDataset(_select(full.views, val_ids), **_options(full), cache=cache)
    return train, val, f"{name} {how}"


def _options(ds: GraspDataset) -> dict[str, Any]:
    """Constructor options of a dataset, to derive subsets without re-reading annotations."""
    return {
        "input": ds.input,
        "output_size": ds.output_size,
        "crop_size": ds.crop_size,
        "width_scale": ds.width_scale,
        "depth_clip": ds.depth_clip,
    }

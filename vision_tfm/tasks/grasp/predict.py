"""Inference on raw views, as ``vtfm grasp`` runs it: one checkpoint, many views, in batches.

Each view is cropped exactly as validation crops it (:func:`vision_tfm.data.grasp.crop_box` at
the image centre), so the figure a run reports is the one this path gets.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...constants import MAP_KEYS
from ...data.grasp import crop_box, crop_resize, load_depth, load_rgb, output_to_crop, to_input
from ...errors import ConfigError, InputError, MissingFileError
from ...grasp import Grasp, decode_grasps
from ...grasp.camera import Intrinsics, MetricGrasp, grasps_in_metres
from ...io import load_checkpoint
from ..predict import finite_input, is_image
from .inference import grasp_maps
from .task import GraspTask

_DEPTH_OF = (  # an RGB view's name -> its depth file's, in the datasets' layouts
    (re.compile(r"^(pcd\d+)r\.png$"), r"\1d.tiff"),  # Cornell
    (re.compile(r"^(.*)_RGB\.png$"), r"\1_perfect_depth.tiff"),  # Jacquard
)
MIN_VIEW_SIDE = 32
"""Shortest side a view may have when the model crops the whole shorter side
(``data.crop_size`` 0); with a set crop size, the view must hold that crop."""
_NOT_VIEWS = re.compile(r"(^pcd\d+d\.tiff$)|(_(perfect|stereo)_depth\.tiff$)|(_mask\.png$)")


def depth_beside(image: str | os.PathLike) -> Path | None:
    """The depth file a Cornell (``pcd0100r.png``) or Jacquard (``*_RGB.png``) view has beside
    it by the dataset's naming; None for any other name."""
    image = Path(image)
    for pattern, repl in _DEPTH_OF:
        if pattern.match(image.name):
            return image.with_name(pattern.sub(repl, image.name))
    return None


def is_view(path: Path) -> bool:
    """Whether a folder's file is an RGB view: an image that is not a dataset's depth map or
    mask (``pcd0100d.tiff``, ``*_perfect_depth.tiff``, ``*_mask.png``)."""
    return is_image(path) and not _NOT_VIEWS.search(path.name)


@dataclass
class View:
    """One raw view, preprocessed: the model's input, the crop it came from, what is shown."""

    x: torch.Tensor  # (C, S, S) float32
    box: tuple[int, int, int]  # (x0, y0, side) of the centre crop
    shown: np.ndarray  # the RGB image, (H, W, 3) uint8
    depth: Path | None = None  # the depth file read (a depth model's, or for metres)
    metres: np.ndarray | None = None  # (H, W) raw depth in metres, kept for grasps in metres


class GraspPredictor:
    """A grasp checkpoint with the validation preprocessing and decoding, loaded once."""

    def __init__(
        self,
        checkpoint: str | os.PathLike,
        use_ema: bool | None = None,
        depth_scale: float | None = None,
    ) -> None:
        """``depth_scale``: metres per unit of 16-bit depth images (None: millimetres)."""
        self.model, self.cfg = GraspTask.restore(
            load_checkpoint(checkpoint), use_ema, str(checkpoint)
        )
        self.depth_scale = depth_scale

    @property
    def needs_depth(self) -> bool:
        return self.cfg.data.input != "rgb"

    def _depth_file(self, image: str | os.PathLike, why: str) -> Path:
        """The depth file named after ``image`` (:func:`depth_beside`); ``why`` it is needed."""
        depth = depth_beside(image)
        if depth is None:
            raise ConfigError(
                f"{image}: {why} and no depth file is named after it (pcd0100r.png -> "
                "pcd0100d.tiff, *_RGB.png -> *_perfect_depth.tiff); pass --depth with one image"
            )
        if not depth.is_file():
            raise MissingFileError(f"{image}: depth file not found: {depth}")
        return depth

    def load(
        self,
        image: str | os.PathLike,
        depth: str | os.PathLike | None = None,
        keep_depth: bool = False,
    ) -> View:
        """Decode, crop and normalise one view; a depth model (or ``keep_depth``: the raw
        depth map is kept for :meth:`in_metres`) without ``depth`` looks for the depth file
        beside ``image`` (:func:`depth_beside`)."""
        d = self.cfg.data
        rgb = load_rgb(image)
        dep = None
        if self.needs_depth or keep_depth:
            if depth is None:
                why = (
                    f"the model takes input={d.input!r}"
                    if self.needs_depth
                    else "metres need depth"
                )
                depth = self._depth_file(image, why)
            dep = load_depth(depth, self.depth_scale)
        H, W = rgb.shape[:2]
        if dep is not None and dep.shape != (H, W):
            raise InputError(f"depth {dep.shape} does not match image {(H, W)}: {depth}")
        side = d.crop_size or MIN_VIEW_SIDE
        if min(H, W) < side:  # upsampled, objects would be far larger than the model learnt
            what = f"the model's {side}x{side} crop (data.crop_size)"
            what = what if d.crop_size else f"{side} pixels a side"
            raise InputError(f"{image}: view {W}x{H} is smaller than {what}")
        box = crop_box((H, W), min(d.crop_size or min(H, W), H, W))
        fed = dep if self.needs_depth else None
        rgb_c, dep_c = crop_resize(rgb if d.input != "depth" else None, fed, box, d.output_size)
        x = finite_input(to_input(rgb_c, dep_c, d.normalise), depth or image)
        read = Path(depth) if depth is not None else None
        return View(x, box, rgb, read, dep if keep_depth else None)

    @staticmethod
    def in_metres(view: View, grasps: list[Grasp], intrinsics: Intrinsics) -> list[MetricGrasp]:
        """``grasps`` on ``view`` (loaded with ``keep_depth``) in the camera's optical frame,
        metres (:func:`vision_tfm.grasp.camera.grasp_in_metres`)."""
        if view.metres is None:
            raise ConfigError("grasps in metres need the view loaded with keep_depth=True")
        return grasps_in_metres(grasps, view.metres, intrinsics, view.shown.shape[:2])

    @torch.no_grad()
    def grasps(self, views: list[View], top_n: int) -> list[list[Grasp]]:
        """The ``top_n`` best grasps of each view, in the view's own pixel coordinates, from one
        batched forward pass (and its flips, with ``eval.flip_tta``)."""
        x = torch.stack([v.x for v in views])
        out = grasp_maps(self.model, x, self.cfg.eval.flip_tta)
        kw = self.cfg.eval.decode_kwargs(self.cfg.data.width_scale)
        S = self.cfg.data.output_size
        result = []
        for i, view in enumerate(views):
            maps = {k: out[k][i, 0].float().numpy() for k in MAP_KEYS}
            scale = view.box[2] / S
            grasps = []
            for g in decode_grasps(**maps, num_grasps=top_n, **kw):
                ((px, py),) = output_to_crop(np.array([[g.x, g.y]], np.float32), view.box, S)
                grasps.append(
                    Grasp(
                        float(px), float(py), g.angle, g.opening * scale, g.jaw * scale, g.quality
                    )
                )
            result.append(grasps)
        return result


def predict_grasps(
    checkpoint: str | Path,
    image: str | Path,
    depth: str | Path | None = None,
    top_n: int = 5,
    use_ema: bool | None = None,
    depth_scale: float | None = None,
) -> tuple[list[Grasp], np.ndarray]:
    """Top grasps on one raw view, in the view's own pixel coordinates.

    The view gets the validation preprocessing (centre square crop of ``crop_size``, resize,
    normalisation, depth hole filling) and decoding (filters, ``eval.flip_tta``); 16-bit depth
    is ``depth_scale`` metres per unit (None: millimetres). Returns the grasps and the RGB image.
    """
    predictor = GraspPredictor(checkpoint, use_ema, depth_scale)
    if predictor.needs_depth and depth is None:
        raise ConfigError(
            f"the model takes input={predictor.cfg.data.input!r}: pass --depth with a depth file"
        )
    view = predictor.load(image, depth)
    return predictor.grasps([view], top_n)[0], view.shown


def predict_metric_grasps(
    checkpoint: str | Path,
    image: str | Path,
    intrinsics: Intrinsics,
    depth: str | Path | None = None,
    top_n: int = 5,
    use_ema: bool | None = None,
    depth_scale: float | None = None,
) -> list[MetricGrasp]:
    """:func:`predict_grasps` with each grasp also in the camera's optical frame, in metres:
    centre ``(x, y, z)``, yaw about the optical axis and jaw opening, from ``intrinsics`` and
    the view's depth (``depth``, or the file named after ``image``), with any model."""
    predictor = GraspPredictor(checkpoint, use_ema, depth_scale)
    view = predictor.load(image, depth, keep_depth=True)
    return predictor.in_metres(view, predictor.grasps([view], top_n)[0], intrinsics)

"""Single-view inference on a raw image, as ``vtfm grasp`` runs it.

The view is cropped exactly as validation crops it (:func:`vision_tfm.data.grasp.crop_box` at
the image centre), so the figure a run reports is the one this path gets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...constants import MAP_KEYS
from ...data.grasp import crop_box, crop_resize, load_depth, load_rgb, output_to_crop, to_input
from ...errors import ConfigError, InputError
from ...grasp import Grasp, decode_grasps
from ...io import load_checkpoint
from .inference import grasp_maps
from .task import GraspTask


def predict_grasps(
    checkpoint: str | Path,
    image: str | Path,
    depth: str | Path | None = None,
    top_n: int = 5,
    use_ema: bool | None = None,
) -> tuple[list[Grasp], np.ndarray]:
    """Top grasps on one raw view, in the view's own pixel coordinates.

    The view gets the validation preprocessing (centre square crop of ``crop_size``, resize,
    normalisation, depth hole filling) and decoding (filters, ``eval.flip_tta``). Returns the
    grasps and the RGB (or depth) image.
    """
    model, cfg = GraspTask.restore(load_checkpoint(checkpoint), use_ema, str(checkpoint))
    d = cfg.data
    rgb = load_rgb(image) if d.input != "depth" else None
    dep = None
    if d.input != "rgb":
        if depth is None:
            raise ConfigError(f"the model takes input={d.input!r}: pass --depth with a depth file")
        dep = load_depth(depth)
    shown = rgb if rgb is not None else load_rgb(image)
    H, W = shown.shape[:2]
    if dep is not None and dep.shape != (H, W):
        raise InputError(f"depth {dep.shape} does not match image {(H, W)}: {depth}")
    box = crop_box((H, W), min(d.crop_size or min(H, W), H, W))
    rgb_c, dep_c = crop_resize(rgb, dep, box, d.output_size)
    with torch.no_grad():
        out = grasp_maps(model, to_input(rgb_c, dep_c, d.normalise)[None], cfg.eval.flip_tta)
    maps = {k: out[k][0, 0].float().numpy() for k in MAP_KEYS}
    preds = decode_grasps(**maps, num_grasps=top_n, **cfg.eval.decode_kwargs(d.width_scale))
    scale = box[2] / d.output_size
    grasps = []
    for g in preds:
        ((x, y),) = output_to_crop(np.array([[g.x, g.y]], np.float32), box, d.output_size)
        grasps.append(
            Grasp(float(x), float(y), g.angle, g.opening * scale, g.jaw * scale, g.quality)
        )
    return grasps, shown

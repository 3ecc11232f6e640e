"""Single-view inference on a raw image, and drawing grasps.

The view is cropped exactly as validation crops it (:func:`vision_tfm.data.grasp.crop_box` at
the image centre), so the figure a run reports is the one this path gets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vision_tfm.grasp.maps import (
    MAP_KEYS,
    activate_grasp_maps,
    activate_stacked,
    decode_grasps,
)
from vision_tfm.grasp.rect import Grasp


class GraspMaps(nn.Module):
    """A grasp model whose output is its activated maps, stacked ``(B, 4, H, W)`` in
    ``MAP_KEYS`` order (:func:`split_maps` names them), rather than a dict of logits.

    What export writes: the graph ends in the activations, so a runtime without vision_tfm
    reads quality, ``cos 2θ``, ``sin 2θ`` and width straight off one output. A model with
    ``forward_maps`` hands over its stacked logits; any other grasp model's dict is stacked.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.model, "forward_maps"):
            logits = self.model.forward_maps(x)
        else:
            out = self.model(x)
            logits = torch.cat([out[k] for k in MAP_KEYS], dim=1)
        return activate_stacked(logits)  # (B, 4, H, W)


def grasp_maps(model: nn.Module, x: torch.Tensor, flips: bool = False) -> dict[str, torch.Tensor]:
    """Activated maps of ``model`` on ``x``; with ``flips``, averaged with those of the view
    flipped left-right and up-down (:func:`flip_averaged`)."""
    return flip_averaged(lambda v: activate_grasp_maps(model(v)), x, flips)


def flip_averaged(
    run: Callable[[torch.Tensor], dict[str, torch.Tensor]], x: torch.Tensor, flips: bool
) -> dict[str, torch.Tensor]:
    """``run(x)``'s activated maps; with ``flips``, the mean of those of ``x``, ``x`` flipped
    left-right and ``x`` flipped up-down, each flipped back (a mirror negates the angle, so
    ``sin 2θ``). Any runtime's maps go through it: evaluation, export and deployment agree."""
    out = dict(run(x))
    if not flips:
        return out
    for dims in ((-1,), (-2,)):
        m = run(x.flip(dims))
        for k in MAP_KEYS:
            out[k] = out[k] + (-1 if k == "sin" else 1) * m[k].flip(dims)
    return {k: v / 3 for k, v in out.items()}


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
    from vision_tfm.data.grasp import (
        crop_box,
        crop_resize,
        load_depth,
        load_rgb,
        output_to_crop,
        to_input,
    )
    from vision_tfm.train.checkpoint import load_checkpoint
    from vision_tfm.train.grasp import restore_grasp_model

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


def draw_grasps(
    image: np.ndarray, preds: list[Grasp], gt_rects: np.ndarray | None, path: str | Path
) -> None:
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

"""A grasp model's maps as a runtime sees them, the flip average, and drawing grasps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from ...constants import MAP_KEYS
from ...data.grasp import RGB_MEAN, RGB_STD
from ...grasp import Grasp, activate_grasp_maps, activate_stacked
from ...viz import pyplot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D


class GraspMaps(nn.Module):
    """A grasp model whose output is its activated maps, stacked ``(B, 4, H, W)`` in
    ``MAP_KEYS`` order (:func:`vision_tfm.grasp.split_maps` names them), rather than a dict
    of logits.

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


GT_COLOR, PRED_COLOR = "red", "lime"


def display_image(x: torch.Tensor, input_mode: str, normalise: str = "fixed") -> np.ndarray:
    """A model input ``(C, H, W)`` as a picture: the RGB with the normalisation undone, or
    the depth (or a per-view standardised input) stretched to gray."""
    if input_mode == "depth" or normalise == "image":
        v = x[:3].permute(1, 2, 0).numpy() if input_mode != "depth" else x[0, ..., None].numpy()
        v = (v - v.min()) / max(float(np.ptp(v)), 1e-6)
        return (np.broadcast_to(v, (*v.shape[:2], 3)) * 255).astype(np.uint8)
    rgb = x[:3].permute(1, 2, 0).numpy() * RGB_STD + RGB_MEAN
    return (rgb.clip(0, 1) * 255).astype(np.uint8)


def grasp_figure(image: np.ndarray, preds: list[Grasp], gt_rects: np.ndarray | None) -> Figure:
    """The overlay :func:`draw_grasps` writes, as a matplotlib figure (close it after use).

    Predicted grasps are drawn with their jaw plates thick and numbered by rank (1 = the
    highest quality; ``preds`` come best first); a legend under the image says which
    colour is the label and which the prediction, so a picture read alone is not misread.
    """
    fig, ax = pyplot().subplots(figsize=(5, 5.4))
    handles = draw_overlay(ax, image, preds, gt_rects)
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles),
        frameon=False, fontsize=9,
    )  # fmt: skip
    fig.tight_layout()
    return fig


def draw_overlay(
    ax: Axes, image: np.ndarray, preds: list[Grasp], gt_rects: np.ndarray | None
) -> list[Line2D]:
    """Draw one view with its labels and ranked predictions into ``ax`` (a figure of one,
    or a cell of a grid); returns the legend's handles."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    ax.imshow(image)
    handles = []
    if gt_rects is not None:
        for r in gt_rects:
            ax.add_patch(plt.Polygon(r, closed=True, fill=False, ec=GT_COLOR, lw=1))
        handles.append(Line2D([], [], color=GT_COLOR, lw=2, label="label"))
    for rank, g in enumerate(preds, 1):
        c = g.corners()
        ax.add_patch(plt.Polygon(c, closed=True, fill=False, ec=PRED_COLOR, lw=1.5))
        for a, b in ((1, 2), (3, 0)):  # the plates: corners 1-2 and 3-0
            ax.plot([c[a, 0], c[b, 0]], [c[a, 1], c[b, 1]], color=PRED_COLOR, lw=3)
        ax.text(
            g.x, g.y, str(rank), ha="center", va="center", fontsize=8, color="black",
            bbox={"boxstyle": "circle,pad=0.15", "fc": PRED_COLOR, "ec": "none", "alpha": 0.8},
        )  # fmt: skip
    handles.append(Line2D([], [], color=PRED_COLOR, lw=3, label="prediction (1 = best)"))
    ax.axis("off")
    return handles


def draw_grasps(
    image: np.ndarray, preds: list[Grasp], gt_rects: np.ndarray | None, path: str | Path
) -> None:
    """Write :func:`grasp_figure`'s overlay: predictions in green, ranked, labels in red."""
    fig = grasp_figure(image, preds, gt_rects)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)

"""Grasp overlays: a legend says which colour is which, and predictions carry their rank."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import to_rgb
from PIL import Image

from vision_tfm.grasp import Grasp
from vision_tfm.tasks.grasp import draw_grasps
from vision_tfm.tasks.grasp.inference import GT_COLOR, PRED_COLOR, grasp_figure


def _pixels(fig) -> np.ndarray:
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)  # (H, W, 3), top row first


def _has_colour(region: np.ndarray, colour: str, tol: int = 40) -> bool:
    want = np.array(to_rgb(colour)) * 255
    return bool((np.abs(region - want).max(-1) < tol).any())


def _crop(px: np.ndarray, bbox) -> np.ndarray:
    """Pixels inside a display-space bbox (origin bottom left) of the canvas."""
    h = px.shape[0]
    return px[int(h - bbox.y1) : int(np.ceil(h - bbox.y0)), int(bbox.x0) : int(np.ceil(bbox.x1))]


def test_overlay_has_legend_and_ranks(tmp_path):
    white = np.full((96, 96, 3), 255, np.uint8)
    preds = [Grasp(30, 30, 0.0, 30, 10, 0.9), Grasp(66, 66, 0.5, 24, 8, 0.4)]
    gt = np.array([[[20, 70], [40, 70], [40, 80], [20, 80]]], dtype=float)
    fig = grasp_figure(white, preds, gt)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["label", "prediction (1 = best)"]
    assert [t.get_text() for t in ax.texts] == ["1", "2"]  # best first
    px = _pixels(fig)
    renderer = fig.canvas.get_renderer()
    key = _crop(px, legend.get_window_extent(renderer))
    assert _has_colour(key, GT_COLOR) and _has_colour(key, PRED_COLOR)  # the two swatches
    image_box = ax.get_window_extent(renderer)
    assert legend.get_window_extent(renderer).y1 <= image_box.y0 + 1  # under, not over, it
    for t in ax.texts:  # a dark digit on a lime disc, where the image is plain white
        spot = _crop(px, t.get_window_extent(renderer))
        assert (spot.max(-1) < 100).any() and _has_colour(spot, PRED_COLOR, tol=90)
    fig.clf()

    plain = grasp_figure(white, preds[:1], None)  # `vtfm grasp`: no label to show
    assert [t.get_text() for t in plain.axes[0].get_legend().get_texts()] == [
        "prediction (1 = best)"
    ]
    out = tmp_path / "g.png"
    draw_grasps(white, preds, gt, out)
    saved = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert saved.shape == px.shape and np.abs(saved - px).mean() < 1  # the figure tested

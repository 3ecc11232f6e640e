"""Grasp rectangles <-> dense maps (quality, cos 2θ, sin 2θ, width), GG-CNN style.

``WIDTH_SCALE`` is the one normaliser of the width map, used by both :func:`encode_grasp_maps`
and :func:`decode_grasps` (GR-ConvNet's helpers encoded with 112 and decoded with 150).
The angle is encoded as ``cos 2θ, sin 2θ`` because a grasp is symmetric under a half turn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from vision_tfm.constants import MAP_KEYS
from vision_tfm.grasp.rect import Grasp, grasp_axes, wrap_angle

from ..errors import ConfigError, InputError

WIDTH_SCALE: float = 150.0
"""Pixels of opening that map to width 1.0 (at the 224-pixel model input)."""


MAP_ACTIVATIONS: dict[str, str] = {
    "quality": "sigmoid",
    "cos": "tanh",
    "sin": "tanh",
    "width": "sigmoid",
}
"""What turns each logit map of a grasp model into its map (a torch tensor method name)."""


def activate_grasp_maps(logits: Mapping[str, Any]) -> dict[str, Any]:
    """A grasp model's logit maps -> ``quality`` probability, ``cos``/``sin`` of 2θ in
    [-1, 1] and ``width`` in [0, 1] (torch tensors); training, evaluation and decoding use it."""
    return {k: getattr(logits[k], MAP_ACTIVATIONS[k])() for k in MAP_KEYS}


def activate_stacked(logits: torch.Tensor) -> torch.Tensor:
    """:func:`activate_grasp_maps` on the maps stacked ``(B, 4, H, W)`` in ``MAP_KEYS`` order,
    as one elementwise chain: ``tanh(x) = 2 sigmoid(2x) - 1``, so every channel is one
    sigmoid and an exported graph ends without splitting the maps (equal up to rounding)."""
    k = [2.0 if MAP_ACTIVATIONS[key] == "tanh" else 1.0 for key in MAP_KEYS]
    k = logits.new_tensor(k).view(1, len(MAP_KEYS), 1, 1)
    return torch.sigmoid(logits * k) * k - (k - 1)


def split_maps(maps: torch.Tensor) -> dict[str, torch.Tensor]:
    """Stacked ``(B, 4, H, W)`` maps -> ``{key: (B, 1, H, W)}`` in ``MAP_KEYS`` order."""
    return {k: maps[:, i : i + 1] for i, k in enumerate(MAP_KEYS)}


def as_grasps(rects: np.ndarray | Sequence[Grasp]) -> list[Grasp]:
    """Accept ``(K, 4, 2)`` corners or grasps and return a list of :class:`Grasp`."""
    if isinstance(rects, np.ndarray):
        return [Grasp.from_corners(c) for c in rects.reshape(-1, 4, 2)]
    return list(rects)


def encode_grasp_maps(
    rects: np.ndarray | Sequence[Grasp],
    shape: tuple[int, int],
    *,
    width_scale: float = WIDTH_SCALE,
) -> dict[str, np.ndarray]:
    """Rasterise ground-truth rectangles into the four training maps.

    For every rectangle we fill the pixels whose centres lie in the rectangle with the same
    centre and angle, the middle third of the opening and the full jaw width (plus the
    pixel nearest the centre, so tiny rectangles still leave a mark). Filled pixels get quality 1,
    ``cos 2θ``, ``sin 2θ`` and ``opening / width_scale`` (not clipped); later rectangles overwrite
    earlier ones where they overlap, as in GG-CNN. Everything else is 0.

    Args:
        rects: ``(K, 4, 2)`` corners (opening along corner 0 -> 1) or a sequence of grasps.
        shape: ``(H, W)`` of the maps.
        width_scale: Opening in pixels that maps to width 1.0.

    Returns:
        Dict with keys ``quality, cos, sin, width``, each float32 ``(H, W)``.
    """
    H, W = shape
    maps = {k: np.zeros((H, W), dtype=np.float32) for k in MAP_KEYS}
    for g in as_grasps(rects):
        half_len = g.opening * (1 / 3) / 2  # the middle third counts as graspable
        half_jaw = g.jaw / 2
        u, v = grasp_axes(np.asarray(g.angle))
        ext = np.abs(u) * half_len + np.abs(v) * half_jaw  # half extent of the filled box
        x0, x1 = max(0, math.floor(g.x - ext[0])), min(W - 1, math.ceil(g.x + ext[0]))
        y0, y1 = max(0, math.floor(g.y - ext[1])), min(H - 1, math.ceil(g.y + ext[1]))
        if x0 > x1 or y0 > y1:
            continue  # entirely outside the image (e.g. after an augmentation)
        yy, xx = np.mgrid[y0 : y1 + 1, x0 : x1 + 1]
        dx, dy = xx - g.x, yy - g.y
        eps = 1e-6
        inside = (np.abs(dx * u[0] + dy * u[1]) <= half_len + eps) & (
            np.abs(dx * v[0] + dy * v[1]) <= half_jaw + eps
        )
        cx, cy = round(g.x), round(g.y)
        if x0 <= cx <= x1 and y0 <= cy <= y1:
            inside[cy - y0, cx - x0] = True
        values = (1.0, math.cos(2 * g.angle), math.sin(2 * g.angle), g.opening / width_scale)
        for key, value in zip(MAP_KEYS, values):
            maps[key][y0 : y1 + 1, x0 : x1 + 1][inside] = value
    return maps


def _to_map(x: Any) -> np.ndarray:
    """Turn a numpy array or torch tensor of shape ``(H, W)`` / ``(1, H, W)`` into float32 2-D."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    x = np.asarray(x, dtype=np.float32)
    while x.ndim > 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 2:
        raise InputError(f"expected a (H, W) or (1, H, W) map, got shape {x.shape}")
    return x


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur with a kernel of about ±3 sigma; identity when sigma is 0."""
    return cv2.GaussianBlur(x, (0, 0), sigma) if sigma > 0 else x


def _local_peaks(
    q: np.ndarray, min_distance: int, threshold: float, num: int
) -> list[tuple[int, int]]:
    """Up to ``num`` local maxima, best first, pairwise further apart than ``min_distance``.

    A pixel is a candidate when it equals the max over its ``(2d+1)^2`` window (grey dilation,
    like skimage's ``peak_local_max``). Touching candidates form a plateau of one value, which
    stands for one peak at its middle (the candidate nearest its centroid), not at its first
    pixel in raster order. Peaks are then thinned greedily by Chebyshev distance, best first.
    """
    size = 2 * min_distance + 1
    window_max = cv2.dilate(q, np.ones((size, size), np.uint8))
    mask = ((q >= window_max) & (q >= threshold)).astype(np.uint8)
    rows, cols = np.nonzero(mask)
    if min_distance > 0:  # at 0 every pixel is a candidate and touching ones may differ
        n, labels = cv2.connectedComponents(mask, connectivity=8)
        lab = labels[rows, cols]
        count = np.maximum(np.bincount(lab, minlength=n), 1)
        cy, cx = np.bincount(lab, rows, n) / count, np.bincount(lab, cols, n) / count
        by_label = np.lexsort(((rows - cy[lab]) ** 2 + (cols - cx[lab]) ** 2, lab))
        first = by_label[np.r_[True, lab[by_label][1:] != lab[by_label][:-1]]] if len(lab) else []
        rows, cols = rows[first], cols[first]
    order = np.argsort(-q[rows, cols], kind="stable")
    peaks: list[tuple[int, int]] = []
    for r, c in zip(rows[order], cols[order]):
        if all(max(abs(r - pr), abs(c - pc)) > min_distance for pr, pc in peaks):
            peaks.append((int(r), int(c)))
            if len(peaks) == num:
                break
    return peaks


def decode_grasps(
    quality: Any,
    cos: Any,
    sin: Any,
    width: Any,
    *,
    num_grasps: int = 1,
    min_distance: int = 10,
    threshold: float = 0.2,
    quality_sigma: float = 2.0,
    angle_sigma: float = 2.0,
    width_sigma: float = 1.0,
    width_scale: float = WIDTH_SCALE,
    jaw: float | None = None,
) -> list[Grasp]:
    """Turn predicted maps into the best ``num_grasps`` grasps, best first.

    The maps are smoothed (cos and sin separately, never the angle itself, which wraps), local
    quality peaks at least ``min_distance`` pixels apart and ``>= threshold`` are kept, and each
    peak reads ``angle = 0.5 * atan2(sin, cos)`` and ``opening = width * width_scale``.

    Args:
        quality, cos, sin, width: ``(H, W)`` or ``(1, H, W)`` maps (numpy or torch) of the
            quality, ``cos 2θ``, ``sin 2θ`` and ``opening / width_scale``.
        num_grasps: How many grasps to return at most.
        min_distance: Minimum Chebyshev distance between peaks, in map pixels.
        threshold: Minimum smoothed quality of a peak; fewer grasps come back below it.
        quality_sigma, angle_sigma, width_sigma: Gaussian sigma for the quality, the cos and
            sin, and the width maps (0 disables smoothing).
        width_scale: Must equal the value used to encode (:data:`WIDTH_SCALE`).
        jaw: Fixed jaw width in pixels; None: half the opening, as GG-CNN and ``model.json``.

    Returns:
        List of :class:`Grasp` in map-pixel coordinates with the smoothed quality.
    """
    if min_distance < 0 or num_grasps < 1:
        raise ConfigError(
            "decode needs min_distance >= 0 and num_grasps >= 1, "
            f"got {min_distance} and {num_grasps}"
        )
    q = _blur(_to_map(quality), quality_sigma)
    c = _blur(_to_map(cos), angle_sigma)
    s = _blur(_to_map(sin), angle_sigma)
    w = _blur(_to_map(width), width_sigma)
    grasps = []
    for r, col in _local_peaks(q, min_distance, threshold, num_grasps):
        angle = float(wrap_angle(0.5 * math.atan2(s[r, col], c[r, col])))
        opening = float(w[r, col]) * width_scale
        jaw_px = jaw if jaw is not None else opening * 0.5
        grasps.append(Grasp(float(col), float(r), angle, opening, jaw_px, float(q[r, col])))
    return grasps

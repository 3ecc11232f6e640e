"""The rectangle metric used on Cornell and Jacquard (Jiang et al. 2011; GG-CNN; GR-ConvNet).

A predicted grasp is correct when, for at least one ground-truth rectangle, the angles differ by
at most 30 degrees (modulo pi, since a grasp is symmetric under a half turn) and the rectangles'
IoU is above 0.25. Top-n counts a view as correct when any of its n best grasps is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vision_tfm.grasp.maps import MAP_KEYS, as_grasps, decode_grasps
from vision_tfm.grasp.rect import Grasp

ANGLE_THRESHOLD: float = math.radians(30.0)
IOU_THRESHOLD: float = 0.25


def angle_difference(a: float, b: float) -> float:
    """Smallest difference between two grasp angles modulo pi, in ``[0, pi/2]`` radians."""
    d = abs(a - b) % math.pi
    return min(d, math.pi - d)


def grasp_matches(
    pred: Grasp,
    gt: Grasp,
    *,
    angle_threshold: float = ANGLE_THRESHOLD,
    iou_threshold: float = IOU_THRESHOLD,
) -> bool:
    """Whether one prediction matches one ground truth (angle <= 30 deg and IoU > 0.25)."""
    return angle_difference(pred.angle, gt.angle) <= angle_threshold and (
        pred.iou(gt) > iou_threshold
    )


def grasp_correct(
    preds: Sequence[Grasp],
    gt_rects: np.ndarray | Sequence[Grasp],
    *,
    top_n: int = 1,
    angle_threshold: float = ANGLE_THRESHOLD,
    iou_threshold: float = IOU_THRESHOLD,
) -> bool:
    """Whether any of the first ``top_n`` predictions matches any ground-truth rectangle.

    Args:
        preds: Predicted grasps, best first (as :func:`decode_grasps` returns them).
        gt_rects: ``(K, 4, 2)`` ground-truth corners or grasps, same pixel frame as ``preds``.
        top_n: 1 for the usual top-1 accuracy.
        angle_threshold: Largest allowed angle difference in radians.
        iou_threshold: IoU must exceed this.

    Returns:
        False when there are no predictions.
    """
    gts = as_grasps(gt_rects)
    return any(
        grasp_matches(p, g, angle_threshold=angle_threshold, iou_threshold=iou_threshold)
        for p in preds[:top_n]
        for g in gts
    )


def batch_grasp_correct(
    maps: Mapping[str, Any],
    gt_rects: Sequence[np.ndarray],
    *,
    top_n: int = 1,
    angle_threshold: float = ANGLE_THRESHOLD,
    iou_threshold: float = IOU_THRESHOLD,
    **decode_kwargs: Any,
) -> list[bool]:
    """Decode a batch of predicted maps and score each view with the rectangle metric.

    Args:
        maps: ``quality, cos, sin, width`` maps, each ``(B, 1, H, W)`` or ``(B, H, W)``
            (numpy or torch; e.g. the model's output dict).
        gt_rects: One ``(K, 4, 2)`` corner array per view, in the maps' pixel frame
            (the third element of a :func:`vision_tfm.data.grasp.grasp_collate` batch).
        top_n, angle_threshold, iou_threshold: As :func:`grasp_correct` takes them.
        **decode_kwargs: Passed to :func:`decode_grasps` (e.g. ``width_scale``, ``min_distance``).

    Returns:
        One bool per view.
    """
    thresholds = {"angle_threshold": angle_threshold, "iou_threshold": iou_threshold}
    results = []
    for i, gt in enumerate(gt_rects):
        preds = decode_grasps(*(maps[k][i] for k in MAP_KEYS), num_grasps=top_n, **decode_kwargs)
        results.append(grasp_correct(preds, gt, top_n=top_n, **thresholds))
    return results

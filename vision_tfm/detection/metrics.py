"""Detection metric: VOC-style average precision at one IoU threshold (mAP@0.5 by default).

Small and dependency-free (no pycocotools / torchmetrics). Per class, detections from all images
are ranked by score; each is a true positive when the ground truth it overlaps most (same image,
same class) has IoU >= the threshold and is not already taken by a higher-scored detection;
otherwise it is a false positive (the VOC devkit's matching). AP is the area under the
precision envelope over all recall points (VOC 2010+, no 11-point sampling). There are no
"difficult" flags: every ground-truth box counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torchvision.ops import box_iou

from ..errors import InputError

__all__ = ["mean_average_precision", "voc_ap"]


def voc_ap(recall: torch.Tensor, precision: torch.Tensor) -> float:
    """Area under the precision envelope (max precision at any higher recall).

    Args:
        recall: Non-decreasing recall after each ranked detection.
        precision: Precision after each ranked detection.
    """
    r = torch.cat([torch.zeros(1), recall.double(), torch.ones(1)])
    p = torch.cat([torch.zeros(1), precision.double(), torch.zeros(1)])
    p = p.flip(0).cummax(0).values.flip(0)  # envelope: best precision at recall >= r
    step = torch.nonzero(r[1:] != r[:-1]).squeeze(1)  # where recall moves
    return float(((r[step + 1] - r[step]) * p[step + 1]).sum())


def mean_average_precision(
    preds: Sequence[Mapping[str, torch.Tensor]],
    targets: Sequence[Mapping[str, torch.Tensor]],
    iou_threshold: float = 0.5,
) -> tuple[float, dict[int, float]]:
    """mAP over the classes present in ``targets``, and AP per class.

    Args:
        preds: Per image ``{"boxes": (N, 4) xyxy, "scores": (N,), "labels": (N,)}`` (what
            torchvision detectors return in eval mode).
        targets: Per image ``{"boxes": (M, 4) xyxy, "labels": (M,)}``.
        iou_threshold: Minimum IoU for a match.

    Returns:
        ``(mAP, {class: AP})``; a class with predictions but no ground truth is not scored.
    """
    if len(preds) != len(targets):
        raise InputError(f"{len(preds)} predictions for {len(targets)} images")
    classes = sorted({int(c) for t in targets for c in t["labels"].tolist()})
    ap = {c: _class_ap(preds, targets, c, iou_threshold) for c in classes}
    return (sum(ap.values()) / len(ap) if ap else 0.0), ap


def _class_ap(
    preds: Sequence[Mapping[str, torch.Tensor]],
    targets: Sequence[Mapping[str, torch.Tensor]],
    cls: int,
    iou_threshold: float,
) -> float:
    gts = [t["boxes"][t["labels"] == cls].float().cpu() for t in targets]
    taken = [torch.zeros(len(g), dtype=torch.bool) for g in gts]
    dets = [  # (score, image, box) for every detection of this class
        (float(s), i, b)
        for i, p in enumerate(preds)
        for s, b in zip(p["scores"][p["labels"] == cls], p["boxes"][p["labels"] == cls])
    ]
    dets.sort(key=lambda d: -d[0])  # stable: ties keep image order
    tp = torch.zeros(len(dets))
    for k, (_, i, box) in enumerate(dets):
        if not len(gts[i]):
            continue
        iou = box_iou(box.float().cpu()[None], gts[i])[0]  # (M,)
        j = int(iou.argmax())
        if iou[j] >= iou_threshold and not taken[i][j]:
            taken[i][j] = True
            tp[k] = 1.0
    n_gt = sum(len(g) for g in gts)
    hits = tp.cumsum(0)
    return voc_ap(hits / n_gt, hits / torch.arange(1, len(dets) + 1))

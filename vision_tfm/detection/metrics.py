"""COCO detection metrics, computed by torchmetrics' ``MeanAveragePrecision`` on pycocotools.

The figures people compare detectors by are COCO's: AP averaged over IoU 0.50:0.05:0.95
(``map``), AP at IoU 0.5 (``map50``) and 0.75, each the mean over classes with ground truth
of the 101-point interpolated precision envelope. pycocotools is the reference that computes
them, so this module only adapts torchvision's detector outputs to it. Install with
``pip install 'vision_tfm[detection]'``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import DependencyError, InputError

__all__ = ["CocoScores", "coco_map"]


@dataclass
class CocoScores:
    """COCO bbox AP of one evaluation.

    Attributes:
        map: AP over IoU thresholds 0.50:0.05:0.95 (COCO's primary figure).
        map50: AP at IoU 0.5 (PASCAL VOC's threshold).
        map75: AP at IoU 0.75.
        per_class: AP over the same IoU thresholds as ``map``, per label with ground truth.
    """

    map: float
    map50: float
    map75: float
    per_class: dict[int, float] = field(default_factory=dict)


def coco_map(
    preds: Sequence[Mapping[str, torch.Tensor]],
    targets: Sequence[Mapping[str, torch.Tensor]],
    rec_thresholds: Sequence[float] | None = None,
) -> CocoScores:
    """COCO AP of per-image detections against per-image ground truth.

    Args:
        preds: Per image ``{"boxes": (N, 4) xyxy, "scores": (N,), "labels": (N,)}`` (what
            torchvision detectors return in eval mode; at most 100 per image are scored).
        targets: Per image ``{"boxes": (M, 4) xyxy, "labels": (M,)}``.
        rec_thresholds: Recall points the precision envelope is sampled at; ``None``:
            COCO's 101 (0, 0.01, ..., 1). A fine grid approaches the envelope's exact area,
            which is PASCAL VOC's AP (2010 on).

    Raises:
        DependencyError: torchmetrics or pycocotools is not installed.
        InputError: ``preds`` and ``targets`` cover different numbers of images.
    """
    if len(preds) != len(targets):
        raise InputError(f"{len(preds)} predictions for {len(targets)} images")
    try:
        from torchmetrics.detection import MeanAveragePrecision

        metric = MeanAveragePrecision(
            box_format="xyxy",
            iou_type="bbox",
            rec_thresholds=list(rec_thresholds) if rec_thresholds is not None else None,
            class_metrics=True,
            backend="pycocotools",
        )
    except ImportError as e:
        raise DependencyError(
            f"COCO mAP needs torchmetrics and pycocotools ({e}); "
            "pip install 'vision_tfm[detection]'"
        ) from None
    cpu = [
        [{k: v.detach().cpu() for k, v in d.items()} for d in group] for group in (preds, targets)
    ]
    metric.update(*cpu)
    out = metric.compute()
    with_gt = {int(c) for t in cpu[1] for c in t["labels"].tolist()}
    classes = out["classes"].reshape(-1).tolist()
    per_class = out["map_per_class"].reshape(-1).tolist()
    return CocoScores(
        map=_score(out["map"]),
        map50=_score(out["map_50"]),
        map75=_score(out["map_75"]),
        per_class={int(c): max(ap, 0.0) for c, ap in zip(classes, per_class) if c in with_gt},
    )


def _score(value: torch.Tensor) -> float:
    """pycocotools' -1 ("nothing to score": no ground truth at all) as 0, like a miss."""
    return max(float(value), 0.0)

"""COCO mAP through torchmetrics / pycocotools: hand-computed values, and parity at IoU 0.5
with the VOC-style AP this package computed by hand before (kept here as the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import raises_naming
from torchvision.ops import box_iou

from vision_tfm.detection import coco_map
from vision_tfm.errors import InputError

FINE = np.linspace(0, 1, 10001).tolist()  # recall points: the envelope's area to 1e-4


# --- the reference: VOC AP (2010 on), the area under the precision envelope --------------


def voc_ap(recall: torch.Tensor, precision: torch.Tensor) -> float:
    r = torch.cat([torch.zeros(1), recall.double(), torch.ones(1)])
    p = torch.cat([torch.zeros(1), precision.double(), torch.zeros(1)])
    p = p.flip(0).cummax(0).values.flip(0)  # envelope: best precision at recall >= r
    step = torch.nonzero(r[1:] != r[:-1]).squeeze(1)  # where recall moves
    return float(((r[step + 1] - r[step]) * p[step + 1]).sum())


def voc_map(preds, targets, iou_threshold: float = 0.5) -> tuple[float, dict[int, float]]:
    """Each ranked detection is a true positive when the ground truth it overlaps most (same
    image and class) reaches the threshold and is not yet taken (the VOC devkit's rule)."""
    classes = sorted({int(c) for t in targets for c in t["labels"].tolist()})
    ap = {}
    for cls in classes:
        gts = [t["boxes"][t["labels"] == cls].float() for t in targets]
        taken = [torch.zeros(len(g), dtype=torch.bool) for g in gts]
        dets = [
            (float(s), i, b)
            for i, p in enumerate(preds)
            for s, b in zip(p["scores"][p["labels"] == cls], p["boxes"][p["labels"] == cls])
        ]
        dets.sort(key=lambda d: -d[0])  # stable: ties keep image order
        tp = torch.zeros(len(dets))
        for k, (_, i, box) in enumerate(dets):
            if len(gts[i]):
                iou = box_iou(box.float()[None], gts[i])[0]
                j = int(iou.argmax())
                if iou[j] >= iou_threshold and not taken[i][j]:
                    taken[i][j], tp[k] = True, 1.0
        hits = tp.cumsum(0)
        n_gt = sum(len(g) for g in gts)
        ap[cls] = voc_ap(hits / n_gt, hits / torch.arange(1, len(dets) + 1))
    return (sum(ap.values()) / len(ap) if ap else 0.0), ap


def _det(boxes, scores, labels=None):
    boxes = torch.tensor(boxes, dtype=torch.float).reshape(-1, 4)
    labels = torch.ones(len(boxes), dtype=torch.long) if labels is None else torch.tensor(labels)
    return {"boxes": boxes, "scores": torch.tensor(scores, dtype=torch.float), "labels": labels}


# ranked TP, FP (duplicate), FP (miss), TP (IoU .9025), TP (IoU 2/3) over 3 ground truths:
# precision 1 .5 1/3 .5 .6 at recall 1/3 1/3 1/3 2/3 1; envelope 1 up to recall 1/3, then .6
HAND_GT = [_det([[0, 0, 10, 10]], []), _det([[20, 20, 40, 40], [50, 50, 60, 60]], [])]
HAND_PREDS = [
    _det([[0, 0, 10, 10], [0, 0, 10, 10], [30, 30, 35, 35]], [0.9, 0.8, 0.7]),
    _det([[21, 21, 40, 40], [50, 50, 60, 65]], [0.6, 0.5]),
]


def test_reference_is_the_area_under_the_envelope():
    ap = voc_ap(torch.tensor([0.5, 0.5, 1.0]), torch.tensor([1.0, 0.5, 2 / 3]))
    assert ap == pytest.approx(0.5 * 1.0 + 0.5 * 2 / 3)
    assert voc_map(HAND_PREDS, HAND_GT)[0] == pytest.approx(1 / 3 + (2 / 3) * (3 / 5))


def test_coco_map50_hand_computed():
    # COCO samples the envelope at recall 0, .01, ..., 1: 34 points (0 to .33) at
    # precision 1, the other 67 at .6
    assert coco_map(HAND_PREDS, HAND_GT).map50 == pytest.approx((34 + 67 * 0.6) / 101)
    fine = coco_map(HAND_PREDS, HAND_GT, rec_thresholds=FINE).map50  # the exact area
    assert fine == pytest.approx(voc_map(HAND_PREDS, HAND_GT)[0], abs=1e-4)


def test_coco_per_class_and_iou_range():
    gt = [_det([[0, 0, 10, 10], [20, 20, 30, 30]], [], labels=[1, 2])]
    half = _det([[0, 0, 10, 5], [20, 20, 30, 30], [0, 0, 9, 9]], [0.9, 0.8, 0.1], labels=[1, 2, 3])
    s = coco_map([half], gt)
    assert s.map50 == pytest.approx(1.0)  # class 1's box has IoU .5 exactly: a hit at .5
    # AP over IoU .5:.95: class 1 hits at .5 only (1 of 10), class 2 at every threshold;
    # class 3 has no ground truth, so it is not scored
    assert s.per_class == pytest.approx({1: 0.1, 2: 1.0})
    assert s.map == pytest.approx(0.55) and s.map75 == pytest.approx(0.5)
    assert coco_map([_det([], [])], gt).map == 0.0
    with raises_naming(InputError, 1, 2):
        coco_map([half], gt * 2)


def _scenes(seed: int, n_images: int = 40):
    """Ground truth of 3 classes, never overlapping, and a detector's output around it: boxes
    jittered to a spread of IoUs, missed objects, duplicates and false alarms."""
    rng = np.random.default_rng(seed)
    preds, targets = [], []
    for _ in range(n_images):
        k = int(rng.integers(1, 4))
        cells = rng.permutation(4)[:k]  # one object per quadrant of a 200x200 image
        xy = np.stack([cells % 2 * 100, cells // 2 * 100], 1) + rng.uniform(5, 30, (k, 2))
        wh = rng.uniform(30, 60, (k, 2))
        gt = np.concatenate([xy, xy + wh], 1)
        labels = rng.integers(1, 4, k)
        boxes, scores, plabels = [], [], []
        for box, label in zip(gt, labels):
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):  # missed, found, duplicated
                jitter = rng.normal(0, 0.15, 4) * np.r_[box[2:] - box[:2], box[2:] - box[:2]]
                boxes.append(box + jitter)
                scores.append(rng.uniform(0.3, 1.0))
                plabels.append(label if rng.random() > 0.1 else rng.integers(1, 4))
        for _ in range(int(rng.integers(0, 3))):  # false alarms anywhere
            x, y = rng.uniform(0, 150, 2)
            boxes.append(np.array([x, y, x + 40, y + 40]))
            scores.append(rng.uniform(0.0, 0.7))
            plabels.append(rng.integers(1, 4))
        targets.append({"boxes": torch.tensor(gt).float(), "labels": torch.tensor(labels)})
        preds.append(_det(np.reshape(boxes, (-1, 4)).tolist(), scores, np.int64(plabels)))
    return preds, targets


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coco_map50_matches_the_reference(seed):
    """The library's matching and envelope are the reference's: on the exact area they agree
    to 1e-3; COCO's 101-point sampling moves mAP@0.5 by less than one sample step."""
    preds, targets = _scenes(seed)
    ref = voc_map(preds, targets)[0]
    assert 0.3 < ref < 0.95  # a detector neither hopeless nor perfect
    assert coco_map(preds, targets, rec_thresholds=FINE).map50 == pytest.approx(ref, abs=1e-3)
    assert coco_map(preds, targets).map50 == pytest.approx(ref, abs=1 / 101)

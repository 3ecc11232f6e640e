"""examples/finetune_detector.py: the detection set it builds from the embedded digits, and
its evaluation wired to COCO mAP (the full run: docs/results/detection.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.ops import box_iou

pytestmark = pytest.mark.usefixtures("one_thread")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "finetune_detector.py"


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("finetune_detector", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_digit_scenes_are_fixed_tight_and_apart(ex):
    val = ex.digit_scenes("val", 12)
    again = ex.digit_scenes("val", 12)
    assert all(torch.equal(a, b) for a, b in zip(val.images, again.images))
    assert all(torch.equal(a, b) for a, b in zip(val.boxes, again.boxes))
    train = ex.digit_scenes("train", 12)  # other digits: no held-out one is trained on
    assert not any(torch.equal(a, b) for a, b in zip(train.images, val.images))
    for img, boxes, labels in zip(val.images, val.boxes, val.labels):
        assert img.shape == (3, ex.CANVAS, ex.CANVAS) and img.dtype == torch.uint8
        assert 1 <= len(boxes) == len(labels) <= 3 and set(labels.tolist()) <= {1, 2, 3}
        ink, covered = img[0] > 64, torch.zeros(ex.CANVAS, ex.CANVAS, dtype=torch.bool)
        for x0, y0, x1, y1 in boxes.long().tolist():
            assert ink[y0:y1, x0].any() and ink[y0:y1, x1 - 1].any()  # tight left and right
            assert ink[y0, x0:x1].any() and ink[y1 - 1, x0:x1].any()  # and top and bottom
            covered[y0:y1, x0:x1] = True
        assert not (ink & ~covered).any()  # every digit is boxed
        assert box_iou(boxes, boxes).fill_diagonal_(0).max() == 0  # and none overlap
    img, target = val[0]
    assert img.dtype == torch.float32 and img.max() <= 1
    assert torch.equal(target["boxes"], val.boxes[0])


def test_evaluation_reports_coco_map_per_class(ex):
    cfg = ex.DetConfig(
        model=ex.ModelConfig(name="vit_small_patch16_224", kwargs=ex.SMALL["vit"]),
        det=ex.DetSection(min_size=64, max_size=64, batch_size=2),
    )
    data = ex.digit_scenes("val", 2)
    task = ex.DetectionTask(cfg, data, data, ["0", "1", "2"])
    torch.manual_seed(0)
    model = task.build(pretrained=False)[0].eval()
    loader = DataLoader(data, batch_size=2, collate_fn=task.collate)
    with torch.no_grad():
        metrics = task.evaluate(model, loader, torch.device("cpu"))
    assert list(metrics) == ["map", "map50", "ap_0", "ap_1", "ap_2"]
    assert all(0.0 <= v <= 1.0 for v in metrics.values())
    assert task.summary(metrics).startswith("val COCO mAP@[.5:.95]: ")

"""Object detection with ViT / Swin backbones on torchvision's detectors, and COCO mAP."""

from .backbone import DetectionBackbone, SwinFeatures, ViTFeatures, create_backbone
from .build import DETECTORS, build_detector
from .metrics import CocoScores, coco_map

__all__ = [
    "DETECTORS",
    "CocoScores",
    "DetectionBackbone",
    "SwinFeatures",
    "ViTFeatures",
    "build_detector",
    "coco_map",
    "create_backbone",
]

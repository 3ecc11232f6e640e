"""Object detection with ViT / Swin backbones on torchvision's detectors, and a mAP metric."""

from .backbone import DetectionBackbone, SwinFeatures, ViTFeatures, create_backbone
from .build import DETECTORS, build_detector
from .metrics import box_iou, mean_average_precision, voc_ap

__all__ = [
    "DETECTORS",
    "DetectionBackbone",
    "SwinFeatures",
    "ViTFeatures",
    "box_iou",
    "build_detector",
    "create_backbone",
    "mean_average_precision",
    "voc_ap",
]

"""Object detection with ViT / Swin backbones on torchvision's detectors, and a mAP metric."""

from .backbone import DetectionBackbone, create_backbone
from .build import DETECTORS, build_detector
from .metrics import mean_average_precision, voc_ap

__all__ = [
    "DETECTORS",
    "DetectionBackbone",
    "build_detector",
    "create_backbone",
    "mean_average_precision",
    "voc_ap",
]

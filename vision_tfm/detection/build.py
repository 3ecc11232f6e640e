"""Detectors from torchvision around our backbones: heads, anchors and transforms are theirs.

Anchors follow torchvision's ResNet-FPN defaults, scaled by stride so they stay right for any
level selection: Faster R-CNN one size of ``8 * stride`` per level, RetinaNet three octave scales
from ``4 * stride``; aspect ratios 0.5, 1, 2. With the default levels (Faster R-CNN: strides 4-32
plus ``pool``; RetinaNet: 8-32 plus P6, P7) these are torchvision's sizes 32-512.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from ..errors import ConfigError
from ..models.hub import Weights
from .backbone import create_backbone

__all__ = ["DETECTORS", "build_detector"]

DETECTORS = {"fasterrcnn": (0, 1, 2, 3), "retinanet": (1, 2, 3)}  # kind -> default levels


def build_detector(
    kind: str,
    backbone_name: str,
    num_classes: int,
    *,
    out_indices: Sequence[int] | None = None,
    pretrained: Weights = None,
    frozen_stages: int = 0,
    img_size: int | None = None,
    out_channels: int = 256,
    min_size: int = 800,
    max_size: int = 1333,
    backbone_kw: Mapping[str, Any] | None = None,
    **detector_kw: Any,
) -> nn.Module:
    """Build a torchvision ``FasterRCNN`` or ``RetinaNet`` on a ViT / Swin backbone with FPN.

    Args:
        kind: ``"fasterrcnn"`` or ``"retinanet"``.
        backbone_name: A registered ViT or Swin name.
        num_classes: Including background (labels are 1..num_classes-1), as torchvision counts;
            so at least 2.
        out_indices: Backbone levels; default strides 4-32 (Faster R-CNN) or 8-32 (RetinaNet).
        pretrained, frozen_stages, img_size, out_channels: As ``create_backbone`` takes them.
        min_size: Shorter image side after torchvision's resize transform.
        max_size: Cap on the longer side after resizing.
        backbone_kw: Extra ``create_backbone`` keywords, including model overrides
            (e.g. ``{"embed_dim": 16, "depth": 4}`` for a tiny test model).
        **detector_kw: Passed to the torchvision detector (score thresholds, image mean, ...).
    """
    if kind not in DETECTORS:
        raise ConfigError(f"unknown detector {kind!r}; expected one of {sorted(DETECTORS)}")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise ConfigError(
            f"num_classes counts the background (torchvision convention), so it must be an "
            f"integer >= 2 (background + at least one object class), got {num_classes!r}"
        )
    # torchvision is slow to import: only pay for it when a detector is built
    from torchvision.models.detection import FasterRCNN, RetinaNet
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    backbone = create_backbone(
        backbone_name,
        DETECTORS[kind] if out_indices is None else out_indices,
        fpn=True,
        pretrained=pretrained,
        frozen_stages=frozen_stages,
        img_size=img_size,
        out_channels=out_channels,
        extra_block="maxpool" if kind == "fasterrcnn" else "p6p7",
        **(backbone_kw or {}),
    )
    ratios = ((0.5, 1.0, 2.0),) * len(backbone.strides)
    common = dict(min_size=min_size, max_size=max_size, **detector_kw)
    if kind == "fasterrcnn":
        anchors = AnchorGenerator(tuple((8 * s,) for s in backbone.strides), ratios)
        # RoIs pool from the backbone levels only, not from the RPN-only ``pool`` level
        roi_pool = MultiScaleRoIAlign(backbone.names[: backbone.num_levels], 7, sampling_ratio=2)
        return FasterRCNN(
            backbone, num_classes, rpn_anchor_generator=anchors, box_roi_pool=roi_pool, **common
        )
    octaves = (1.0, 2 ** (1 / 3), 2 ** (2 / 3))
    sizes = tuple(tuple(int(4 * s * o) for o in octaves) for s in backbone.strides)
    return RetinaNet(
        backbone, num_classes, anchor_generator=AnchorGenerator(sizes, ratios), **common
    )

"""Detection backbones: a ViT or Swin classifier as a multi-scale feature extractor.

``create_backbone`` returns a :class:`DetectionBackbone` whose forward maps images ``(B, 3, H, W)``
to an ``OrderedDict`` of NCHW maps named ``"0"``, ``"1"``, ... (torchvision's convention), with
``out_channels`` and ``strides`` declared, so torchvision's ``FasterRCNN`` / ``RetinaNet`` take it
as it is. Every map at stride ``s`` is ``ceil(H / s) x ceil(W / s)``, for any input size.

* Swin: the stage outputs of ``forward_intermediates``, unchanged (an optional per-level
  LayerNorm2d is off by default so they equal the classifier's intermediates). ``fpn=True`` adds
  torchvision's ``FeaturePyramidNetwork``.
* ViT: the simple feature pyramid of ViTDet (Li et al. 2022) built from the last block's map at
  stride ``p`` (the patch size, any power of two): up-sampling by 2x transposed convs (channels
  halved each time, LayerNorm2d + GELU between), identity, or down-sampling by 2x2 max-pool; then
  1x1 conv + LayerNorm2d + 3x3 conv + LayerNorm2d to ``out_channels`` (256 as in ViTDet). The
  paper found a top-down FPN adds nothing on top of this, so ``fpn=True`` only appends the
  detector's extra level; the widths are already equal.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..layers import LayerNorm2d
from ..models import create_model, load_pretrained
from ..models.registry import get_model_entry
from ..models.swin import SwinTransformer
from ..models.vit import VisionTransformer

__all__ = ["EXTRA_BLOCKS", "DetectionBackbone", "SwinFeatures", "ViTFeatures", "create_backbone"]

VIT_STRIDES = (4, 8, 16, 32)  # ViTDet's pyramid levels; Swin's come from its stages
EXTRA_BLOCKS = {"maxpool": ["pool"], "p6p7": ["p6", "p7"], "none": []}  # extra level names


def _ceil_crop(x: torch.Tensor, size: tuple[int, int], stride: int) -> torch.Tensor:
    """Crop a map to ``ceil(size / stride)``: rows past that only saw the patch padding."""
    return x[..., : -(-size[0] // stride), : -(-size[1] // stride)]


class SwinFeatures(nn.Module):
    """Swin stage maps, equal to the classifier's ``forward_intermediates`` unless ``out_norm``."""

    def __init__(
        self, model: SwinTransformer, out_indices: Sequence[int], out_norm: bool = False
    ) -> None:
        super().__init__()
        model.reset_classifier(0)
        model.norm = nn.Identity()  # the classifier's final norm: no output uses it
        model.layers = model.layers[: out_indices[-1] + 1]  # later stages would get no gradient
        self.model = model
        self.out_indices = list(out_indices)
        self.channels = [model.feature_info[i]["num_chs"] for i in out_indices]
        self.strides = [model.feature_info[i]["reduction"] for i in out_indices]
        # detection codebases often norm each output; off by default for classifier parity
        self.norms = nn.ModuleList(
            LayerNorm2d(c, eps=1e-5) if out_norm else nn.Identity() for c in self.channels
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = self.model.forward_intermediates(x, self.out_indices)  # [(B, C_i, H/s_i, W/s_i)]
        return [norm(m) for norm, m in zip(self.norms, maps)]

    def frozen_parts(self, k: int) -> list[nn.Module | nn.Parameter]:
        """The patch embedding and the first ``k`` stages (nothing for ``k = 0``)."""
        return [self.model.patch_embed, *self.model.layers[:k]] if k else []


def _rescale(dim: int, log2_scale: int) -> tuple[nn.Sequential, int]:
    """ViTDet's resampling: ``2**log2_scale`` up by transposed convs, or down by max-pools."""
    layers: list[nn.Module] = []
    for i in range(log2_scale):
        if i:
            layers += [LayerNorm2d(dim), nn.GELU()]
        layers.append(nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2))
        dim //= 2
    # ceil_mode keeps the last row/column of an odd grid, so the map stays ceil(H / stride)
    layers += [nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True) for _ in range(-log2_scale)]
    return nn.Sequential(*layers), dim


class ViTFeatures(nn.Module):
    """ViTDet's simple feature pyramid over a plain ViT's last block (strides 4, 8, 16, 32)."""

    def __init__(
        self, model: VisionTransformer, out_indices: Sequence[int], out_channels: int = 256
    ) -> None:
        super().__init__()
        p = model.patch_size
        if p & (p - 1):
            raise ValueError(f"ViT detection backbone needs a power-of-two patch size, got {p}")
        model.reset_classifier(0)
        model.norm = model.fc_norm = nn.Identity()  # ViTDet reads blocks without the final norm
        self.model = model
        self.out_indices = list(out_indices)
        self.strides = [VIT_STRIDES[i] for i in out_indices]
        self.channels = [out_channels] * len(out_indices)
        self.levels = nn.ModuleList()
        for s in self.strides:
            # both powers of two: log2(p / s) up-sampling steps (negative: pooling steps)
            rescale, dim = _rescale(model.embed_dim, p.bit_length() - s.bit_length())
            self.levels.append(
                nn.Sequential(
                    rescale,
                    nn.Conv2d(dim, out_channels, kernel_size=1, bias=False),
                    LayerNorm2d(out_channels),
                    nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False),
                    LayerNorm2d(out_channels),
                )
            )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        size = (x.shape[-2], x.shape[-1])
        (y,) = self.model.forward_intermediates(x, [-1])  # (B, D, H/p, W/p)
        return [_ceil_crop(lvl(y), size, s) for lvl, s in zip(self.levels, self.strides)]

    def frozen_parts(self, k: int) -> list[nn.Module | nn.Parameter]:
        """Patch embed, pos embed, class token and the first ``k * depth // 4`` blocks."""
        if not k:
            return []
        m = self.model
        loose = [t for t in (m.pos_embed, m.cls_token) if t is not None]
        return [m.patch_embed, *loose, *m.blocks[: k * len(m.blocks) // len(VIT_STRIDES)]]


class _ExtraLevels(nn.Module):
    """Only the extra block of an FPN, for inputs that already share one width (ViTDet)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, feats: OrderedDict[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
        maps, names = self.block(list(feats.values()), list(feats.values()), list(feats))
        return OrderedDict(zip(names, maps))


class DetectionBackbone(nn.Module):
    """Features (Swin or ViT) plus an optional neck, with what torchvision detectors read.

    Attributes:
        out_channels: An int with ``fpn=True`` (torchvision detectors need one width), else a
            list per level.
        names: Keys of the output dict, in order (body levels, then ``pool`` / ``p6``, ``p7``).
        strides: Stride of each output, aligned with ``names``.
        num_levels: How many outputs come from the body (the rest are extra levels).
    """

    def __init__(
        self,
        body: SwinFeatures | ViTFeatures,
        fpn: bool = False,
        out_channels: int = 256,
        extra_block: str = "maxpool",
        frozen_stages: int = 0,
    ) -> None:
        super().__init__()
        self.body = body
        self.num_levels = len(body.channels)
        self.names = [str(i) for i in range(self.num_levels)]
        self.strides = list(body.strides)
        self.neck: nn.Module | None = None
        self.out_channels: int | list[int] = list(body.channels)
        if fpn:
            self.neck = _make_neck(body, out_channels, extra_block)
            self.out_channels = out_channels
            extra = EXTRA_BLOCKS[extra_block]
            self.names += extra
            self.strides += [self.strides[-1] * 2 ** (i + 1) for i in range(len(extra))]
        self._frozen: list[nn.Module] = []
        for part in body.frozen_parts(frozen_stages):
            part.requires_grad_(False)
            if isinstance(part, nn.Module):
                self._frozen.append(part)
        self.train()

    def train(self, mode: bool = True) -> DetectionBackbone:
        """Keep frozen parts in eval mode (no dropout, drop-path or norm updates) when training."""
        super().train(mode)
        for m in self._frozen:
            m.eval()
        return self

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        feats = OrderedDict(zip(self.names, self.body(x)))  # {name: (B, C, H/s, W/s)}
        return self.neck(feats) if self.neck is not None else feats


def _make_neck(body: SwinFeatures | ViTFeatures, out_channels: int, extra_block: str) -> nn.Module:
    # torchvision costs ~1 s to import: only pay for it when a neck is built
    from torchvision.ops.feature_pyramid_network import (
        FeaturePyramidNetwork,
        LastLevelMaxPool,
        LastLevelP6P7,
    )

    extra = None
    if extra_block == "maxpool":
        extra = LastLevelMaxPool()
    elif extra_block == "p6p7":
        extra = LastLevelP6P7(body.channels[-1], out_channels)  # P6 from C5 when C5 is wider
    if isinstance(body, ViTFeatures):  # already one width: no top-down pathway (ViTDet)
        return _ExtraLevels(extra) if extra is not None else nn.Identity()
    return FeaturePyramidNetwork(body.channels, out_channels, extra_blocks=extra)


def _check_args(
    name: str, out_indices: Sequence[int], frozen_stages: int, extra_block: str, n: int
) -> list[int]:
    idx = list(out_indices)
    if not idx or any(not isinstance(i, int) or not 0 <= i < n for i in idx):
        raise ValueError(
            f"{name}: out_indices {tuple(idx)} out of range: each must be in 0..{n - 1}"
        )
    if idx != sorted(set(idx)):
        raise ValueError(f"{name}: out_indices {tuple(idx)} must be increasing without repeats")
    if not 0 <= frozen_stages <= n:
        raise ValueError(f"{name}: frozen_stages must be in 0..{n}, got {frozen_stages}")
    if extra_block not in EXTRA_BLOCKS:
        raise ValueError(f"extra_block must be one of {sorted(EXTRA_BLOCKS)}, got {extra_block!r}")
    return idx


def create_backbone(
    name: str,
    out_indices: Sequence[int] = (0, 1, 2, 3),
    fpn: bool = False,
    pretrained: str | os.PathLike | Mapping | None = None,
    frozen_stages: int = 0,
    img_size: int | None = None,
    *,
    out_channels: int = 256,
    extra_block: str = "maxpool",
    out_norm: bool = False,
    **model_kw: Any,
) -> DetectionBackbone:
    """Build a registered ViT or Swin as a backbone for torchvision detectors.

    Args:
        name: A registered ViT or Swin name (``vt.list_models()``).
        out_indices: Levels to output: Swin stages, or ViT pyramid levels (strides 4, 8, 16, 32).
        fpn: Add a neck so all levels share ``out_channels`` (an int, as detectors need).
        pretrained: A timm / torchvision / official classification checkpoint or state dict.
        frozen_stages: Freeze the patch embedding and the first k stages (ViT: k quarters of
            the blocks, plus position embedding and class token); 0 freezes nothing.
        img_size: ViT: the grid the position table is kept at (pretrained ones are resampled).
        out_channels: Width of the ViT pyramid and of the FPN.
        extra_block: With ``fpn``: ``"maxpool"`` (Faster R-CNN's ``pool``), ``"p6p7"``
            (RetinaNet) or ``"none"``.
        out_norm: Swin only: a LayerNorm2d on each output, as detection codebases often add.
        **model_kw: Overrides of the model config (``embed_dim``, ``depths``, ...).
    """
    entry = get_model_entry(name)  # unknown name: one-line ValueError with the closest names
    if issubclass(entry.cls, SwinTransformer):
        n = len(model_kw.get("depths", entry.cfg.depths))
    elif issubclass(entry.cls, VisionTransformer):
        n = len(VIT_STRIDES)
        if out_norm:
            raise ValueError(
                f"{name}: out_norm is for Swin; the ViT pyramid already ends in a norm"
            )
    else:
        raise ValueError(f"{name}: no detection backbone for {entry.cls.__name__} (ViT or Swin)")
    out_indices = _check_args(name, out_indices, frozen_stages, extra_block, n)
    if img_size is not None:
        model_kw["img_size"] = img_size
    model = create_model(name, **model_kw)
    if pretrained is not None:
        with warnings.catch_warnings():  # the head is dropped below, whatever its class count
            warnings.filterwarnings("ignore", message="classifier head left at init")
            load_pretrained(model, pretrained)
    if isinstance(model, SwinTransformer):
        body: SwinFeatures | ViTFeatures = SwinFeatures(model, out_indices, out_norm)
    else:
        body = ViTFeatures(model, out_indices, out_channels)
    return DetectionBackbone(body, fpn, out_channels, extra_block, frozen_stages)

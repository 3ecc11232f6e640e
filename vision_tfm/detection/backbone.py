"""Detection backbones: a ViT or Swin classifier as a multi-scale feature extractor.

``create_backbone`` returns a :class:`DetectionBackbone` whose forward maps images ``(B, 3, H, W)``
to an ``OrderedDict`` of NCHW maps named ``"0"``, ``"1"``, ... (torchvision's convention), with
``out_channels`` and ``strides`` declared, so torchvision's ``FasterRCNN`` / ``RetinaNet`` take it
as it is. Every map at stride ``s`` is ``ceil(H / s) x ceil(W / s)``, for any input size.

Both bodies are timm's ``FeatureGetterNet`` (what ``create_model(features_only=True)`` returns),
pruned to the levels used; the family's ``backbone_kind`` picks one: ``"stages"`` (Swin's stage
maps, :class:`SwinFeatures`; ``fpn=True`` adds torchvision's ``FeaturePyramidNetwork``) or
``"simple_pyramid"`` (ViTDet's pyramid from a plain ViT's last map, :class:`ViTFeatures`; ViTDet
found a top-down FPN adds nothing there, so ``fpn=True`` only appends the extra level).
"""

from __future__ import annotations

import re
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from timm.models._features import FeatureGetterNet
from torch import nn

from ..errors import ConfigError
from ..layers import LayerNorm2d
from ..models import create_model
from ..models.hub import Weights, load_weights, weights_source
from ..models.registry import get_model_entry

__all__ = ["EXTRA_BLOCKS", "DetectionBackbone", "SwinFeatures", "ViTFeatures", "create_backbone"]

VIT_STRIDES = (4, 8, 16, 32)  # ViTDet's pyramid levels; Swin's come from its stages
EXTRA_BLOCKS = {"maxpool": ["pool"], "p6p7": ["p6", "p7"], "none": []}  # extra level names
BODIES = ("stages", "simple_pyramid")  # the ``backbone_kind`` values a family may declare


def _ceil_crop(x: torch.Tensor, size: tuple[int, int], stride: int) -> torch.Tensor:
    """Crop a map to ``ceil(size / stride)``: rows past that only saw the patch padding."""
    return x[..., : -(-size[0] // stride), : -(-size[1] // stride)]


class SwinFeatures(FeatureGetterNet):
    """Stage maps of a hierarchical model, equal to its ``forward_intermediates`` unless
    ``out_norm``. Serves every family whose ``backbone_kind`` is ``"stages"``."""

    def __init__(
        self, model: nn.Module, out_indices: Sequence[int], out_norm: bool = False
    ) -> None:
        super().__init__(model, out_indices, output_fmt="NCHW")  # prunes later stages, head
        self.channels = self.feature_info.channels()
        self.strides = self.feature_info.reduction()
        # detection codebases often norm each output; off by default for classifier parity
        self.norms = nn.ModuleList(
            LayerNorm2d(c, eps=1e-5) if out_norm else nn.Identity() for c in self.channels
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = super().forward(x)  # [(B, C_i, H/s_i, W/s_i)]
        return [norm(m) for norm, m in zip(self.norms, maps)]

    def frozen_parts(self, k: int) -> list[nn.Module | nn.Parameter]:
        """The stem and the first ``k`` stages (nothing for ``k = 0``), as the model's coarse
        ``group_matcher`` names them (timm's stage groups)."""
        if not k:
            return []
        groups = self.model.group_matcher(coarse=True)
        stem, stages = re.compile(groups["stem"]), re.compile(groups["blocks"])
        names: dict[str, None] = {}
        for n, _ in self.model.named_parameters():
            hit = stem.match(n) or stages.match(n)
            if hit and (hit.re is stem or int(hit.group(1)) < k):
                names[hit.group(0)] = None
        return [_part(self.model, n) for n in names]


def _part(model: nn.Module, name: str) -> nn.Module | nn.Parameter:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return model.get_parameter(name)


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


class ViTFeatures(FeatureGetterNet):
    """ViTDet's simple feature pyramid (Li et al. 2022) over a plain ViT's last block map at
    stride ``p`` (any power of two), to strides 4, 8, 16, 32: each level resamples it
    (:func:`_rescale`), then 1x1 conv + LayerNorm2d + 3x3 conv + LayerNorm2d to ``out_channels``.
    """

    def __init__(
        self, model: nn.Module, out_indices: Sequence[int], out_channels: int = 256
    ) -> None:
        p = model.patch_size
        if p & (p - 1):
            raise ConfigError(f"ViT detection backbone needs a power-of-two patch size, got {p}")
        # the last block, without the final norm (ViTDet) or head: pruned as features_only does
        super().__init__(model, [-1], output_fmt="NCHW")
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
        (y,) = super().forward(x)  # (B, D, H/p, W/p)
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
    # torchvision is slow to import: only pay for it when a neck is built
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
        raise ConfigError(
            f"{name}: out_indices {tuple(idx)} out of range: each must be in 0..{n - 1}"
        )
    if idx != sorted(set(idx)):
        raise ConfigError(f"{name}: out_indices {tuple(idx)} must be increasing without repeats")
    if not 0 <= frozen_stages <= n:
        raise ConfigError(f"{name}: frozen_stages must be in 0..{n}, got {frozen_stages}")
    if extra_block not in EXTRA_BLOCKS:
        raise ConfigError(f"extra_block must be one of {sorted(EXTRA_BLOCKS)}, got {extra_block!r}")
    return idx


def create_backbone(
    name: str,
    out_indices: Sequence[int] = (0, 1, 2, 3),
    fpn: bool = False,
    pretrained: Weights = None,
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
        pretrained: True or a tag (timm's published weights), or a timm / torchvision /
            official classification checkpoint (path or state dict): ``weights_source``.
        frozen_stages: Freeze the patch embedding and the first k stages (ViT: k quarters of
            the blocks, plus position embedding and class token); 0 freezes nothing.
        img_size: ViT: the grid the position table is kept at (pretrained ones are resampled).
        out_channels: Width of the ViT pyramid and of the FPN.
        extra_block: With ``fpn``: ``"maxpool"`` (Faster R-CNN's ``pool``), ``"p6p7"``
            (RetinaNet) or ``"none"``.
        out_norm: Swin only: a LayerNorm2d on each output, as detection codebases often add.
        **model_kw: Overrides of the model config (``embed_dim``, ``depths``, ...).
    """
    entry = get_model_entry(name)  # unknown name: one-line ConfigError with the closest names
    kind = getattr(entry.cls, "backbone_kind", None)  # declared by the family's class
    if kind not in BODIES:
        raise ConfigError(f"{name}: no detection backbone for {entry.cls.__name__} (ViT or Swin)")
    if kind == "simple_pyramid" and out_norm:
        raise ConfigError(f"{name}: out_norm is for Swin; the ViT pyramid already ends in a norm")
    if img_size is not None:
        model_kw["img_size"] = img_size
    model = create_model(name, **model_kw)
    n = len(VIT_STRIDES) if kind == "simple_pyramid" else len(model.feature_info)
    out_indices = _check_args(name, out_indices, frozen_stages, extra_block, n)
    published, checkpoint_path = weights_source(pretrained)
    if published or checkpoint_path is not None:
        with warnings.catch_warnings():  # the head is dropped below, whatever its class count
            warnings.filterwarnings("ignore", message="classifier head left at init")
            load_weights(model, published, checkpoint_path)
    if kind == "stages":
        body: SwinFeatures | ViTFeatures = SwinFeatures(model, out_indices, out_norm)
    else:
        body = ViTFeatures(model, out_indices, out_channels)
    return DetectionBackbone(body, fpn, out_channels, extra_block, frozen_stages)

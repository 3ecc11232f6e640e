"""The hybrid's convolutional pieces: the stem's blocks and the decoder's upsampling stage.

BatchNorm rather than LayerNorm throughout, because it folds into the conv for inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNormAct(nn.Module):
    """Conv -> BatchNorm -> GELU; BN rather than LayerNorm because it folds into the conv.

    Not torchvision's ``Conv2dNormActivation``: its numbered keys would rename the ``conv`` /
    ``bn`` weights of every trained grasp checkpoint."""

    def __init__(self, in_chs: int, out_chs: int, kernel_size: int = 3, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_chs, out_chs, kernel_size, stride, padding=kernel_size // 2, bias=False
        )
        self.bn = nn.BatchNorm2d(out_chs)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class DwResBlock(nn.Module):
    """``x + pw2(act(pw1(bn(dw3x3(x)))))``: ConvNeXt's block shape with a 3x3 kernel and BN.

    The depthwise conv mixes space at a cost linear in width; the pointwise pair mixes channels.
    """

    def __init__(self, dim: int, expand: float = 2.0) -> None:
        super().__init__()
        hidden = int(dim * expand)
        self.conv_dw = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.bn = nn.BatchNorm2d(dim)
        self.pw1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.pw2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pw2(self.act(self.pw1(self.bn(self.conv_dw(x)))))

    def extra_repr(self) -> str:
        return f"dim={self.conv_dw.in_channels}, hidden={self.pw1.out_channels}"


def conv_stage(in_chs: int, out_chs: int, stride: int, depth: int) -> nn.Sequential:
    """One resolution level: a (strided) 3x3 conv, then ``depth`` depthwise-residual blocks."""
    return nn.Sequential(
        ConvNormAct(in_chs, out_chs, 3, stride), *(DwResBlock(out_chs) for _ in range(depth))
    )


class UpStage(nn.Module):
    """Narrow with a 1x1 conv, upsample x2 (bilinear), add the stem skip, refine.

    Narrowing first keeps the upsampling and the high-resolution work cheap.
    """

    def __init__(self, in_chs: int, out_chs: int, depth: int) -> None:
        super().__init__()
        self.reduce = ConvNormAct(in_chs, out_chs, kernel_size=1)
        self.blocks = nn.Sequential(*(DwResBlock(out_chs) for _ in range(depth)))

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(self.reduce(x), skip.shape[-2:], mode="bilinear", align_corners=False)
        return self.blocks(x + skip)  # (B, C_skip, H_skip, W_skip)

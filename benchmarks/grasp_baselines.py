"""GR-ConvNet (Kumra et al., IROS 2020) trained by our engine on our folds: the side-by-side
baseline for the grasp hybrids.

python benchmarks/grasp_baselines.py --config configs/grasp/grasp_hybrid_t.yaml \\
    --model grconvnet --data ../shared/data/cornell --folds 5

Everything after the registration is ``train_grasp.py``: same recipe (pass the hybrid's YAML),
same folds (``data.split``, ``run.seed``), same deployment-crop metric, same ``cv.json``.
The model is registered here only, never in the package: it is a reference, not a product.

Architecture, as published (``GenerativeResnet``): a 9x9 conv, two stride-2 4x4 convs
(32, 64, 128 channels), five residual blocks at 128 channels and 1/4 resolution, two stride-2
4x4 transposed convs and a 9x9 transposed conv back to full resolution, then four 2x2 conv
heads (quality, cos 2θ, sin 2θ, width); ~1.9 M parameters for RGB-D. Its heads are linear,
so here they are logits and our activations and loss apply, as for the hybrid.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vision_tfm.grasp import MAP_KEYS  # noqa: E402
from vision_tfm.models import register_model  # noqa: E402


@dataclass(frozen=True)
class GRConvNetConfig:
    """GR-ConvNet's hyper-parameters (the published defaults)."""

    img_size: int = 224
    in_chans: int = 4
    channel_size: int = 32
    num_res_blocks: int = 5
    dropout: float = 0.0


def conv_bn_relu(conv: nn.Module, chs: int) -> nn.Sequential:
    return nn.Sequential(conv, nn.BatchNorm2d(chs), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    """``x + bn(conv(relu(bn(conv(x)))))``, GR-ConvNet's block (no activation after the sum)."""

    def __init__(self, chs: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(chs, chs, 3, padding=1), nn.BatchNorm2d(chs)
        self.conv2, self.bn2 = nn.Conv2d(chs, chs, 3, padding=1), nn.BatchNorm2d(chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))


class GRConvNet(nn.Module):
    """GR-ConvNet's generative residual network; returns our four logit maps."""

    task = "grasp"  # trained by train_grasp.py's task

    def __init__(self, cfg: GRConvNetConfig) -> None:
        super().__init__()
        c = cfg.channel_size
        self.in_chans = cfg.in_chans
        self.down = nn.Sequential(
            conv_bn_relu(nn.Conv2d(cfg.in_chans, c, 9, padding=4), c),  # (B, 32, H, W)
            conv_bn_relu(nn.Conv2d(c, 2 * c, 4, stride=2, padding=1), 2 * c),  # H/2
            conv_bn_relu(nn.Conv2d(2 * c, 4 * c, 4, stride=2, padding=1), 4 * c),  # H/4
        )
        self.res = nn.Sequential(*(ResidualBlock(4 * c) for _ in range(cfg.num_res_blocks)))
        self.up = nn.Sequential(
            conv_bn_relu(nn.ConvTranspose2d(4 * c, 2 * c, 4, 2, 1, output_padding=1), 2 * c),
            conv_bn_relu(nn.ConvTranspose2d(2 * c, c, 4, 2, 2, output_padding=1), c),
            nn.ConvTranspose2d(c, c, 9, padding=4),  # (B, 32, H + 1, W + 1)
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.heads = nn.ModuleDict({k: nn.Conv2d(c, 1, 2) for k in MAP_KEYS})  # -> (H, W)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.up(self.res(self.down(x)))
        return {k: head(self.drop(x)) for k, head in self.heads.items()}  # 4 x (B, 1, H, W)


register_model("grconvnet", GRConvNet, GRConvNetConfig())

if __name__ == "__main__":
    from train_grasp import main
    from vision_tfm.train.launch import run_cli

    run_cli(main)

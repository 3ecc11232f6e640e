"""Normalisation layers shared by every family.

Token models normalise the last dim (``B, N, C`` or ``B, H, W, C``); conv stems and
feature pyramids need the same statistics over channels of an NCHW map, hence
``LayerNorm2d``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError


class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dim; eps is explicit because ViT (1e-6) and Swin (1e-5) differ."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=affine)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channel dim of an NCHW map, without a permute round trip."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=affine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)  # (B, H, W, C)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)  # (B, C, H, W)


class RMSNorm(nn.RMSNorm):
    """RMSNorm (no mean subtraction, no bias); cheaper, used for q/k norm and LLaMA-style blocks."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True) -> None:
        super().__init__(dim, eps=eps, elementwise_affine=affine)


_NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "layernorm2d": LayerNorm2d}


def get_norm_layer(name: str) -> type[nn.Module]:
    """Resolve a norm by config name so configs stay plain strings."""
    try:
        return _NORMS[name.lower()]
    except KeyError:
        why = f"unknown norm layer {name!r}; expected one of {sorted(_NORMS)}"
        raise ConfigError(why) from None

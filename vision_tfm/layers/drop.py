"""Regularisers applied on residual branches: stochastic depth and per-channel scaling."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropPath", "LayerScale", "drop_path"]


def drop_path(x: torch.Tensor, p: float = 0.0, training: bool = False) -> torch.Tensor:
    """Zero whole samples of a residual branch (stochastic depth, Huang et al. 2016).

    Survivors are scaled by 1/(1-p) so the expected branch output is unchanged.
    """
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # one draw per sample
    mask = x.new_empty(shape).bernoulli_(keep)
    return x * mask.div_(keep)


class DropPath(nn.Module):
    """Module form of :func:`drop_path`."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class LayerScale(nn.Module):
    """Learned per-channel scale of a residual branch (CaiT); small init keeps deep nets stable."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma

    def extra_repr(self) -> str:
        return f"dim={self.gamma.numel()}"

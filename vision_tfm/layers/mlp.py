"""Feed-forward sublayers: timm's GELU MLP (same keys: fc1, act, fc2) and a gated SwiGLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import nn

from ..errors import ConfigError


class SwiGLU(nn.Module):
    """SiLU-gated linear unit (Shazeer 2020).

    Ours rather than timm's ``SwiGLUPacked``: that one counts ``hidden_features`` as the packed
    fc1 width, ours as the gated width, which is what the configs and checkpoints use.

    Gate and value share one projection (``fc1`` of width 2*hidden) so it costs one matmul.
    ``hidden_features`` is the gated width; pass 2/3 of the GELU width to keep parameters equal.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: int | None = None,
        out_features: int | None = None,
        act_layer: type[nn.Module] | None = None,
        bias: bool = True,
        drop: float = 0.0,
    ) -> None:
        super().__init__()
        del act_layer  # the gate is SiLU by definition
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, 2 * hidden_features, bias=bias)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.drop2(self.fc2(self.drop1(F.silu(gate) * value)))


_MLPS = {"mlp": Mlp, "swiglu": SwiGLU}


def get_mlp_layer(name: str) -> type[nn.Module]:
    """Resolve a feed-forward layer by config name."""
    try:
        return _MLPS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown mlp layer {name!r}; expected one of {sorted(_MLPS)}") from None

"""Helpers every model family uses: weight init and intermediate-index selection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

__all__ = ["init_weights", "select_indices"]


def block_kwargs(cfg: Any) -> dict[str, Any]:
    """The :class:`~vision_tfm.layers.Block` options every family's config spells the same way.

    One mapping, so a field such as ``attn_drop_rate`` means the same in ViT, Swin and the
    hybrid; each family adds its own (width, heads, norm layer, LayerScale, ...).
    """
    return {
        "mlp_ratio": cfg.mlp_ratio,
        "qkv_bias": cfg.qkv_bias,
        "proj_drop": cfg.proj_drop_rate,
        "attn_drop": cfg.attn_drop_rate,
        "norm_place": cfg.norm_place,
    }


def init_weights(module: nn.Module) -> None:
    """timm-style init: truncated-normal(0.02) linears with zero bias; norms at identity."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and module.weight is not None:
        nn.init.ones_(module.weight)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def select_indices(indices: int | Sequence[int] | None, n: int, what: str) -> list[int]:
    """Resolve ``None`` (all), an int (last n) or explicit (possibly negative) indices."""
    if indices is None:
        return list(range(n))
    if isinstance(indices, int):
        if not 0 < indices <= n:
            raise ValueError(f"asked for the last {indices} {what}, but the model has {n}")
        return list(range(n - indices, n))
    out = []
    for i in indices:
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise ValueError(f"{what} index {i} is out of range for a model with {n} {what}")
        out.append(j)
    return sorted(set(out))

"""Helpers every model family uses: config checks, weight init, intermediate-index selection."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from functools import partial
from typing import Any

from torch import nn

from ..config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ConfigError, Range, check_ranges
from ..errors import InputError, InputTypeError
from ..layers import ATTN_TYPES, FEATURE_MAPS, Attention

RATE = Range(0, 1, hi_open=True)  # a dropout / drop-path probability

# Ranges of the fields every family spells the same way, applied to those a config has; its
# own ``RANGES`` and ``CHOICES`` cover the rest (``check_ranges``).
BASE_RANGES: dict[str, Range] = {
    "img_size": AT_LEAST_ONE,
    "in_chans": AT_LEAST_ONE,
    "num_classes": NON_NEGATIVE,  # 0 = no head (timm convention)
    "embed_dim": AT_LEAST_ONE,
    "num_heads": AT_LEAST_ONE,
    "mlp_ratio": POSITIVE,
    "drop_rate": RATE,
    "proj_drop_rate": RATE,
    "attn_drop_rate": RATE,
    "drop_path_rate": RATE,
    "depth": AT_LEAST_ONE,
    "patch_size": AT_LEAST_ONE,
    "rope_theta": POSITIVE,
    "favor_features": NON_NEGATIVE,  # 0 = head_dim * ln(head_dim)
}

NORM_LAYERS = ("layernorm", "rmsnorm")
"""What ``norm_layer`` takes in every family: the blocks', the final and the merging norms."""

# The attention kernel fields of the families that can swap softmax for linear attention.
ATTENTION_CHOICES: dict[str, tuple[str, ...]] = {
    "attn_type": ATTN_TYPES,
    "feature_map": FEATURE_MAPS,
}


def check_model_config(cfg: Any) -> None:
    """Reject an out-of-range architecture field in one line naming it, from every family
    config's ``__post_init__``: a zero head count would otherwise fail deep inside a layer."""
    kind = type(cfg)
    names = {f.name for f in dataclasses.fields(cfg)}
    base = {k: r for k, r in BASE_RANGES.items() if k in names}
    check_ranges(cfg, {**base, **getattr(kind, "RANGES", {})})  # and its CHOICES
    heads = getattr(cfg, "num_heads", None)
    if not isinstance(heads, int):  # per-stage heads: the family checks them (Swin)
        return
    if cfg.embed_dim % heads:
        raise ConfigError(
            f"embed_dim must be divisible by num_heads ({heads}), got {cfg.embed_dim}"
        )
    pos = getattr(cfg, "pos_embed", None)
    if pos == "sincos" and cfg.embed_dim % 4:
        raise ConfigError(
            f"embed_dim must be divisible by 4 for pos_embed='sincos', got {cfg.embed_dim}"
        )
    if pos == "rope" and (cfg.embed_dim // heads) % 4:
        raise ConfigError(
            f"embed_dim must be a multiple of 4 * num_heads ({4 * heads}) for rope, "
            f"got {cfg.embed_dim}"
        )


def block_kwargs(cfg: Any) -> dict[str, Any]:
    """The :class:`~vision_tfm.layers.Block` options every family's config spells the same way.

    One mapping, so a field such as ``attn_drop_rate`` means the same in ViT, Swin and the
    hybrid; each family adds its own (width, heads, norm layer, LayerScale, ...).
    """
    kw = {
        "mlp_ratio": cfg.mlp_ratio,
        "qkv_bias": cfg.qkv_bias,
        "proj_drop": cfg.proj_drop_rate,
        "attn_drop": cfg.attn_drop_rate,
        "norm_place": cfg.norm_place,
    }
    if getattr(cfg, "attn_type", "softmax") == "linear":  # Swin's configs have no such field
        kw["attn_layer"] = partial(
            Attention,
            attn_type="linear",
            feature_map=cfg.feature_map,
            num_features=cfg.favor_features,
        )
    return kw


def init_weights(module: nn.Module) -> None:
    """timm-style init: truncated-normal(0.02) linears with zero bias (norms start at identity)."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def select_indices(indices: int | Sequence[int] | None, n: int, what: str) -> list[int]:
    """Resolve ``None`` (all), an int (last n) or explicit (possibly negative) indices."""
    if indices is None:
        return list(range(n))
    if isinstance(indices, int):
        if not 0 < indices <= n:
            raise InputError(f"asked for the last {indices} {what}, but the model has {n}")
        return list(range(n - indices, n))
    out = []
    for i in indices:
        try:
            i = operator.index(i)  # numpy integers pass
        except TypeError:
            raise InputTypeError(f"{what} indices must be integers, got {i!r}") from None
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise InputError(f"{what} index {i} is out of range for a model with {n} {what}")
        out.append(j)
    return sorted(set(out))

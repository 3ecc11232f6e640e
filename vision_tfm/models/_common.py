"""Helpers every model family uses: config checks, weight init, intermediate-index selection."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

from torch import nn

from ..layers.attention import ATTN_TYPES, FEATURE_MAPS, Attention

__all__ = ["check_config", "init_weights", "select_indices"]

# One rule per field name: the families spell shared fields the same way, so one table covers
# ViT, Swin and the hybrid. Tuples (Swin's per-stage ``depths`` / ``num_heads``, the hybrid's
# stem) apply the rule to each entry.
_MIN_INT = {
    "img_size": 1,
    "patch_size": 1,
    "in_chans": 1,
    "num_classes": 0,  # 0 = no classifier head (timm convention)
    "embed_dim": 1,
    "depth": 1,
    "depths": 1,
    "num_heads": 1,
    "window_size": 1,
    "stem_chs": 1,
    "stem_depths": 0,
    "dec_depth": 0,
    "favor_features": 0,  # 0 = d ln d per head
}
_CHOICES = {"attn_type": ATTN_TYPES, "feature_map": FEATURE_MAPS}
_POSITIVE = ("mlp_ratio", "rope_theta")
_NON_NEGATIVE = ("init_values",)
_RATES = ("drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate")


def check_config(cfg: Any, owner: str) -> None:
    """Reject out-of-range architecture fields in one line naming the model and the field.

    Every family's constructor calls this first: a negative depth or a zero head count would
    otherwise surface deep inside a layer as a ZeroDivisionError or a negative tensor size.
    """

    def fail(field: str, value: Any, expected: str) -> None:
        raise ValueError(f"{owner} config: {field} must be {expected}, got {value!r}")

    def is_int(v: Any, least: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= least

    for f in dataclasses.fields(cfg):
        name, v = f.name, getattr(cfg, f.name)
        if name in _MIN_INT:
            least = _MIN_INT[name]
            what = f"an integer >= {least}" + (" (0 = no head)" if name == "num_classes" else "")
            if isinstance(v, tuple):
                if not v or not all(is_int(x, least) for x in v):
                    fail(name, v, f"a non-empty list of integers >= {least}")
            elif not is_int(v, least):
                fail(name, v, what)
        elif name in _POSITIVE and not (isinstance(v, (int, float)) and v > 0):
            fail(name, v, "a number > 0")
        elif name in _NON_NEGATIVE and not (isinstance(v, (int, float)) and v >= 0):
            fail(name, v, "a number >= 0")
        elif name in _RATES and not (isinstance(v, (int, float)) and 0 <= v < 1):
            fail(name, v, "a rate in [0, 1)")
        elif name in _CHOICES and v not in _CHOICES[name]:
            fail(name, v, f"one of {', '.join(_CHOICES[name])}")
    heads = cfg.num_heads
    if isinstance(heads, tuple):  # Swin: stage i is embed_dim * 2**i wide
        if len(cfg.depths) != len(heads):
            fail("num_heads", heads, f"one entry per stage (depths {cfg.depths})")
        for i, h in enumerate(heads):
            if (cfg.embed_dim * 2**i) % h:
                fail(f"num_heads[{i}]", h, f"a divisor of stage {i}'s width {cfg.embed_dim * 2**i}")
        return
    if cfg.embed_dim % heads:
        fail("embed_dim", cfg.embed_dim, f"divisible by num_heads ({heads})")
    pos = getattr(cfg, "pos_embed", None)
    if pos == "sincos" and cfg.embed_dim % 4:
        fail("embed_dim", cfg.embed_dim, "divisible by 4 for pos_embed='sincos'")
    if pos == "rope" and (cfg.embed_dim // heads) % 4:
        fail("embed_dim", cfg.embed_dim, f"a multiple of 4 * num_heads ({4 * heads}) for rope")


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

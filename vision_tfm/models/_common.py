"""Helpers every model family uses: config checks, weight init, intermediate-index selection."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from functools import partial
from typing import Any

from torch import nn

from ..config import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    Range,
    check_memory,
    check_ranges,
)
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
    check_block_count(cfg)
    check_model_memory(cfg)
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


def param_floor(cfg: Any) -> dict[str, float]:
    """A lower bound on a config's parameter count, by the keys that set each part, from
    arithmetic alone: the blocks' attention and MLP weights, FAVOR+ projections, a learned
    position table and the head. Stem convolutions, norms and biases are left out, so the
    bound stays under the real count (hierarchical stages, Swin's, double their width)."""
    get = partial(getattr, cfg)
    D = get("embed_dim", 0)
    depth = get("depth", None)
    stages = [depth] if isinstance(depth, int) else list(get("depths", ()) or ())
    blocks = sum(stages)
    heads = get("num_heads", 1)
    head_dim = D // heads if isinstance(heads, int) and heads > 0 else D
    width2 = sum(n * float(D * 2**i) ** 2 for i, n in enumerate(stages))  # stages widen x2
    parts = {"depth, embed_dim": (4 + 2 * get("mlp_ratio", 4.0)) * width2}
    if get("attn_type", "") == "linear" and get("feature_map", "") == "favor":
        parts["favor_features"] = float(blocks) * get("favor_features", 0) * head_dim
    if get("pos_embed", "") == "learn" and get("patch_size", 0):
        parts["img_size"] = float(get("img_size", 0) // get("patch_size")) ** 2 * D
    parts["num_classes"] = float(get("num_classes", 0)) * D
    return parts


MAX_BLOCKS = 1024
"""More blocks than any published vision model has by an order of magnitude (ViT-22B: 48).
Modules are built one by one, even on the meta device, so a config asking for ``10**6``
narrow blocks would take hours to refuse by memory alone."""


def check_block_count(cfg: Any) -> None:
    """Refuse a config with more than :data:`MAX_BLOCKS` blocks, naming the key."""
    for key in ("depth", "depths", "stem_depths"):
        value = getattr(cfg, key, None)
        total = value if isinstance(value, int) else sum(value or ())
        if total > MAX_BLOCKS:
            raise ConfigError(
                f"{key} asks for {total} blocks in all; at most {MAX_BLOCKS} are built "
                "(the deepest published vision models have under 100)"
            )


def check_model_memory(cfg: Any) -> None:
    """Refuse a config whose parameters alone (float32, :func:`param_floor`) exceed the
    machine's memory, before a single block is built: ``depth=10**6`` would otherwise build
    blocks one by one, even on the meta device, until memory ran out."""
    parts = param_floor(cfg)
    key = max(parts, key=parts.__getitem__)
    n = sum(parts.values())
    check_memory(4 * n, key, f"a model of at least {n:.3g} parameters")


def check_input_memory(
    model: nn.Module, batch: int, hw: tuple[int, int], key: str, training: bool = False
) -> None:
    """Refuse a batch and input size whose activations cannot fit the machine's memory, in
    one line naming ``key``, before any tensor is made: the input itself, and one
    ``embed_dim``-wide map per token (per block, and ``4 + 2 * mlp_ratio`` of them, when
    ``training`` keeps them for the backward pass). A floor: attention maps, stems and
    temporaries come on top, so nothing this refuses could have run."""
    cfg = getattr(model, "cfg", None)
    H, W = hw
    pixels = float(batch) * H * W
    need = pixels * getattr(model, "in_chans", 3)
    info = getattr(model, "feature_info", None) or [{"reduction": 1}]
    patch = max(int(level.get("reduction", 1)) for level in info)  # fewest tokens: a floor
    if cfg is not None:
        parts = param_floor(cfg)
        D = getattr(cfg, "embed_dim", 0)
        depth = getattr(cfg, "depth", None)
        blocks = depth if isinstance(depth, int) else sum(getattr(cfg, "depths", ()) or ())
        per_token = float(D) * (
            (4 + 2 * getattr(cfg, "mlp_ratio", 4.0)) * blocks if training else 1
        )
        need += pixels / patch**2 * per_token
        need += sum(parts.values()) * (4 if training else 1)  # weights (+ grads, Adam moments)
    check_memory(4 * need, key, f"a batch of {batch} at {H}x{W}")


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

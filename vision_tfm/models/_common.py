"""Helpers every model family uses: config checks, weight init, intermediate-index selection."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from torch import nn

from ..layers.attention import ATTN_TYPES, FEATURE_MAPS, Attention

__all__ = [
    "ATTENTION_RULES",
    "AT_LEAST_0",
    "AT_LEAST_1",
    "BASE_RULES",
    "NON_NEGATIVE",
    "POSITIVE",
    "RATE",
    "Rule",
    "check_config",
    "init_weights",
    "select_indices",
]


Rule = tuple[Callable[[Any], bool], str, str]  # check, what one value must be, plural


def _int_rule(least: int, note: str = "") -> Rule:
    return (lambda v: _is_int(v, least)), f"an integer >= {least}{note}", f"integers >= {least}"


def _is_int(v: Any, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


POSITIVE: Rule = (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0", "numbers > 0")
NON_NEGATIVE: Rule = (
    lambda v: isinstance(v, (int, float)) and v >= 0,
    "a number >= 0",
    "numbers >= 0",
)
RATE: Rule = (
    lambda v: isinstance(v, (int, float)) and 0 <= v < 1,
    "a rate in [0, 1)",
    "rates in [0, 1)",
)
AT_LEAST_0, AT_LEAST_1 = _int_rule(0), _int_rule(1)


def _choice_rule(choices: Sequence[str]) -> Rule:
    what = f"one of {', '.join(choices)}"
    return (lambda v: v in choices), what, what

# Rules for the fields every family spells the same way. A family declares its own table as
# ``VisionModel.config_rules`` = these plus its own fields, so a new field needs no edit here.
# Tuples (Swin's per-stage ``depths`` / ``num_heads``, the hybrid's stem) apply the rule to
# each entry.
BASE_RULES: dict[str, Rule] = {
    "img_size": AT_LEAST_1,
    "in_chans": AT_LEAST_1,
    "num_classes": _int_rule(0, " (0 = no head)"),  # timm convention
    "embed_dim": AT_LEAST_1,
    "num_heads": AT_LEAST_1,
    "mlp_ratio": POSITIVE,
    "drop_rate": RATE,
    "proj_drop_rate": RATE,
    "attn_drop_rate": RATE,
    "drop_path_rate": RATE,
}

# The attention kernel fields of the families that can swap softmax for linear attention.
ATTENTION_RULES: dict[str, Rule] = {
    "attn_type": _choice_rule(ATTN_TYPES),
    "feature_map": _choice_rule(FEATURE_MAPS),
    "favor_features": _int_rule(0, " (0 = d ln d per head)"),
}


def check_config(cfg: Any, owner: str, rules: Mapping[str, Rule] = BASE_RULES) -> None:
    """Reject out-of-range architecture fields in one line naming the model and the field.

    Every family's constructor calls this first with its ``config_rules``: a negative depth
    or a zero head count would otherwise surface deep inside a layer as a ZeroDivisionError
    or a negative tensor size.
    """

    def fail(field: str, value: Any, expected: str) -> None:
        raise ValueError(f"{owner} config: {field} must be {expected}, got {value!r}")

    for f in dataclasses.fields(cfg):
        name, v = f.name, getattr(cfg, f.name)
        if name not in rules:
            continue
        ok, what, plural = rules[name]
        if isinstance(v, tuple):
            if not v or not all(ok(x) for x in v):
                fail(name, v, f"a non-empty list of {plural}")
        elif not ok(v):
            fail(name, v, what)
    heads = getattr(cfg, "num_heads", None)
    if not isinstance(heads, int):  # per-stage heads: the family checks them (Swin)
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

"""Model registry: names -> (class, default config). Loops and tests never name a class."""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config import ConfigError, apply_overrides


@dataclass(frozen=True)
class ModelEntry:
    """What ``create_model`` needs to build one registered name."""

    name: str
    cls: type[nn.Module]
    cfg: Any  # the family's config dataclass instance


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, cls: type[nn.Module], cfg: Any) -> None:
    """Register ``name`` as ``cls(cfg)``; a duplicate name is a programming error."""
    if name in _REGISTRY:
        raise ConfigError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelEntry(name, cls, cfg)


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style ``pattern``."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def get_model_entry(name: str) -> ModelEntry:
    """Look up a name; an unknown one lists the closest registered names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f"closest: {', '.join(close)}" if close else "see vision_tfm.list_models()"
        raise ConfigError(f"unknown model name {name!r}; {hint}") from None


def create_model(
    name: str,
    pretrained: bool | str = False,
    checkpoint_path: str | os.PathLike | Mapping | None = None,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    num_classes: int | None = None,
    in_chans: int | None = None,
    global_pool: str | None = None,
    pretrained_cfg_overlay: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> nn.Module:
    """Build a registered model, as ``timm.create_model`` does; overrides replace config fields.

    Args:
        name: A registered name, optionally with a pretrained tag (``"vit_small_patch16_224.
            augreg_in21k_ft_in1k"``).
        pretrained: True (timm's default weights for the name) or a tag: downloaded into the
            Hugging Face cache, converted and loaded strictly (see ``models.hub``).
        checkpoint_path: A local checkpoint (timm / torchvision / official Swin / our own).
        features_only: Return timm's ``FeatureGetterNet`` around the model: a list of NCHW
            maps with ``feature_info.channels()`` / ``.reduction()``.
        out_indices: With ``features_only``: which ``feature_info`` levels (default all).
        num_classes, in_chans, global_pool: Config fields, named as in timm.
        pretrained_cfg_overlay: Entries replacing those of ``model.pretrained_cfg``.
        **overrides: Any other field of the family's config dataclass.

    The model keeps ``model_name`` and the resolved ``cfg`` so checkpoints can say what they are.
    """
    name, _, tag = name.partition(".")
    entry = get_model_entry(name)
    named = {"num_classes": num_classes, "in_chans": in_chans, "global_pool": global_pool}
    overrides = {**{k: v for k, v in named.items() if v is not None}, **overrides}
    try:
        cfg = apply_overrides(entry.cfg, overrides)
        model = entry.cls(cfg)  # a layer may still refuse a value
    except ValueError as e:
        raise ConfigError(f"{name}: {e}") from None
    model.model_name = name
    if pretrained or tag or checkpoint_path is not None:
        from .hub import load_weights

        load_weights(model, tag or pretrained, checkpoint_path)
    if pretrained_cfg_overlay:
        model._cfg_overlay = {**getattr(model, "_cfg_overlay", {}), **pretrained_cfg_overlay}
    if not features_only:
        return model
    from timm.models._features import FeatureGetterNet

    if out_indices is None:
        out_indices = tuple(range(len(model.feature_info)))
    try:
        return FeatureGetterNet(model, out_indices, output_fmt="NCHW")
    except ValueError as e:
        raise ConfigError(f"{name}: out_indices {out_indices}: {e}") from None

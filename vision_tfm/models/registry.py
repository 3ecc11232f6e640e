"""Model registry: names -> (class, default config). Loops and tests never name a class."""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config import ConfigError, apply_overrides
from .folder import SOURCES


@dataclass(frozen=True)
class ModelEntry:
    """What ``create_model`` needs to build one registered name."""

    name: str
    cls: type[nn.Module]
    cfg: Any  # the family's config dataclass instance


_REGISTRY: dict[str, ModelEntry] = {}
_LISTENERS: list[Callable[[str], None]] = []  # told each new name (timm's registry is one)


def register_model(name: str, cls: type[nn.Module], cfg: Any) -> None:
    """Register ``name`` as ``cls(cfg)``; a duplicate name is a programming error."""
    if name in _REGISTRY:
        raise ConfigError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelEntry(name, cls, cfg)
    for tell in _LISTENERS:
        tell(name)


def on_register(listener: Callable[[str], None]) -> None:
    """Call ``listener`` with every registered name, now and as more are registered."""
    _LISTENERS.append(listener)
    for name in list(_REGISTRY):
        listener(name)


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
            augreg_in21k_ft_in1k"``: as in timm, the tag picks the config and the weights
            ``pretrained=True`` loads), or a saved folder: ``"local-dir:DIR"`` /
            ``"hf-hub:org/name"`` (``models.hf``; its weights load with ``pretrained=True``).
        pretrained: True (timm's default weights for the name) or a tag: downloaded into the
            Hugging Face cache, converted and loaded strictly (see ``models.hub``).
        checkpoint_path: A local checkpoint (timm / torchvision / official Swin / our own).
        features_only: Return timm's ``FeatureGetterNet`` around the model: a list of NCHW
            maps with ``feature_info.channels()`` / ``.reduction()``.
        out_indices: With ``features_only``: which ``feature_info`` levels; default: timm's
            for the family (the last 3 blocks of a ViT, every stage of Swin and the hybrid).
        num_classes, in_chans, global_pool: Config fields, named as in timm.
        pretrained_cfg_overlay: Entries replacing those of ``model.pretrained_cfg``.
        **overrides: Any other field of the family's config dataclass.

    The model keeps ``model_name`` and the resolved ``cfg`` so checkpoints can say what they are.
    """
    if name.partition(":")[0] in SOURCES:  # a saved folder, as in timm
        return _from_folder(
            name, bool(pretrained), checkpoint_path, pretrained_cfg_overlay, features_only,
            out_indices, num_classes=num_classes, in_chans=in_chans, global_pool=global_pool,
            **overrides,
        )  # fmt: skip
    name, _, tag = name.partition(".")
    entry = get_model_entry(name)
    published = None
    if tag or (pretrained and checkpoint_path is None):
        from .hub import resolve_pretrained_cfg

        # as in timm: a tag picks the weights' config (normalisation, class count) and
        # downloads only with pretrained=True
        wanted = tag or (pretrained if isinstance(pretrained, str) else None)
        published = resolve_pretrained_cfg(name, wanted)
        if num_classes is None and published.get("num_classes"):
            num_classes = published["num_classes"]
    if pretrained and checkpoint_path is None:
        from .hub import published_weights

        checkpoint_path = published_weights(name, published)  # before building: fails fast
    named = {"num_classes": num_classes, "in_chans": in_chans, "global_pool": global_pool}
    overrides = {**{k: v for k, v in named.items() if v is not None}, **overrides}
    try:
        cfg = apply_overrides(entry.cfg, overrides)
        model = entry.cls(cfg)  # a layer may still refuse a value
    except ValueError as e:
        raise ConfigError(f"{name}: {e}") from None
    model.model_name = name
    if published is not None:
        from .hub import published_overlay

        model._cfg_overlay = published_overlay(published)
    if checkpoint_path is not None:
        from .hub import load_weights

        load_weights(model, checkpoint_path=checkpoint_path)
    return _finish(model, name, pretrained_cfg_overlay, features_only, out_indices)


def _from_folder(
    name: str,
    pretrained: bool,
    checkpoint_path: Any,
    overlay: Mapping[str, Any] | None,
    features_only: bool,
    out_indices: int | Sequence[int] | None,
    **overrides: Any,
) -> nn.Module:
    """``create_model`` of a saved folder: as in timm, its config builds the model and
    ``pretrained=True`` loads its weights; overrides (``num_classes=...``) apply on top."""
    from .folder import read_folder

    if checkpoint_path is not None:
        raise ConfigError(f"{name}: pass either a folder name or checkpoint_path=, not both")
    saved = read_folder(name, pretrained)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    data = dict(saved.overlay)
    if overrides.get("num_classes", saved.num_classes) != saved.num_classes:
        data.pop("label_names", None)  # a new head: the saved names no longer apply
    try:
        get_model_entry(saved.name)
    except ConfigError as e:
        raise ConfigError(f"{name}: its architecture is not a vision_tfm model ({e})") from None
    try:
        return create_model(
            saved.name,
            checkpoint_path=saved.weights,
            pretrained_cfg_overlay={**data, **(overlay or {})},
            features_only=features_only,
            out_indices=out_indices,
            **{**saved.args, **overrides},
        )
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}") from None


def _finish(
    model: nn.Module,
    name: str,
    overlay: Mapping[str, Any] | None,
    features_only: bool,
    out_indices: int | Sequence[int] | None,
) -> nn.Module:
    """The overlay, and timm's feature wrapper with timm's default levels and cfg."""
    if overlay:
        model._cfg_overlay = {**getattr(model, "_cfg_overlay", {}), **overlay}
    if not features_only:
        return model
    from timm.models._features import FeatureGetterNet

    levels = len(model.feature_info)
    if out_indices is None:
        out_indices = model.default_out_indices
        if isinstance(out_indices, int):  # the last n, or every level of a shallower model
            out_indices = min(out_indices, levels)
    if out_indices is None:
        out_indices = tuple(range(levels))
    try:
        fe = FeatureGetterNet(model, out_indices, output_fmt="NCHW")
    except ValueError as e:
        raise ConfigError(f"{name}: out_indices {out_indices}: {e}") from None
    fe.pretrained_cfg = fe.default_cfg = model.pretrained_cfg  # as timm's builder sets it
    return fe

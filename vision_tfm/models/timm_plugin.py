"""vision_tfm's architectures in timm's registry, so timm's own tools build them.

``import vision_tfm`` registers every name of ours with ``timm.models.register_model``: timm's
``create_model``, ``list_models``, ``train.py --device-modules vision_tfm`` and
``validate.py`` then see them. A name timm already has (``vit_small_patch16_224``: ours
loads timm's weights under the same name) is registered as ``vtfm_<name>`` instead, so
importing vision_tfm never changes what a timm name builds.

The other direction: :func:`timm_equivalent` says when timm's own class builds the same
network with the same state-dict keys, so a saved folder can name timm's architecture and
load in plain timm, with no vision_tfm installed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .hub import TIMM_PREFIX, WEIGHTS_NAME, hub_folder
from .registry import create_model, get_model_entry, on_register

# timm's generic create_model kwargs: passed on where the config has the field, and
# ignored where it lacks it only while they ask for nothing (timm's train.py always sends
# drop_rate, even 0.0; a family without dropout has nothing to switch off)
_GENERIC = ("drop_rate", "drop_path_rate", "drop_block_rate", "bn_momentum", "bn_eps")
_TIMM_ONLY = ("pretrained_model_args", "cache_dir", "scriptable", "exportable", "no_jit")

default_cfgs: dict[str, dict[str, Any]] = {}  # timm reads the module's pretrained cfgs here
_TIMM_NAMES: dict[str, str] = {}  # our name -> its name in timm's registry


def timm_name(name: str) -> str:
    """The name timm's registry knows our model ``name`` by."""
    register_all()
    return _TIMM_NAMES[name]


def _pretrained_cfg(name: str) -> dict[str, Any]:
    """timm's cfg fields for the registered defaults: what ``resolve_data_config`` reads."""
    from timm.models import PretrainedCfg

    fields = {f.name for f in dataclasses.fields(PretrainedCfg)}
    entry = get_model_entry(name)
    with torch.device("meta"):  # the structure only: nothing is allocated or initialised
        model = entry.cls(entry.cfg)
    cfg = model.pretrained_cfg
    return {k: v for k, v in cfg.items() if k in fields and k != "architecture"}


def _folder_weights(cfg: Any) -> Path | None:
    """The weights file a timm ``pretrained_cfg`` points at when timm read a folder's
    config (``source`` local-dir or hf-hub), else None."""
    if cfg is None or isinstance(cfg, str):
        return None
    get = cfg.get if isinstance(cfg, Mapping) else lambda k: getattr(cfg, k, None)
    if get("source") == "local-dir" and get("file"):
        return Path(get("file")) / WEIGHTS_NAME
    if get("source") == "hf-hub" and get("hf_hub_id"):
        return hub_folder(str(get("hf_hub_id")), f"hf-hub:{get('hf_hub_id')}") / WEIGHTS_NAME
    return None


def _entrypoint(name: str, registered: str) -> Callable[..., nn.Module]:
    """timm's entrypoint signature over :func:`~vision_tfm.models.create_model`."""

    def build(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        cfg = kwargs.pop("pretrained_cfg", None)
        overlay = kwargs.pop("pretrained_cfg_overlay", None) or {}
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        for k in _TIMM_ONLY:
            kwargs.pop(k, None)
        fields = {f.name for f in dataclasses.fields(get_model_entry(name).cfg)}
        for k in _GENERIC:
            if k in kwargs and k not in fields:
                if kwargs[k]:
                    raise ConfigError(f"{registered}: has no {k} (got {kwargs[k]!r})")
                del kwargs[k]
        tag = cfg if isinstance(cfg, str) else ""
        weights = _folder_weights(cfg) if pretrained and not isinstance(cfg, str) else None
        overlay = dict(overlay)
        file = overlay.pop("file", None)  # train.py --pretrained-path: a local weights file
        overlay.pop("num_classes", None)  # its -1 ("adapt the head") is our num_classes rule
        if weights is None and file:
            weights = Path(file)
        model = create_model(
            f"{name}.{tag}" if tag else name,
            pretrained=bool(pretrained and weights is None),
            checkpoint_path=weights if pretrained else None,
            pretrained_cfg_overlay=overlay or None,
            **kwargs,
        )
        return model.to(device=device, dtype=dtype) if device or dtype else model

    build.__name__ = build.__qualname__ = registered
    build.__module__ = __name__
    build.__doc__ = f"vision_tfm's ``{name}`` (timm's entrypoint signature)."
    return build


def _register(name: str) -> None:
    import timm.models

    registered = TIMM_PREFIX + name if timm.models.is_model(name) else name
    default_cfgs[registered] = _pretrained_cfg(name)
    fn = _entrypoint(name, registered)
    setattr(sys.modules[__name__], registered, fn)
    timm.models.register_model(fn)
    _TIMM_NAMES[name] = registered


def register_all() -> None:
    """Register every vision_tfm name in timm's registry, and each name a plug-in family
    registers later; once (idempotent)."""
    if not _TIMM_NAMES:
        on_register(_register)


# --- timm's own classes ------------------------------------------------------------------

_VIT_ARGS = (
    "img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
    "num_heads", "mlp_ratio", "qkv_bias", "qk_norm", "class_token", "pos_embed", "drop_rate",
    "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
)  # fmt: skip
_SWIN_ARGS = (
    "img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depths",
    "num_heads", "window_size", "mlp_ratio", "qkv_bias", "drop_rate", "proj_drop_rate",
    "attn_drop_rate", "drop_path_rate",
)  # fmt: skip


def _vit_args(cfg: Any) -> dict[str, Any] | None:
    plain = ("pre", "softmax", "mlp", "layernorm", False)
    if (cfg.norm_place, cfg.attn_type, cfg.mlp_layer, cfg.norm_layer, cfg.qk_norm) != plain:
        return None
    if cfg.pos_embed not in ("learn", "none"):  # timm's class has no sin-cos or RoPE option
        return None
    args = {k: getattr(cfg, k) for k in _VIT_ARGS}
    # ours resamples the position table for any input, as timm does with this flag
    return {**args, "init_values": cfg.init_values or None, "dynamic_img_size": True}


def _swin_args(cfg: Any) -> dict[str, Any] | None:
    if (cfg.norm_place, cfg.norm_layer) != ("pre", "layernorm"):
        return None
    args = {k: getattr(cfg, k) for k in _SWIN_ARGS}
    return {**args, "depths": list(cfg.depths), "num_heads": list(cfg.num_heads)}


# family class name -> (timm architecture for names timm lacks, cfg -> timm kwargs)
_TIMM_CLASSES: Mapping[str, tuple[str, Callable[[Any], dict[str, Any] | None]]] = {
    "VisionTransformer": ("vit_base_patch16_224", _vit_args),
    "SwinTransformer": ("swin_tiny_patch4_window7_224", _swin_args),
}


def timm_equivalent(model: nn.Module) -> tuple[str, dict[str, Any]] | None:
    """``(architecture, model_args)`` when timm's own class builds ``model``'s network with
    the same state-dict keys, else None (linear attention, RoPE, Post-LN, RMSNorm, the
    hybrids: only vision_tfm builds those)."""
    import timm.models

    known = _TIMM_CLASSES.get(type(model).__name__)
    args = known[1](model.cfg) if known else None
    if args is None:
        return None
    name = getattr(model, "model_name", "")
    arch = (
        name
        if timm.models.is_model(name) and TIMM_PREFIX + name in _TIMM_NAMES.values()
        else (known[0])
    )
    return arch, args

"""Checkpoint interop: timm, torchvision and official-Swin state dicts -> our keys.

``load_pretrained`` detects the source layout from the keys, converts, resamples what
depends on resolution (ViT position table), and loads strictly: anything missing or
unexpected is listed in the error. The only tolerated difference is a classifier head of
another class count, which is left at its fresh init and reported (fine-tuning use).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import nn

from ..layers import resample_abs_pos_embed

__all__ = ["convert_state_dict", "detect_source", "load_pretrained", "read_state_dict"]

StateDict = dict[str, torch.Tensor]
_WRAPPERS = ("state_dict_ema", "model_ema", "state_dict", "model")
_BUFFERS = re.compile(r"(relative_position_index|attn_mask|relative_coords_table)$")


def read_state_dict(path_or_state_dict: str | os.PathLike | Mapping) -> StateDict:
    """Read a checkpoint file (``weights_only=True``) and unwrap common training containers."""
    if isinstance(path_or_state_dict, Mapping):
        sd = path_or_state_dict
    else:
        path = os.fspath(path_or_state_dict)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint not found: {path}")
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle/zip errors carry multi-line messages
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"cannot read checkpoint {path}: {first}") from None
    for key in _WRAPPERS:
        if isinstance(sd, Mapping) and key in sd and isinstance(sd[key], Mapping):
            sd = sd[key]
            break
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError("checkpoint does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def detect_source(sd: Mapping[str, torch.Tensor]) -> str:
    """Name the key layout: ``timm_vit``, ``tv_vit``, ``timm_swin``, ``tv_swin``, ``ms_swin``."""
    keys = set(sd)
    if (
        any(k.startswith("encoder.layers.encoder_layer_") for k in keys)
        or "conv_proj.weight" in keys
    ):
        return "tv_vit"
    if "features.0.0.weight" in keys:
        if any("cpb_mlp" in k or "logit_scale" in k for k in keys):
            raise ValueError("checkpoint is a Swin V2 (torchvision); only Swin V1 is supported")
        return "tv_swin"
    if any(k.startswith("layers.") and ".blocks." in k for k in keys):
        if "layers.0.downsample.reduction.weight" in keys:
            return "ms_swin"  # official repo merges at the end of a stage
        return "timm_swin"
    if any(k.startswith("blocks.") for k in keys) and "patch_embed.proj.weight" in keys:
        return "timm_vit"
    raise ValueError(
        "unrecognised checkpoint layout: expected timm, torchvision or official Swin keys "
        f"(first keys: {sorted(keys)[:4]})"
    )


def _rename(sd: Mapping[str, torch.Tensor], rules: list[tuple[str, str]]) -> StateDict:
    out: StateDict = {}
    for k, v in sd.items():
        if _BUFFERS.search(k):
            continue  # derived buffers: we rebuild them
        for pat, rep in rules:
            k = re.sub(pat, rep, k)
        out[k] = v
    return out


def _tv_swin_stage(m: re.Match) -> str:
    i = int(m.group(1))  # features.{2s+1} = blocks of stage s; features.{2s} = merge into s
    return f"layers.{(i - 1) // 2}.blocks." if i % 2 else f"layers.{i // 2}.downsample."


def _ms_swin_merge(m: re.Match) -> str:
    return f"layers.{int(m.group(1)) + 1}.downsample."


_RULES: dict[str, list[tuple[str, str | Callable[[re.Match], str]]]] = {
    "timm_vit": [],
    "timm_swin": [(r"^head\.(weight|bias)$", r"head.fc.\1")],
    "ms_swin": [
        (r"^layers\.(\d+)\.downsample\.", _ms_swin_merge),
        (r"^head\.(weight|bias)$", r"head.fc.\1"),
    ],
    "tv_swin": [
        (r"^features\.0\.0\.", "patch_embed.proj."),
        (r"^features\.0\.2\.", "patch_embed.norm."),
        (r"^features\.(\d+)\.", _tv_swin_stage),
        (r"\.mlp\.0\.", ".mlp.fc1."),
        (r"\.mlp\.3\.", ".mlp.fc2."),
        (r"^head\.(weight|bias)$", r"head.fc.\1"),
    ],
    "tv_vit": [
        (r"^conv_proj\.", "patch_embed.proj."),
        (r"^class_token$", "cls_token"),
        (r"^encoder\.pos_embedding$", "pos_embed"),
        (r"^encoder\.ln\.", "norm."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.", r"blocks.\1."),
        (r"\.ln_1\.", ".norm1."),
        (r"\.ln_2\.", ".norm2."),
        (r"\.self_attention\.in_proj_(weight|bias)$", r".attn.qkv.\1"),
        (r"\.self_attention\.out_proj\.", ".attn.proj."),
        (r"\.mlp\.(0|linear_1)\.", ".mlp.fc1."),
        (r"\.mlp\.(3|linear_2)\.", ".mlp.fc2."),
        (r"^heads\.head\.", "head."),
    ],
}


def convert_state_dict(sd: Mapping[str, torch.Tensor], source: str | None = None) -> StateDict:
    """Rename a foreign state dict into vision_tfm keys (no shape changes)."""
    source = source or detect_source(sd)
    return _rename(sd, _RULES[source])


def _family(model: nn.Module) -> str:
    name = type(model).__name__.lower()
    return "swin" if "swin" in name else "vit" if "vision" in name else name


def _adapt(model: nn.Module, sd: StateDict) -> tuple[StateDict, list[str]]:
    """Resample the ViT position table; drop a head of another class count."""
    own = model.state_dict()
    dropped = []
    if "pos_embed" in sd and "pos_embed" in own and sd["pos_embed"].shape != own["pos_embed"].shape:
        prefix = getattr(model, "num_prefix_tokens", 1)
        sd["pos_embed"] = resample_abs_pos_embed(sd["pos_embed"], model.grid, None, prefix)
    for k in [k for k in sd if k.startswith("head.")]:
        if k in own and own[k].shape != sd[k].shape:
            dropped.append(k)
            del sd[k]
    return sd, dropped


def load_pretrained(
    model: nn.Module, path_or_state_dict: str | os.PathLike | Mapping, strict: bool = True
) -> nn.Module:
    """Load timm / torchvision / official-Swin weights into ``model``.

    Args:
        model: A vision_tfm ViT or Swin.
        path_or_state_dict: A checkpoint path (read with ``weights_only=True``) or a state dict.
        strict: Refuse missing or unexpected keys (after conversion).
    """
    sd = read_state_dict(path_or_state_dict)
    source = detect_source(sd)
    family = _family(model)
    if not source.endswith(family):
        raise ValueError(
            f"checkpoint is a {source.split('_')[-1]} ({source.split('_')[0]}) state dict, "
            f"but the model is a {type(model).__name__}"
        )
    sd, dropped = _adapt(model, convert_state_dict(sd, source))
    own = model.state_dict()
    missing = sorted(set(own) - set(sd) - set(dropped))
    unexpected = sorted(set(sd) - set(own))
    if strict and (missing or unexpected):
        raise ValueError(
            f"checkpoint ({source}) does not fit {type(model).__name__}: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    bad = [k for k in sd if k in own and own[k].shape != sd[k].shape]
    if bad:
        k = bad[0]
        raise ValueError(
            f"checkpoint ({source}) does not fit {type(model).__name__}: {k} has shape "
            f"{tuple(sd[k].shape)}, model expects {tuple(own[k].shape)}"
            + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
        )
    model.load_state_dict(sd, strict=False)
    if dropped:
        warnings.warn(
            f"classifier head left at init: checkpoint has another class count ({dropped[0]})",
            stacklevel=2,
        )
    return model

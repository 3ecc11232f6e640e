"""Checkpoint interop: timm, torchvision and official-Swin state dicts -> our keys.

``load_pretrained`` detects the source layout from the keys, converts, resamples the ViT
position table, and loads strictly; the only tolerated difference is the classifier head
(:func:`_split_head`).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, MissingFileError, NotAFileError
from ..layers import resample_abs_pos_embed

StateDict = dict[str, torch.Tensor]
_WRAPPERS = ("state_dict_ema", "model_ema", "state_dict", "model")
_BUFFERS = re.compile(r"(relative_position_index|attn_mask|relative_coords_table)$")


def read_state_dict(path_or_state_dict: str | os.PathLike | Mapping) -> StateDict:
    """Read a checkpoint file (``weights_only=True``) and unwrap common training containers."""
    if isinstance(path_or_state_dict, Mapping):
        sd = path_or_state_dict
    elif Path(path_or_state_dict).suffix == ".safetensors":
        sd = load_safetensors(path_or_state_dict)
    else:
        sd = load_torch_file(path_or_state_dict)
    meta = sd.get("meta") if isinstance(sd, Mapping) else None
    if (
        isinstance(meta, Mapping)
        and meta.get("weights") == "ema"
        and isinstance(sd.get("ema"), Mapping)
    ):
        sd = sd["ema"]  # a vision_tfm run that shipped its EMA weights
    for key in _WRAPPERS:
        if isinstance(sd, Mapping) and key in sd and isinstance(sd[key], Mapping):
            sd = sd[key]
            break
    if not isinstance(sd, Mapping) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError("checkpoint does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in sd.items()}


def check_finite(sd: Mapping[str, torch.Tensor], what: str) -> None:
    """Refuse weights holding NaN or inf, naming the first such tensor: they would load without
    a word and then predict NaN (or train on from it)."""
    for key, t in sd.items():
        if t.is_floating_point() and t.device.type != "meta" and not torch.isfinite(t).all():
            raise CheckpointError(f"{what}: tensor {key!r} holds NaN or inf values")


def check_checkpoint_path(path: str | os.PathLike) -> Path:
    """Fail on a missing checkpoint before anything else (e.g. an "output exists" check)."""
    path = Path(path)
    if path.is_dir():
        raise NotAFileError(f"{path} is a directory; expected a checkpoint file")
    if not path.is_file():
        raise MissingFileError(f"checkpoint not found: {path}")
    return path


def load_torch_file(path: str | os.PathLike) -> Any:
    """``torch.load(weights_only=True)`` with one-line errors that say what the file is.

    torch's own message advises ``weights_only=False``: wrong for a file that is no checkpoint
    at all, and unsafe for one that is. Shared by ``load_pretrained`` and the training code.
    """
    path = check_checkpoint_path(path)
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning is not the news
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle/zip errors carry multi-line messages, or none
        with open(path, "rb") as f:
            archive = f.read(2) == b"PK"  # what torch.save writes
        why = "not a PyTorch checkpoint file (expected a torch.save archive)"
        if archive and "Weights only load failed" in str(e):
            why = "it holds pickled Python objects, not only tensors, and is not loaded for "
            why += "safety (save model.state_dict() instead)"
        raise CheckpointError(f"cannot read checkpoint {path}: {why}") from None


def load_safetensors(path: str | os.PathLike) -> StateDict:
    """A ``.safetensors`` file (the hub's and our model folders' format: nothing to unpickle)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = check_checkpoint_path(path)
    try:
        return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"cannot read weights {path}: not a safetensors file ({why})"
        ) from None


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
            raise CheckpointError(
                "checkpoint is a Swin V2 (torchvision); only Swin V1 is supported"
            )
        return "tv_swin"
    if any(k.startswith("layers.") and ".blocks." in k for k in keys):
        if "layers.0.downsample.reduction.weight" in keys:
            return "ms_swin"  # official repo merges at the end of a stage
        return "timm_swin"
    if any(k.startswith("blocks.") for k in keys) and "patch_embed.proj.weight" in keys:
        return "timm_vit"
    raise CheckpointError(
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


def _check_fit(model: nn.Module, own: StateDict, sd: StateDict, source: str) -> None:
    """Refuse a state dict of another size or dtype before anything is resampled.

    The position table's token count and a classifier head of another class count may
    differ (they are resampled / left at init); every other shared key must match exactly,
    and a floating parameter needs floating values (an int64 copy would load silently).
    """
    for k, v in sd.items():
        if k not in own or k.startswith("head."):
            continue
        mine = own[k]
        if k == "pos_embed":
            same = v.ndim == mine.ndim and v.shape[-1] == mine.shape[-1]
        else:
            same = v.shape == mine.shape
        if not same:
            raise CheckpointError(
                f"checkpoint ({source}) does not fit {type(model).__name__}: {k} has shape "
                f"{tuple(v.shape)}, model expects {tuple(mine.shape)}"
            )
        if mine.is_floating_point() and not v.is_floating_point():
            raise CheckpointError(
                f"checkpoint ({source}) does not fit {type(model).__name__}: {k} is {v.dtype}, "
                f"model expects floating-point values ({mine.dtype})"
            )


def _split_head(own: StateDict, sd: StateDict) -> tuple[StateDict, list[str], str]:
    """The one tolerated difference, in one place: the classifier head.

    A checkpoint head the model lacks (``num_classes=0``) or of another class count is
    dropped; returns the state dict, the model's head keys left at init, and why.
    """

    def fits(k: str, v: torch.Tensor) -> bool:
        return not k.startswith("head.") or (k in own and own[k].shape == v.shape)

    kept = {k: v for k, v in sd.items() if fits(k, v)}
    at_init = [k for k in own if k.startswith("head.") and k not in kept]
    why = "has another class count" if any(k in sd for k in at_init) else "has no classifier"
    return kept, at_init, why


def _resample_pos_embed(model: nn.Module, own: StateDict, sd: StateDict) -> StateDict:
    """The ViT position table at the model's grid (``_check_fit`` allowed only its length)."""
    if "pos_embed" in sd and "pos_embed" in own and sd["pos_embed"].shape != own["pos_embed"].shape:
        prefix = getattr(model, "num_prefix_tokens", 1)
        try:
            sd["pos_embed"] = resample_abs_pos_embed(sd["pos_embed"], model.grid, None, prefix)
        except ValueError as e:  # a token count that is no grid
            raise CheckpointError(f"checkpoint pos_embed: {e}") from None
    return sd


def check_norm_kind(model: nn.Module, sd: Mapping[str, torch.Tensor], what: str) -> None:
    """Refuse weights trained with the other norm (``norm_layer``): a LayerNorm has a bias
    an RMSNorm lacks, and loading one into the other would fail on a key, or worse, load."""
    for name, m in model.named_modules():
        if not isinstance(m, (nn.LayerNorm, nn.RMSNorm)) or f"{name}.weight" not in sd:
            continue
        has_bias = f"{name}.bias" in sd
        if has_bias == isinstance(m, nn.LayerNorm):
            continue
        theirs, ours = ("layernorm", "rmsnorm") if has_bias else ("rmsnorm", "layernorm")
        raise CheckpointError(
            f"{what} was trained with norm_layer={theirs!r} ({name}"
            f"{' has' if has_bias else ' lacks'} a bias), but the model has "
            f"norm_layer={ours!r}; build it with norm_layer={theirs!r}"
        )


def load_pretrained(
    model: nn.Module, path_or_state_dict: str | os.PathLike | Mapping, strict: bool = True
) -> nn.Module:
    """Load timm / torchvision / official-Swin weights into ``model``.

    Args:
        model: A vision_tfm model; its class's ``checkpoint_family`` names the foreign layouts
            it takes (ViT, Swin); a family without one loads its own keys.
        path_or_state_dict: A checkpoint path (read with ``weights_only=True``) or a state dict.
        strict: Refuse missing or unexpected keys (after conversion).
    """
    sd = read_state_dict(path_or_state_dict)
    what = "checkpoint" if isinstance(path_or_state_dict, Mapping) else str(path_or_state_dict)
    check_finite(sd, what)
    family = getattr(model, "checkpoint_family", None)  # declared by the family's class
    if family is None:  # no foreign layout: the model's own keys, as saved by training
        check_norm_kind(model, sd, what)
        sd, at_init, why_head = _split_head(model.state_dict(), sd)
        try:
            missing, unexpected = model.load_state_dict(sd, strict=False)
        except RuntimeError as e:  # torch lists every mismatch over several lines
            why = " ".join(str(e).split())
            raise CheckpointError(
                f"checkpoint does not fit {type(model).__name__}: {why}"
            ) from None
        missing = [k for k in missing if k not in at_init]
        if strict and (missing or unexpected):
            raise CheckpointError(
                f"checkpoint does not fit {type(model).__name__}: missing {missing[:8]}, "
                f"unexpected {unexpected[:8]}"
            )
        _warn_head(at_init, why_head)
        return model
    source = detect_source(sd)
    if not source.endswith(family):
        raise CheckpointError(
            f"checkpoint is a {source.split('_')[-1]} ({source.split('_')[0]}) state dict, "
            f"but the model is a {type(model).__name__}"
        )
    sd = convert_state_dict(sd, source)
    check_norm_kind(model, sd, what)
    own = model.state_dict()
    _check_fit(model, own, sd, source)
    sd, at_init, why = _split_head(own, sd)
    missing = sorted(set(own) - set(sd) - set(at_init))
    unexpected = sorted(set(sd) - set(own))
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"checkpoint ({source}) does not fit {type(model).__name__}: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    model.load_state_dict(_resample_pos_embed(model, own, sd), strict=False)
    _warn_head(at_init, why)
    return model


def _warn_head(at_init: list[str], why: str) -> None:
    if at_init:
        warnings.warn(
            f"classifier head left at init: checkpoint {why} ({at_init[0]})", stacklevel=3
        )

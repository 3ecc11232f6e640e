"""Published weights for ``create_model(pretrained=...)`` and ``checkpoint_path=``.

The full-size models carry timm's names, so ``pretrained=True`` (or a tag such as
``"augreg_in21k_ft_in1k"``) resolves timm's ``pretrained_cfg`` and downloads the file with
timm's Hugging Face loader into the normal HF cache; ``load_pretrained`` then loads it.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, MissingFileError
from .convert import convert_state_dict, load_pretrained, read_state_dict

_DATA_KEYS = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "hf_hub_id", "tag")
_CKPT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
Weights = bool | str | os.PathLike | Mapping | None


def weights_source(weights: Weights) -> tuple[bool | str, str | os.PathLike | Mapping | None]:
    """One ``pretrained`` value (a config key, a CLI flag) as ``(pretrained, checkpoint_path)``.

    True is timm's default published weights; a state dict or a path object is a checkpoint;
    a string with a path separator or a checkpoint suffix, or naming an existing file, is a
    file; any other non-empty string is a tag of the published weights.
    """
    if isinstance(weights, (Mapping, os.PathLike)):
        return False, weights
    if not isinstance(weights, str) or not weights:
        return bool(weights), None
    path = Path(weights)
    if os.sep in weights or "/" in weights or path.suffix in _CKPT_SUFFIXES or path.exists():
        return False, weights
    return weights, None


def resolve_pretrained_cfg(name: str, tag: str | None = None) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` for ``name`` (its default tag, or ``tag``) as a dict."""
    import timm.models

    if not timm.models.is_model(name):
        raise ConfigError(
            f"{name}: no published weights (timm has no model of this name); "
            "pass checkpoint_path= to start from a file"
        )
    full = f"{name}.{tag}" if tag else name
    try:
        cfg = timm.models.get_pretrained_cfg(full)
    except RuntimeError:
        cfg = None
    if cfg is None:
        tags = [t.partition(".")[2] for t in timm.models.list_pretrained(f"{name}.*")]
        raise ConfigError(f"{name}: unknown pretrained tag {tag!r}; timm has {', '.join(tags)}")
    return cfg.to_dict()


def _download(name: str, cfg: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The state dict from the HF cache, downloading it there first when online."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from safetensors import SafetensorError
    from timm.models._builder import _resolve_pretrained_source
    from timm.models._hub import load_state_dict_from_hf

    source, where = _resolve_pretrained_source(dict(cfg))
    if source != "hf-hub":
        raise ConfigError(
            f"{name}: the {cfg.get('tag')!r} weights are not on the Hugging Face hub; "
            "pass checkpoint_path= to start from a file"
        )
    repo = where if isinstance(where, str) else where[0]
    try:
        if isinstance(where, str):
            return load_state_dict_from_hf(where, weights_only=True)
        return load_state_dict_from_hf(*where)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):  # before EntryNotFoundError: a kind
        raise MissingFileError(
            f"{name}: pretrained weights hf-hub:{repo} are not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and the hub cannot be reached; download them once "
            "online, or pass checkpoint_path= to load a local file"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError, EntryNotFoundError):
        raise MissingFileError(
            f"{name}: the hub has no weights file at hf-hub:{repo}; "
            "pass checkpoint_path= to load a local file"
        ) from None
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{name}: cached weights hf-hub:{repo} in {constants.HF_HUB_CACHE} are unreadable "
            f"({why}); delete them to download again, or pass checkpoint_path="
        ) from None


def _adapt_in_chans(model: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fit the first conv to the model's input channels (timm's RGB -> gray / RGB-D rule)."""
    from timm.models._manipulate import adapt_input_conv

    key = f"{model.first_conv}.weight"
    if key in sd and sd[key].ndim == 4 and sd[key].shape[1] != model.in_chans:
        sd[key] = adapt_input_conv(model.in_chans, sd[key], base_chans=sd[key].shape[1])
    return sd


def load_weights(
    model: nn.Module,
    pretrained: bool | str = False,
    checkpoint_path: str | os.PathLike | Mapping | None = None,
) -> nn.Module:
    """Load published (``pretrained``: True or a tag) or local (``checkpoint_path``) weights."""
    if checkpoint_path is not None:
        sd = read_state_dict(checkpoint_path)
    else:
        tag = pretrained if isinstance(pretrained, str) else None
        cfg = resolve_pretrained_cfg(model.model_name, tag)
        sd = _download(model.model_name, cfg)
        model._cfg_overlay = {
            **getattr(model, "_cfg_overlay", {}),
            **{k: cfg[k] for k in _DATA_KEYS if cfg.get(k) is not None},
        }
    if model.checkpoint_family is not None:  # a foreign layout: timm / torchvision / official
        sd = convert_state_dict(sd)
    return load_pretrained(model, _adapt_in_chans(model, sd))

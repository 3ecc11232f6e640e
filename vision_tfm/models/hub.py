"""Published weights for ``create_model(pretrained=...)`` and ``checkpoint_path=``.

The full-size models carry timm's names, so ``pretrained=True`` (or a tag such as
``"augreg_in21k_ft_in1k"``) resolves timm's ``pretrained_cfg`` and downloads the file with
timm's Hugging Face loader into the normal HF cache; ``load_pretrained`` then loads it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError, MissingFileError
from .convert import convert_state_dict, load_pretrained, read_state_dict

_DATA_KEYS = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "hf_hub_id", "tag")
_CKPT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
TIMM_PREFIX = "vtfm_"
"""Prefix of our names in timm's registry where timm has the name (``models.timm_plugin``)."""
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
"""The Hugging Face / timm model folder's files (``models.hf``)."""
_HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # timm's order: the safe one first
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


def timm_has(name: str) -> bool:
    """Whether timm itself has a model called ``name`` (ours then loads its published
    weights); our own names, which ``timm_plugin`` adds to timm's registry, do not count."""
    import timm.models

    if not timm.models.is_model(name):
        return False
    return not timm.models.model_entrypoint(name).__module__.startswith("vision_tfm.")


def resolve_pretrained_cfg(name: str, tag: str | None = None) -> dict[str, Any]:
    """timm's ``pretrained_cfg`` for ``name`` (its default tag, or ``tag``) as a dict."""
    import timm.models

    if not timm_has(name):
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


def hub_reachable(timeout: float = 1.5) -> bool:
    """Whether the hub answers at all, asked once with a short timeout.

    huggingface_hub retries an unreachable host with backoff for most of a minute before it
    gives up; a file missing from the cache on an offline machine should fail at once.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout, follow_redirects=False)
    except Exception:  # any transport failure (DNS, refused, timeout, proxy) means "no"
        return False
    return True


def hub_file(repo: str, filenames: Sequence[str], what: str, revision: str | None = None) -> Path:
    """The first of ``filenames`` in hub repo ``repo``: from the cache, else downloaded there.

    Raises:
        MissingFileError: Not cached and the hub is unreachable (at once, one line naming the
            repo, the cache and ``checkpoint_path=``), or the repo has none of the files.
    """
    from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    for name in filenames:
        cached = try_to_load_from_cache(repo, name, revision=revision)
        if isinstance(cached, str):
            return Path(cached)
    if not hub_reachable():
        raise MissingFileError(
            f"{what}: hf-hub:{repo} is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and the hub cannot be reached; download it once "
            "online, or load a local file: checkpoint_path= (model.pretrained=PATH in a config)"
        )
    for name in filenames:
        try:
            return Path(hf_hub_download(repo, name, revision=revision))
        except EntryNotFoundError:
            continue  # the next candidate name
        except (RepositoryNotFoundError, RevisionNotFoundError):
            break
        except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise MissingFileError(
                f"{what}: cannot download hf-hub:{repo} ({why}); "
                "pass checkpoint_path= to load a local file"
            ) from None
    raise MissingFileError(
        f"{what}: the hub has no {' or '.join(filenames)} at hf-hub:{repo}; "
        "pass checkpoint_path= to load a local file"
    )


def hub_folder(repo: str, what: str, weights: bool = True) -> Path:
    """The snapshot folder of hub repo ``repo`` (``org/name[@revision]``) holding its config
    (and, with ``weights``, its weights), from the cache or downloaded there."""
    repo, _, revision = repo.partition("@")
    config = hub_file(repo, (CONFIG_NAME,), what, revision or None)
    if weights:
        hub_file(repo, (WEIGHTS_NAME,), what, revision or None)  # the same snapshot folder
    return config.parent


def published_weights(name: str, cfg: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The published state dict ``cfg`` names, from the HF cache or downloaded there."""
    from huggingface_hub import constants
    from timm.models._builder import _resolve_pretrained_source

    source, where = _resolve_pretrained_source(dict(cfg))
    if source != "hf-hub":
        raise ConfigError(
            f"{name}: the {cfg.get('tag')!r} weights are not on the Hugging Face hub; "
            "pass checkpoint_path= to start from a file"
        )
    repo, names = (where, _HUB_WEIGHTS) if isinstance(where, str) else (where[0], (where[1],))
    repo, _, revision = repo.partition("@")
    path = hub_file(repo, names, name, revision or None)
    try:
        return read_state_dict(path)
    except CheckpointError as e:
        raise CheckpointError(
            f"{name}: cached weights hf-hub:{repo} in {constants.HF_HUB_CACHE} are unreadable "
            f"({e}); delete them to download again, or pass checkpoint_path="
        ) from None


def _adapt_in_chans(model: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fit the first conv to the model's input channels (timm's RGB -> gray / RGB-D rule)."""
    from timm.models._manipulate import adapt_input_conv

    key = f"{model.first_conv}.weight"
    if key in sd and sd[key].ndim == 4 and sd[key].shape[1] != model.in_chans:
        sd[key] = adapt_input_conv(model.in_chans, sd[key], base_chans=sd[key].shape[1])
    return sd


def published_overlay(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What a published cfg says of the data (normalisation, crop), for ``pretrained_cfg``."""
    return {k: cfg[k] for k in _DATA_KEYS if cfg.get(k) is not None}


def load_weights(
    model: nn.Module,
    pretrained: bool | str | Mapping[str, Any] | None = False,
    checkpoint_path: str | os.PathLike | Mapping | None = None,
) -> nn.Module:
    """Load published (``pretrained``: True, a tag, or its resolved cfg) or local
    (``checkpoint_path``: timm / torchvision / official Swin / ours) weights."""
    if checkpoint_path is not None:
        sd = read_state_dict(checkpoint_path)
    else:
        cfg = pretrained
        if not isinstance(cfg, Mapping):
            tag = pretrained if isinstance(pretrained, str) else None
            cfg = resolve_pretrained_cfg(model.model_name, tag)
        sd = published_weights(model.model_name, cfg)
        model._cfg_overlay = {**getattr(model, "_cfg_overlay", {}), **published_overlay(cfg)}
    if model.checkpoint_family is not None:  # a foreign layout: timm / torchvision / official
        sd = convert_state_dict(sd)
    return load_pretrained(model, _adapt_in_chans(model, sd))

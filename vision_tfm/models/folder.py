"""Reading a Hugging Face / timm model folder (``config.json`` + ``model.safetensors``).

``create_model("local-dir:DIR")`` and ``("hf-hub:org/name")`` come here for what to build:
our registered name and its config from the folder's ``vision_tfm`` entry (any family, as
``models.hf`` wrote it), or, in a folder timm wrote for a name we share (ViT, Swin), timm's
``architecture`` and ``model_args``, whose fields are ours under the same names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError, MissingFileError
from .hub import CONFIG_NAME, TIMM_PREFIX, WEIGHTS_NAME, hub_folder

SOURCES = ("local-dir", "hf-hub")
"""Name prefixes ``create_model`` reads a folder from, as timm spells them."""
DATA_KEYS = ("mean", "std", "crop_pct", "crop_mode", "interpolation", "label_names", "license")
"""What a folder's ``pretrained_cfg`` says beyond the architecture: kept on load."""
# timm's factory options that change nothing in our networks (ours run at any size)
_TIMM_RUNTIME_ARGS = ("dynamic_img_size", "dynamic_img_pad", "strict_img_size")


@dataclass(frozen=True)
class SavedModel:
    """What a folder says to build: a registered name, its config fields, the weights file
    (None: leave them at init) and the data entries of its ``pretrained_cfg``."""

    name: str
    args: dict[str, Any]
    weights: Path | None
    overlay: dict[str, Any]
    num_classes: int | None


def _read_config(path: Path, what: str) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = str(e).splitlines()[0][:200]
        raise CheckpointError(f"{what}: {path} is not a readable JSON config ({why})") from None
    if not isinstance(config, dict) or not isinstance(config.get("architecture"), str):
        raise CheckpointError(f"{what}: {path} names no 'architecture'; not a model folder")
    return config


def _model_args(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Our registered name and config fields for a folder's ``config.json``."""
    ours = config.get("vision_tfm")
    if isinstance(ours, Mapping) and isinstance(ours.get("model_name"), str):
        return ours["model_name"], dict(ours.get("model_args") or {})
    given = config.get("model_args") or {}
    args = {k: v for k, v in given.items() if k not in _TIMM_RUNTIME_ARGS}
    for k in ("img_size", "patch_size", "window_size"):  # timm writes (h, w); ours are square
        v = args.get(k)
        if isinstance(v, list) and len(v) == 2 and v[0] == v[1]:
            args[k] = v[0]
    if args.get("init_values") is None:  # timm's "no LayerScale"; ours is 0.0
        args.pop("init_values", None)
    return str(config["architecture"]).removeprefix(TIMM_PREFIX), args


def read_folder(name: str, pretrained: bool) -> SavedModel:
    """Resolve ``local-dir:DIR`` / ``hf-hub:org/name[@revision]`` to what to build.

    Raises:
        MissingFileError: No such folder, not in the hub cache while offline, or no weights
            file where ``pretrained`` asks for one.
        CheckpointError: A config that is not JSON or names no architecture.
    """
    source, _, where = name.partition(":")
    if not where:
        raise ConfigError(f"model name {name!r}: nothing after '{source}:'")
    if source == "local-dir":
        folder = Path(where).expanduser()
        if not folder.is_dir():
            raise MissingFileError(f"{name}: {folder} is not a folder")
    else:
        folder = hub_folder(where, name, weights=pretrained)  # no download it will not use
    config = _read_config(folder / CONFIG_NAME, name)
    model_name, args = _model_args(config)
    weights = folder / WEIGHTS_NAME
    if pretrained and not weights.is_file():
        raise MissingFileError(f"{name}: no {WEIGHTS_NAME} in {folder}")
    saved = {**(config.get("pretrained_cfg") or {}), "label_names": config.get("label_names")}
    overlay = {k: saved[k] for k in DATA_KEYS if saved.get(k) is not None}
    for k in ("mean", "std"):  # JSON lists back to timm's tuples
        if isinstance(overlay.get(k), list):
            overlay[k] = tuple(overlay[k])
    num_classes = config.get("num_classes")
    return SavedModel(
        model_name,
        args,
        weights if pretrained else None,
        overlay,
        num_classes if isinstance(num_classes, int) else None,
    )

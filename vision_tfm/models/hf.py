"""Writing the Hugging Face / timm model folder: ``config.json`` + ``model.safetensors``.

This is the layout timm's ``save_for_hf`` writes and ``create_model("local-dir:DIR")`` /
``"hf-hub:org/name"`` read, so a model trained here can be handed to someone who has only
timm, or published on the hub. ``config.json`` holds, as timm expects, the ``architecture``,
``num_classes``, ``model_args`` and ``pretrained_cfg``; and, under ``vision_tfm``, our name
and full config, from which vision_tfm rebuilds any family exactly.

When timm's own class builds the same network (plain ViT and Swin:
:func:`~vision_tfm.models.timm_plugin.timm_equivalent`), ``architecture`` and
``model_args`` name timm's class, and the folder loads in plain timm with no vision_tfm
installed. Otherwise they name our architecture as registered in timm, which needs
``import vision_tfm`` first. The weights are safetensors: loading never unpickles.
Reading a folder back is ``models.folder``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import config_to_dict, plain
from ..errors import OutputExistsError
from ..files import atomic_write, atomic_write_text
from ..version import __version__
from .hub import CONFIG_NAME, WEIGHTS_NAME

_NOT_SAVED = ("architecture", "hf_hub_id", "hf_hub_filename", "url", "file", "source", "tag")


def hub_config(model: nn.Module, pretrained_cfg: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config.json`` for ``model``; ``pretrained_cfg`` entries (the training run's mean,
    std, crop and class names) replace the model's own."""
    from timm.models import PretrainedCfg

    from .timm_plugin import timm_equivalent, timm_name

    fields = {f.name for f in dataclasses.fields(PretrainedCfg)}
    cfg = {**model.pretrained_cfg, **(pretrained_cfg or {})}
    cfg = {k: plain(v) for k, v in cfg.items() if k in fields and k not in _NOT_SAVED}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    ours = {
        "model_name": model.model_name,
        "model_args": config_to_dict(model.cfg),
        "version": __version__,
    }
    native = timm_equivalent(model)
    arch, args = native if native else (timm_name(model.model_name), ours["model_args"])
    out: dict[str, Any] = {
        "architecture": arch,
        "num_classes": int(getattr(model, "num_classes", 0)),
        "num_features": int(model.num_features),
    }
    if getattr(model, "global_pool", ""):
        out["global_pool"] = model.global_pool
    if cfg.get("label_names"):
        out["label_names"] = cfg["label_names"]
    return {**out, "model_args": plain(args), "pretrained_cfg": cfg, "vision_tfm": ours}


FOLDER_ATTRS = ("model_name", "cfg", "pretrained_cfg", "in_chans", "num_features")
"""What a model needs for a folder: the registered name and config that rebuild it, and
timm's data config."""


def folder_unsupported(model: nn.Module) -> str | None:
    """Why ``model`` cannot be written as a folder, or None where it can. A folder rebuilds a
    registered model from its name and config; a wrapper around one (a torchvision detector
    on our backbone, say) has neither, and its checkpoint is what ships."""
    missing = [a for a in FOLDER_ATTRS if not hasattr(model, a)]
    if not missing:
        return None
    return f"a {type(model).__name__} is not a registered model (no {', '.join(missing)})"


def write_folder(
    model: nn.Module,
    directory: str | os.PathLike,
    pretrained_cfg: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors``, each atomically, the config last.

    ``state_dict`` replaces the model's own weights (a run's EMA weights, say). An existing
    folder's files are kept unless ``overwrite``.
    """
    from safetensors.torch import save

    directory = Path(directory)
    files = [directory / WEIGHTS_NAME, directory / CONFIG_NAME]
    existing = [str(f) for f in files if f.exists()]
    if existing and not overwrite:
        raise OutputExistsError(f"{existing[0]} exists; pass overwrite=True to replace it")
    if directory.exists() and not directory.is_dir():
        raise OutputExistsError(f"{directory} is a file; expected a folder for the model")
    directory.mkdir(parents=True, exist_ok=True)
    config = hub_config(model, pretrained_cfg)
    sd = model.state_dict() if state_dict is None else state_dict
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}
    blob = save(tensors, metadata={"format": "pt"})
    atomic_write(lambda f: f.write(blob), files[0], "weights")
    atomic_write_text(json.dumps(config, indent=2) + "\n", files[1])
    return directory


def save_pretrained(
    model: nn.Module, directory: str | os.PathLike, overwrite: bool = False
) -> Path:
    """The model as a Hugging Face / timm folder (see the module docstring)."""
    return write_folder(model, directory, overwrite=overwrite)


def push_to_hub(
    model: nn.Module,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload vision_tfm model",
) -> str:
    """Upload the folder :func:`save_pretrained` writes to hub repo ``repo_id`` with
    ``huggingface_hub``'s API (the repo is created if missing); returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token, library_name="vision_tfm", library_version=__version__)
    repo = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(model, tmp)
        info = api.upload_folder(
            repo_id=repo, folder_path=tmp, revision=revision, commit_message=commit_message
        )
    return str(getattr(info, "commit_url", info))

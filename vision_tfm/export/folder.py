"""``vtfm export --format hf``: a training checkpoint as a Hugging Face / timm model folder.

The folder (``config.json`` + ``model.safetensors``, see ``models.hf``) loads with
``timm.create_model("local-dir:DIR", pretrained=True)``: in plain timm for a ViT or Swin
that timm's own class builds, and after ``import vision_tfm`` for every other model. Its
``pretrained_cfg`` carries the run's input size, normalisation, crop and class names, so
timm's data config evaluates it as ``vtfm predict`` does.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..io import load_checkpoint
from ..models.hf import write_folder
from ..tasks import task_of


def default_folder(checkpoint: str | os.PathLike) -> Path:
    """Where the folder goes when no ``--out`` is given: ``<stem>-hf`` beside the checkpoint."""
    path = Path(checkpoint)
    return path.with_name(f"{path.stem}-hf")


def export_folder(
    checkpoint: str | os.PathLike,
    out: str | os.PathLike | None = None,
    use_ema: bool | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the checkpoint's shipped weights (its EMA when the run tracked one) as a folder.

    Raises:
        MissingFileError, CheckpointError: No such checkpoint, or not one of ours.
        OutputExistsError: The folder already holds a model and ``overwrite`` is off.
    """
    ckpt = load_checkpoint(checkpoint)
    task_cls = task_of(ckpt, str(checkpoint))
    model, cfg = task_cls.restore(ckpt, use_ema=use_ema, source=str(checkpoint))
    hub = task_cls(cfg).hub_cfg(ckpt["meta"], model.in_chans)
    return write_folder(model, out or default_folder(checkpoint), hub, overwrite=overwrite)

"""A checkpoint opened once for export, parity, calibration and benchmarking.

Every step reads the val split and preprocessing the checkpoint was trained with, so an
exported model is judged on the inputs it will see, and every format by the same metric code:
the task's (:class:`vision_tfm.tasks.Task`), which this module asks and never names.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from ..errors import DataError
from ..grasp import ANGLE_THRESHOLD, angle_difference
from ..io import load_checkpoint
from ..models import get_model_entry
from ..tasks import Runner, Task, task_for_model, task_of
from ..tasks.base import TopGrasp, check_path
from ..tasks.config import config_hash
from ..version import __version__

__all__ = [
    "INPUT_NAME",
    "Evaluation",
    "ExportSource",
    "ModelSource",
    "Runner",
    "load_source",
    "max_abs_diff",
    "model_source",
    "same_grasp",
]

INPUT_NAME = "image"


@dataclass
class Evaluation:
    """One runner's outputs over the val batches, and the task metric they score (None on
    unlabelled images)."""

    metric: float | None
    outputs: list[torch.Tensor]  # one per output name, concatenated over the batches
    top_grasps: list[TopGrasp] | None = None  # (x, y, angle) per view, where grasps decode

    def top1_agreement(self, ref: Evaluation) -> float | None:
        """Share of images whose top-1 class matches ``ref``; for grasp maps, whose top grasp
        does (:func:`same_grasp`)."""
        if self.top_grasps is not None and ref.top_grasps is not None:
            pairs = zip(self.top_grasps, ref.top_grasps, strict=True)
            return sum(same_grasp(a, b) for a, b in pairs) / max(len(self.top_grasps), 1)
        if self.outputs[0].ndim != 2:
            return None
        same = self.outputs[0].argmax(1) == ref.outputs[0].argmax(1)
        return same.float().mean().item()


def same_grasp(a: TopGrasp, b: TopGrasp) -> bool:
    """Two top grasps ``(x, y, angle)`` agree on the same peak pixel with angles within the
    rectangle metric's 30 degrees (modulo pi); two views without a grasp agree too."""
    if a is None or b is None:
        return a is b
    return a[:2] == b[:2] and angle_difference(a[2], b[2]) <= ANGLE_THRESHOLD


def max_abs_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """Largest element-wise difference over all outputs: inf on a shape mismatch, NaN if any."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            return math.inf
        diffs.append((x.float() - y.float()).abs().max().item())
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


@dataclass
class ExportSource:
    """The restored eval-mode model of a checkpoint, its task, and what describes its data."""

    path: Path
    model: nn.Module
    task: Task
    meta: dict[str, Any]
    _data: tuple[Dataset, Dataset] | None = field(default=None, repr=False)

    @property
    def cfg(self) -> Any:
        return self.task.cfg

    @property
    def model_name(self) -> str:
        return self.meta["model_name"]

    @property
    def in_chans(self) -> int:
        return int(self.meta["in_chans"])

    @property
    def img_size(self) -> tuple[int, int]:
        s = self.meta["img_size"]
        return (s, s) if isinstance(s, int) else (int(s[0]), int(s[1]))

    @property
    def output_names(self) -> list[str]:
        return list(self.task.output_names)

    @property
    def metric_name(self) -> str | None:
        return self.task.metric

    def torch_runner(self, *, bf16: bool = False, model: nn.Module | None = None) -> Runner:
        """The model (or ``model``, a faster form of it) as a :data:`Runner`, without
        autograd; with ``bf16`` under CPU bf16 autocast (weights stay fp32; matmuls run in
        bf16)."""
        model = self.model if model is None else model

        def run(x: torch.Tensor) -> list[torch.Tensor]:
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
                out = model(x)
                outs = [out[k] for k in self.output_names] if isinstance(out, dict) else [out]
                return [o.float() for o in outs]

        return run

    # --- data ------------------------------------------------------------------------------

    def datasets(self) -> tuple[Dataset, Dataset]:
        """(train, val) with deterministic eval preprocessing; built once, then cached."""
        if self._data is None:
            root = self.task.data_root()
            if root and not Path(root).exists():
                raise DataError(
                    f"{self.path}: its data.root {root} does not exist from here (a relative "
                    "root is read from the current folder); pass --data with the dataset folder"
                )
            self._data = self.task.eval_datasets(self.meta)
        return self._data

    def folder_dataset(self, root: Path, what: str = "images") -> Dataset:
        """Every image under ``root`` with eval preprocessing: a grasp dataset's views
        (cropped as validation crops them), or the images a folder holds."""
        return self.task.folder_dataset(self.meta, root, what)

    def batches(self, split: str, batch_size: int, limit: int = 0) -> list[tuple]:
        """The first ``limit`` (0 = all) items of ``split`` as collated batches held in memory."""
        ds = self.datasets()[0 if split == "train" else 1]
        if 0 < limit < len(ds):
            ds = Subset(ds, range(limit))
        return list(DataLoader(ds, batch_size, shuffle=False, collate_fn=self.task.collate))

    def evaluate(self, runner: Runner, batches: Sequence[tuple]) -> Evaluation:
        """Run every batch through ``runner`` and score it as the task's validation does."""
        hits, n, outs, tops, decoded = 0, 0, [], [], False
        labelled = self.metric_name is not None
        for batch in batches:
            out, h, top = self.task.score(runner, batch, labelled)
            outs.append(out)
            hits, n = hits + h, n + len(batch[0])
            if top is not None:  # a task that decodes a top prediction per image
                tops.extend(top)
                decoded = True
        if n == 0:
            raise DataError(f"{self.path}: the validation split is empty")
        metric = hits / n if labelled else None
        cols = [torch.cat(col) for col in zip(*outs)]
        return Evaluation(metric, cols, tops if decoded else None)

    # --- metadata --------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What a deployment needs besides the weights: names, sizes, normalisation, versions."""
        return {
            "model_name": self.model_name,
            "task": self.task.name,
            "checkpoint": self.path.name,  # the name only: a path would leak the machine
            "config_hash": config_hash(self.cfg),
            "input_name": INPUT_NAME,
            "in_chans": self.in_chans,
            "img_size": list(self.img_size),
            "output_names": self.output_names,
            "versions": {"torch": torch.__version__, "vision_tfm": __version__},
            **self.task.deploy_spec(self.meta, self.img_size),
        }


@dataclass
class ModelSource(ExportSource):
    """A registered model without a training run: random (seeded) or converted weights,
    scored on real images without their labels, so only agreement with fp32 PyTorch can be
    measured."""

    images: Path = Path()

    @property
    def metric_name(self) -> str | None:
        return None

    def datasets(self) -> tuple[Dataset, Dataset]:
        """The image folder (a grasp dataset's every view, for a grasp model), twice: it is
        both the calibration and the agreement set."""
        if self._data is None:
            ds = self.folder_dataset(self.images)
            self._data = (ds, ds)
        return self._data


def model_source(
    name: str, img_size: int, images: str | os.PathLike, weights: str | os.PathLike | None = None
) -> ModelSource:
    """A registered model at ``img_size`` for speed and agreement rows (no accuracy).

    Args:
        name: A registered classifier or grasp model.
        img_size: Input side; ViT's position table and Swin's windows are built for it.
        images: Real images to compare the formats on, with ImageNet statistics; for a grasp
            model, a Cornell or Jacquard folder.
        weights: timm / torchvision / official classifier weights; default: seeded random.

    Raises:
        ConfigError, MissingFileError: An unknown model, weights for a grasp model, missing
            images or weights.
    """
    task_cls = task_for_model(name)  # an unknown name gets the registry's own error
    images = check_path(images, "--data")
    if weights is not None:
        weights = check_path(weights, "--weights")
    torch.manual_seed(0)
    model, cfg, meta = task_cls.from_registered(name, img_size, images, weights)
    meta.update(
        task=task_cls.name,
        model_name=name,
        img_size=img_size,
        weights=weights.name if weights else "random (torch.manual_seed(0))",
    )
    path = weights if weights else Path(f"{name}-random-init")
    model = task_cls.deploy_model(model).eval()
    return ModelSource(path, model, task_cls(cfg), meta, images=images)


def load_source(
    path: str | os.PathLike, use_ema: bool | None = None, data_root: str | None = None
) -> ExportSource:
    """Restore a checkpoint for export, whatever its task.

    ``data_root`` replaces the checkpoint's ``data.root`` (the dataset moved, or training ran
    from another folder); the split and preprocessing stay the checkpoint's.

    Raises:
        MissingFileError: No such checkpoint.
        CheckpointError: Not a checkpoint, an unknown task, or a model this install does not
            know.
    """
    path = Path(path)
    ckpt = load_checkpoint(path)
    task_cls = task_of(ckpt, str(path))
    meta = dict(ckpt["meta"])
    meta["model_name"] = meta.get("model_name") or ckpt["config"].get("model", {}).get("name")
    get_model_entry(str(meta["model_name"]))  # the name the exported files will carry
    model, cfg = task_cls.restore(ckpt, use_ema=use_ema, source=str(path))  # checked on meta
    if data_root is not None:
        check_path(data_root, "--data")
        cfg = replace(cfg, data=replace(cfg.data, root=str(data_root)))
    task = task_cls(cfg)
    meta.setdefault("img_size", task.deploy_img_size())
    return ExportSource(path, task_cls.deploy_model(model).eval(), task, meta)

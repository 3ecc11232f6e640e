"""A checkpoint opened once for export, parity, calibration and benchmarking.

Every step reads the model and its data the same way: the val split and preprocessing the
checkpoint was trained with. An exported model is judged on the inputs it will see, never
on random noise, and every format is scored by the same metric code.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset, default_collate

from ..grasp import MAP_KEYS, batch_grasp_correct
from ..models import get_model_entry
from ..train.checkpoint import load_checkpoint
from ..train.config import config_hash

__all__ = ["INPUT_NAME", "Evaluation", "ExportSource", "Runner", "load_source", "max_abs_diff"]

INPUT_NAME = "image"
TASKS = ("cls", "grasp")

Runner = Callable[[torch.Tensor], Sequence[torch.Tensor]]
"""A model in any format: a float32 NCHW batch in, its outputs in ``output_names`` order out."""


@dataclass
class Evaluation:
    """One runner's outputs over the val batches, and the task metric they score."""

    metric: float
    outputs: list[torch.Tensor]  # one per output name, concatenated over the batches

    def top1_agreement(self, ref: Evaluation) -> float | None:
        """Share of images whose top-1 class matches ``ref`` (None for dense outputs)."""
        if self.outputs[0].ndim != 2:
            return None
        same = self.outputs[0].argmax(1) == ref.outputs[0].argmax(1)
        return same.float().mean().item()


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
    """The restored eval-mode model of a checkpoint plus what describes its inputs and data."""

    path: Path
    model: nn.Module
    cfg: Any  # ClsConfig or GraspConfig
    meta: dict[str, Any]
    _data: tuple[Dataset, Dataset] | None = field(default=None, repr=False)

    @property
    def task(self) -> str:
        return self.meta["task"]

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
        return list(MAP_KEYS) if self.task == "grasp" else ["logits"]

    @property
    def metric_name(self) -> str:
        return "grasp_acc" if self.task == "grasp" else "top1"

    def outputs_of(self, out: torch.Tensor | dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """A model's return value as a list in ``output_names`` order."""
        if isinstance(out, dict):
            return [out[k] for k in self.output_names]
        return [out]

    def torch_runner(self, model: nn.Module | None = None) -> Runner:
        """Run ``model`` (default: the checkpoint's) as a :data:`Runner`, without autograd."""
        model = model or self.model

        def run(x: torch.Tensor) -> list[torch.Tensor]:
            with torch.inference_mode():
                return self.outputs_of(model(x))

        return run

    # --- data ------------------------------------------------------------------------------

    def datasets(self) -> tuple[Dataset, Dataset]:
        """(train, val) with deterministic eval preprocessing; built once, then cached."""
        if self._data is None:
            d = self.cfg.data
            root = d.root if getattr(d, "name", None) != "mnist" else None  # mnist is embedded
            if root and not Path(root).exists():
                raise FileNotFoundError(
                    f"{self.path}: its data.root {root} does not exist from here (a relative "
                    "root is read from the current folder); pass --data with the dataset folder"
                )
            self._data = _grasp_datasets(self.cfg) if self.task == "grasp" else self._cls_data()
        return self._data

    def _cls_data(self) -> tuple[Dataset, Dataset]:
        from ..data import AugConfig, build_cls_datasets
        from ..train.classification import eval_data_config

        # kind="none" with every other augmentation at its default (off) makes the train
        # transform identical to the eval one, which is what calibration wants.
        data = build_cls_datasets(eval_data_config(self.cfg, self.meta), AugConfig(kind="none"))
        return data.train, data.val

    def batches(self, split: str, batch_size: int, limit: int = 0) -> list[tuple]:
        """The first ``limit`` (0 = all) items of ``split`` as collated batches held in memory."""
        ds = self.datasets()[0 if split == "train" else 1]
        if 0 < limit < len(ds):
            ds = Subset(ds, range(limit))
        collate = default_collate
        if self.task == "grasp":
            from ..data.grasp import grasp_collate

            collate = grasp_collate
        return list(DataLoader(ds, batch_size=batch_size, shuffle=False, collate_fn=collate))

    def evaluate(self, runner: Runner, batches: Sequence[tuple]) -> Evaluation:
        """Run every batch through ``runner`` and score it with the checkpoint's metric."""
        hits, n, outs = 0, 0, []
        for batch in batches:
            x = batch[0]
            out = [t.float() for t in runner(x)]
            outs.append(out)
            if self.task == "grasp":
                maps = dict(zip(MAP_KEYS, out))
                hits += sum(batch_grasp_correct(maps, batch[2], top_n=1, **self._decode_kw()))
            else:
                hits += (out[0].argmax(1) == batch[1]).sum().item()
            n += len(x)
        if n == 0:
            raise ValueError(f"{self.path}: the validation split is empty")
        return Evaluation(hits / n, [torch.cat(col) for col in zip(*outs)])

    def _decode_kw(self) -> dict[str, Any]:
        return {
            "width_scale": self.cfg.data.width_scale,
            "min_distance": self.cfg.eval.min_distance,
        }

    # --- metadata --------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What a deployment needs besides the weights: names, sizes, normalisation, versions."""
        import vision_tfm

        m = self.meta
        info: dict[str, Any] = {
            "model_name": self.model_name,
            "task": self.task,
            "checkpoint": os.path.abspath(self.path),
            "config_hash": config_hash(self.cfg),
            "input_name": INPUT_NAME,
            "in_chans": self.in_chans,
            "img_size": list(self.img_size),
            "output_names": self.output_names,
            "versions": {"torch": torch.__version__, "vision_tfm": vision_tfm.__version__},
        }
        if self.task == "cls":
            info.update(mean=m["mean"], std=m["std"], class_names=m["class_names"])
        else:
            from ..data.grasp import DEPTH_CLIP, RGB_MEAN, RGB_STD

            info.update(
                input=m.get("input"),
                mean=RGB_MEAN.tolist(),
                std=RGB_STD.tolist(),
                depth=f"metres minus the view's mean, clipped to +-{DEPTH_CLIP}",
                width_scale=m.get("width_scale"),
                crop_size=m.get("crop_size"),
            )
        info["preprocess"] = self._preprocess()
        return info

    def _preprocess(self) -> dict[str, Any]:
        """The val pipeline step by step, so a runtime without vision_tfm can reproduce it
        (with another resize filter, 1.3% of an ONNX-only Swin-MNIST's predictions changed)."""
        if self.task == "cls":
            d, size = self.cfg.data, self.img_size[0]
            return {
                "channels": "gray: ITU-R 601 luma of RGB"
                if self.in_chans == 1
                else "RGB (gray repeated); alpha dropped",
                "resize_short_side": int(size / d.crop_pct),
                "interpolation": "bicubic (OpenCV INTER_CUBIC)",
                "center_crop": [size, size],
                "normalize": "(pixel / 255 - mean) / std per channel",
                "layout": "NCHW float32",
            }
        from ..data.grasp import DEPTH_CLIP

        d = self.cfg.data
        order = {"rgb": ["R", "G", "B"], "depth": ["D"], "rgbd": ["R", "G", "B", "D"]}
        return {
            "channels": order[d.input],
            "crop": f"a square of crop_size ({d.crop_size or 'the short side'}) px around the "
            "object (training centres it on the annotated grasps; vtfm grasp on the image "
            "centre), clipped to the image",
            "resize": [d.output_size, d.output_size],
            "interpolation": "area when shrinking, else bilinear (OpenCV)",
            "rgb": "(pixel / 255 - mean) / std per channel",
            "depth": "metres; holes (NaN, inf, <= 0) filled by cv2.inpaint (Navier-Stokes, "
            "radius 1) on depth scaled to [0, 1], before the resize; then minus the crop's "
            f"mean, clipped to +-{DEPTH_CLIP}",
            "layout": "NCHW float32",
        }


def _grasp_datasets(cfg: Any) -> tuple[Dataset, Dataset]:
    from ..data.grasp import build_grasp_datasets

    d = cfg.data
    if not d.root:
        raise ValueError("the grasp checkpoint names no data.root, so there is no val set")
    train, val, _ = build_grasp_datasets(
        d.dataset,
        d.root,
        split=d.split,
        train_frac=d.train_frac,
        seed=cfg.run.seed,
        augment=False,
        input=d.input,
        output_size=d.output_size,
        crop_size=d.crop_size or None,
        width_scale=d.width_scale,
    )
    return train, val


def load_source(
    path: str | os.PathLike, use_ema: bool | None = None, data_root: str | None = None
) -> ExportSource:
    """Restore a classification or grasp checkpoint for export.

    ``data_root`` replaces the checkpoint's ``data.root`` (the dataset moved, or training ran
    from another folder); the split and preprocessing stay the checkpoint's.

    Raises:
        FileNotFoundError: No such checkpoint.
        ValueError: Not a checkpoint, an unknown task, or a model this install does not know.
    """
    from ..train.classification import restore_cls_model
    from ..train.grasp import restore_grasp_model

    path = Path(path)
    ckpt = load_checkpoint(path)
    meta = dict(ckpt.get("meta") or {})
    task = meta.get("task")
    if task not in TASKS:
        raise ValueError(
            f"{path}: unknown task {task!r} in the checkpoint; expected one of {TASKS}"
        )
    name = meta.get("model_name") or ckpt["config"].get("model", {}).get("name")
    try:
        get_model_entry(str(name))
    except ValueError as e:
        raise ValueError(f"{path}: checkpoint of an {e}") from None
    meta["model_name"] = name
    restore = restore_cls_model if task == "cls" else restore_grasp_model
    model, cfg = restore(ckpt, use_ema=use_ema, source=str(path))  # shapes checked on meta
    if data_root is not None:
        if not Path(data_root).exists():
            raise FileNotFoundError(f"--data: {data_root} does not exist")
        cfg = replace(cfg, data=replace(cfg.data, root=str(data_root)))
    if task == "grasp":
        meta.setdefault("img_size", cfg.data.output_size)
    return ExportSource(path, model.eval(), cfg, meta)

"""What a task is: the one object the engine, export and the CLI ask about a kind of model.

A task owns its config dataclasses, builds its model and data from a config, restores both
from a checkpoint, computes its loss, evaluates and decodes, and says what a deployment
needs (output names, the preprocessing ``model.json`` records). Shared code never tests a
task's name: it calls the task. Adding one (segmentation, say) is a module in this package
and a :func:`register_task` line.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..config import apply_overrides
from ..errors import CheckpointError, ConfigError, MissingFileError
from ..io import MetaChecks, build_for_weights, check_meta, shipped_weights
from ..models import get_model_entry, list_models

Runner = Callable[[torch.Tensor], Sequence[torch.Tensor]]
"""A model in any format: a float32 NCHW batch in, its outputs in ``output_names`` order out."""

TopGrasp = tuple[float, float, float] | None


class Task:
    """Base of every task; a subclass sets the class attributes and the methods below.

    Attributes:
        name: What checkpoints store as ``meta["task"]``.
        title: What a person calls it ("classification").
        script: The script that trains it.
        metric: The primary validation metric (higher is better).
        output_names: The exported graph's outputs, in order.
        meta_checks: What rebuilding a model reads from ``meta``, checked before it is read.
        config_cls: The task's whole config dataclass.
        scores_at_train_size: Whether scoring needs the trained input size (labels in its
            pixels), so an export at another size cannot be scored.
        table_words: How the benchmark table names the task's outputs and agreement
            (``outputs``, ``views``, ``spread``, and optionally ``agree_head``,
            ``agree_note``); ``spread`` is formatted with the benchmark result.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    script: ClassVar[str]
    metric: ClassVar[str]
    output_names: ClassVar[tuple[str, ...]]
    meta_checks: ClassVar[MetaChecks]
    config_cls: ClassVar[type]
    scores_at_train_size: ClassVar[bool] = False
    table_words: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    @staticmethod
    def accepts(output_maps: tuple[str, ...]) -> bool:
        """Whether a model whose ``output_maps`` are these is one this task trains."""
        raise NotImplementedError

    @classmethod
    def check_model(cls, name: str) -> None:
        """Refuse, where the config enters, a registered model another task trains: its
        outputs would fail later in the loss, far from the setting that caused it."""
        other = task_for_model(name)
        if other is not cls:
            ours = ", ".join(cls.models())
            raise ConfigError(
                f"model.name={name!r} is a {other.title} model, not a {cls.title} model; "
                f"use one of {ours} (or train it with {other.script})"
            )

    @classmethod
    def models(cls) -> list[str]:
        """The registered models this task trains."""
        return [n for n in list_models() if task_for_model(n) is cls]

    # --- what the engine asks ---------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self.cfg.data.batch_size

    @property
    def num_workers(self) -> int:
        """Checked here, where loaders start them, not in the config: a run's config may come
        from a machine with more cores. A thousand workers never finish an epoch."""
        n, most = self.cfg.data.num_workers, 4 * (os.cpu_count() or 1)
        if n > most:
            raise ConfigError(
                f"data.num_workers must be at most {most} (4 per CPU core here), got {n}"
            )
        return n

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        """Model, train and val datasets, and the metadata every checkpoint stores;
        ``pretrained=False``: without the configured starting weights (a resume has its own)."""
        raise NotImplementedError

    @staticmethod
    def collate(batch: list) -> Any:
        """Collate samples into a batch."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        """Forward a training batch; return the mean loss and the number of samples."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        """Validation metrics; counts are summed with ``all_reduce_sum`` under DDP."""
        raise NotImplementedError

    def finish(self, model: nn.Module, loader: DataLoader, run_dir: Path, history: list) -> None:
        """End-of-run artefacts (plots, overlays); called on rank 0 only."""

    def close(self) -> None:
        """Release what the task opened for a run (loaders with persistent workers)."""

    def summary(self, metrics: dict[str, float]) -> str:
        """The last stdout line, e.g. ``val top1: 0.9712``."""
        raise NotImplementedError

    def run_name(self, meta: dict[str, Any]) -> str:
        """What a new run dir is called before its timestamp: the model, by default."""
        return meta["model_name"]

    def run_files(self) -> dict[str, str]:
        """Text files a run dir keeps beside ``config.yaml`` (after :meth:`build`), by name:
        what the config alone cannot reproduce, such as a data split made at build."""
        return {}

    # --- rebuilding a trained model -----------------------------------------------------

    @classmethod
    def build_model(cls, cfg: Any, meta: dict[str, Any], pretrained: bool) -> nn.Module:
        """The model ``cfg`` and a checkpoint's ``meta`` describe."""
        raise NotImplementedError

    @classmethod
    def model_builder(
        cls, ckpt: dict[str, Any], source: str = "checkpoint"
    ) -> tuple[Callable[[], nn.Module], Any]:
        """What rebuilds a checkpoint's model, uncalled so that it can run on the meta device,
        and the checkpoint's config over the defaults. The model is built without its starting
        weights: the checkpoint's replace them, so the rebuild must not read or download them."""
        check_meta(ckpt["meta"], cls.meta_checks, source)
        cfg = apply_overrides(cls.config_cls(), ckpt["config"])
        return lambda: cls.build_model(cfg, ckpt["meta"], False), cfg

    @classmethod
    def restore(
        cls, ckpt: dict[str, Any], use_ema: bool | None = None, source: str = "checkpoint"
    ) -> tuple[nn.Module, Any]:
        """The trained model in eval mode (shapes checked on the meta device first), and its
        config. ``use_ema``: see :func:`vision_tfm.io.shipped_weights`."""
        if ckpt.get("meta", {}).get("task") != cls.name:
            raise CheckpointError(f"{source} is not a {cls.title} checkpoint")
        build, cfg = cls.model_builder(ckpt, source)
        weights = shipped_weights(ckpt, use_ema, source)
        return build_for_weights(build, weights, source).eval(), cfg

    # --- what export asks ---------------------------------------------------------------

    @staticmethod
    def deploy_model(model: nn.Module) -> nn.Module:
        """The module export writes: the graph a runtime without vision_tfm can use as is."""
        return model

    def deploy_img_size(self) -> int:
        """The input side the model was trained at (older checkpoints' meta lacks it)."""
        return self.cfg.data.img_size

    def data_root(self) -> str | None:
        """The dataset folder evaluation reads; None where the data ships with the package."""
        return self.cfg.data.root or None

    def eval_datasets(self, meta: dict[str, Any]) -> tuple[Dataset, Dataset]:
        """(train, val) with deterministic eval preprocessing (calibration and scoring)."""
        raise NotImplementedError

    def folder_dataset(self, meta: dict[str, Any], root: Path, what: str = "images") -> Dataset:
        """Every image under ``root``, preprocessed as validation preprocesses."""
        raise NotImplementedError

    def score(
        self, runner: Runner, batch: tuple, labelled: bool
    ) -> tuple[list[torch.Tensor], int, list[TopGrasp] | None]:
        """A batch through ``runner``: its outputs, how many the metric counts correct
        (0 unlabelled), and each view's top grasp where the task decodes grasps."""
        raise NotImplementedError

    def deploy_spec(self, meta: dict[str, Any], img_size: tuple[int, int]) -> dict[str, Any]:
        """What ``model.json`` records beside the generic fields: normalisation, names and
        the preprocessing contract (its rules: ``docs/deployment.md``)."""
        raise NotImplementedError

    def hub_cfg(self, meta: dict[str, Any], in_chans: int) -> dict[str, Any]:
        """What a saved model folder's ``pretrained_cfg`` says of the run's data, so that
        timm's ``resolve_data_config`` rebuilds its evaluation: input size, normalisation,
        centre crop and class names (``models.hf``)."""
        size = int(meta.get("img_size") or self.deploy_img_size())
        out: dict[str, Any] = {"input_size": (in_chans, size, size)}
        for key in ("mean", "std"):  # a grasp run normalising per view has none to give
            if isinstance(meta.get(key), list):
                out[key] = tuple(float(v) for v in meta[key])
        if isinstance(meta.get("class_names"), list):
            out["label_names"] = [str(n) for n in meta["class_names"]]
        crop = getattr(self.cfg.data, "crop_pct", None)
        if crop is not None:
            out["crop_pct"] = float(crop)
        return out

    # --- k-fold cross-validation (``train_grasp.py --folds``) ---------------------------------

    @property
    def headlines(self) -> dict[str, str]:
        """The metrics a cross-validation reports, each with what its printed line adds."""
        return {self.metric: ""}

    @classmethod
    def fold_config(cls, cfg: Any, folds: int, k: int) -> Any:
        """The config that trains fold ``k`` (0-based) of ``folds``."""
        raise ConfigError(f"--folds: {cls.title} runs have no k-fold splits")

    def fold_record(self, val: Dataset) -> dict[str, Any]:
        """What ``cv.json`` keeps of a fold besides its metrics (its split, its views)."""
        return {}

    def split_label(self) -> str:
        """How the data was split, as every printed figure names it."""
        return ""

    def fold_line(self, row: dict[str, Any], folds: int) -> str:
        shown = ", ".join(f"{m} {row[m]:.4f}" for m in self.headlines)
        return f"fold {row['fold']}/{folds}: {shown} ({row['train_time_s'] / 60:.1f} min)"

    def cv_summary(self, result: dict[str, Any], folds: int) -> str:
        return "\n".join(
            f"{m} ({folds}-fold): {result[m]['mean']:.4f} ± {result[m]['std']:.4f}"
            for m in self.headlines
        )

    @classmethod
    def from_registered(
        cls, name: str, img_size: int, images: Path, weights: Path | None
    ) -> tuple[nn.Module, Any, dict[str, Any]]:
        """A registered model without a run, with a config and meta as a run would store."""
        raise NotImplementedError


TASKS: dict[str, type[Task]] = {}
"""``meta["task"]`` -> the task class."""


def register_task(cls: type[Task]) -> type[Task]:
    """Make ``cls`` known by its ``name`` (a class decorator)."""
    TASKS[cls.name] = cls
    return cls


def get_task(name: str) -> type[Task]:
    """The task called ``name``; an unknown one lists the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(TASKS), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(TASKS)}"
        raise ConfigError(f"unknown task {name!r}; {hint}") from None


def task_of(ckpt: dict[str, Any], source: str = "checkpoint") -> type[Task]:
    """The task that trained ``ckpt``, from its ``meta["task"]``."""
    name = ckpt["meta"].get("task")
    if name not in TASKS:
        raise CheckpointError(f"{source}: meta 'task' is {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]


def task_for_model(name: str) -> type[Task]:
    """The task that trains the registered model ``name``: the one whose outputs it has."""
    maps = tuple(getattr(get_model_entry(name).cls, "output_maps", ()))
    for task in TASKS.values():
        if task.accepts(maps):
            return task
    raise ConfigError(f"model {name!r} outputs {maps or 'logits'}; no task trains that")


def check_path(path: str | Path, what: str) -> Path:
    """``path`` as a Path that exists, else a one-line error naming ``what`` (a flag or key)."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{what}: {path} does not exist")
    return path

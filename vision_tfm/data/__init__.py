"""Classification data: the embedded MNIST default, ImageFolder trees (train/ and val/, or one
flat folder of classes split by ``data.val_split``) and CIFAR-10 pickles.

`build_cls_datasets(cfg, aug)` is the one entry point the training engine needs; each item is
`(float32 CHW tensor, int label)`. The model's `in_chans` should come from `ClsData.in_chans`:
MNIST is 1 channel, CIFAR-10 3, ImageFolder RGB (3) unless `DataConfig.in_chans` forces 1.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset, Subset

from ..config import ConfigError
from .config import (
    AugConfig,
    DataConfig,
    resolve_in_chans,
    resolve_mean_std,
)
from .datasets import (
    MAX_ASPECT_RATIO,
    MAX_IMAGE_PIXELS,
    ArrayDataset,
    ImageFolderDataset,
    infer_dataset_kind,
    is_class_folder,
    load_cifar10,
    load_image,
    open_image,
    read_data_pickle,
    scan_image_folder,
)
from .mnist import MNIST_CLASSES, load_mnist, read_idx
from .transforms import build_eval_transform, build_train_transform, to_in_chans

__all__ = [
    "MAX_ASPECT_RATIO",
    "MAX_IMAGE_PIXELS",
    "AugConfig",
    "ClsData",
    "DataConfig",
    "build_cls_datasets",
    "build_eval_transform",
    "build_train_transform",
    "infer_dataset_kind",
    "load_cifar10",
    "load_image",
    "load_mnist",
    "open_image",
    "read_data_pickle",
    "read_idx",
    "to_in_chans",
]

TRAIN_SUBSET_SEED = 0
HOLDOUT_SEED = 1  # not TRAIN_SUBSET_SEED: a subset must not be the held-out samples
VAL_SPLIT_SEED = 2  # a flat class folder's val share: the same on every run and every seed


@dataclass
class ClsData:
    """Datasets plus the facts the model and `vtfm predict` must agree on."""

    train: Dataset
    val: Dataset
    num_classes: int
    in_chans: int
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    split: dict[str, list[tuple[Path, int]]] | None = None
    """A flat class folder's ``{"train": samples, "val": samples}``, split here (before any
    ``holdout`` or ``train_subset``); ``None`` when the data brought its own split."""


def build_cls_datasets(cfg: DataConfig, aug: AugConfig) -> ClsData:
    """Build augmented train and deterministic val datasets as `cfg` describes.

    Raises:
        ConfigError, DataError: An invalid config value; an unknown layout or malformed data
            files (both ValueErrors).
        MissingFileError: `cfg.root` or a required file/folder under it is missing.
    """
    if cfg.name != "mnist" and not cfg.root:  # a YAML recipe leaves it to --data
        raise ConfigError(f"data.root is required for data.name={cfg.name!r}")
    in_chans = resolve_in_chans(cfg)
    mean, std = resolve_mean_std(cfg)
    train_tf, val_tf = build_train_transform(cfg, aug), build_eval_transform(cfg)
    split = None
    if cfg.name == "imagefolder":
        train_s, val_s, names = scan_image_folder(cfg.root, cfg.val_split, VAL_SPLIT_SEED)
        if is_class_folder(Path(cfg.root)):
            split = {"train": train_s, "val": val_s}
        train: Dataset = ImageFolderDataset(train_s, in_chans, train_tf)
        val: Dataset = ImageFolderDataset(val_s, in_chans, val_tf)
    else:
        if cfg.name == "mnist":
            (tx, ty), (vx, vy), names = load_mnist("train"), load_mnist("val"), list(MNIST_CLASSES)
        else:
            tx, ty, vx, vy, names = load_cifar10(cfg.root)
        train, val = ArrayDataset(tx, ty, train_tf), ArrayDataset(vx, vy, val_tf)
    if cfg.holdout:
        if cfg.holdout >= len(train):
            raise ConfigError(
                f"data.holdout={cfg.holdout} must be below the {len(train)} training samples"
            )
        order = np.random.default_rng(HOLDOUT_SEED).permutation(len(train))
        held = copy.copy(train)  # the same samples, seen as validation sees them
        held.transform = val_tf
        val = Subset(held, np.sort(order[: cfg.holdout]).tolist())
        train = Subset(train, np.sort(order[cfg.holdout :]).tolist())
    if 0 < cfg.train_subset < len(train):
        # Seeded and sorted: ImageFolder samples are grouped by class, so a prefix would not do.
        keep = np.random.default_rng(TRAIN_SUBSET_SEED).permutation(len(train))[: cfg.train_subset]
        train = Subset(train, np.sort(keep).tolist())
    return ClsData(train, val, len(names), in_chans, names, mean, std, split)

"""The grasp Dataset: views -> ``(input, maps, rects)``, and the train/val builder.

One item: load RGB and/or depth, cut a ``crop_size`` square and resize it to ``output_size``
(depth holes filled, mean subtracted, clipped: :mod:`.images`), optionally augment
(:class:`GraspAugment`), then encode the rectangles into ``quality, cos, sin, width`` maps
(:mod:`vision_tfm.grasp.maps`). The crop sits at the image ``"centre"``, as deployment
(:func:`vision_tfm.tasks.grasp.predict_grasps`) sees it, or on the mean of the view's ``"grasps"``
(GG-CNN's Cornell protocol: it uses the labels, so training and the paper figure only).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from vision_tfm.data.datasets import open_image
from vision_tfm.errors import ConfigError, InputIndexError, MissingFileError, UnknownKeyError
from vision_tfm.grasp.maps import MAP_KEYS, WIDTH_SCALE, encode_grasp_maps

from .annotations import (
    GraspDataError,
    GraspView,
    find_cornell_views,
    find_jacquard_views,
)
from .images import (
    GraspAugment,
    crop_box,
    crop_resize,
    crop_to_output,
    load_depth,
    load_rgb,
    to_input,
)
from .splits import fewer_train_views, kfold_splits, split_ids

InputMode = Literal["rgb", "depth", "rgbd"]
IN_CHANS = {"rgb": 3, "depth": 1, "rgbd": 4}  # input tensor channels per mode (depth last)
CropMode = Literal["centre", "grasps"]
CROP_MODES = ("centre", "grasps")

# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


class GraspDataset(Dataset):
    """Views -> ``(input, maps, rects)``; see the module docstring for the pipeline.

    Items:
        input: float32 ``(C, S, S)``, C = 3 (rgb), 1 (depth) or 4 (rgbd, depth last).
        maps: dict ``quality, cos, sin, width`` of float32 ``(1, S, S)`` tensors.
        rects: float32 numpy ``(K, 4, 2)`` ground-truth corners in output pixels, for the metric.
    """

    def __init__(
        self,
        views: Sequence[GraspView],
        *,
        input: InputMode = "rgbd",
        output_size: int = 224,
        crop_size: int | None = None,
        crop: CropMode = "centre",
        normalise: str = "fixed",
        augment: GraspAugment | None = None,
        width_scale: float = WIDTH_SCALE,
        repeat: int = 1,
        cache: bool = False,
    ) -> None:
        """Wrap already-discovered views.

        Args:
            views: Views to serve, in order.
            input: Which channels to feed the model.
            output_size: Side S of the square model input and maps.
            crop_size: Side of the square crop; None means the shorter image side.
            crop: Where the crop sits, ``"centre"`` or ``"grasps"`` (see the module docstring).
            normalise: Input normalisation, ``"fixed"`` or per ``"image"`` (see :func:`to_input`).
            augment: Applied after crop and resize (pass one only for training).
            width_scale: Width-map normaliser; must match decoding.
            repeat: Serve every view this many times per pass (each with its own augmentation),
                so a tiny training set still gives an epoch enough steps.
            cache: Keep every view's decoded crop in memory (small datasets): decoding and
                depth hole filling are most of an item's cost.

        Raises:
            MissingFileError: ``input`` needs depth and a view has no depth file.
        """
        for v in views:  # fail before a run starts, not at the first batch
            if input != "rgb" and v.depth_path is None:
                raise MissingFileError(f"{_depth_name(v)}: missing depth for input={input!r}")
            if crop_size:  # the header's size only
                path = v.rgb_path if input != "depth" else v.depth_path
                with open_image(path) as im:
                    w, h = im.size
                if crop_size > min(w, h):
                    raise GraspDataError(
                        f"{path}: image {w}x{h} is smaller than the {crop_size}x{crop_size} crop"
                    )
        self.views = list(views)
        self.input = input
        self.output_size = output_size
        self.crop_size = crop_size
        self.crop = crop
        self.normalise = normalise
        self.augment = augment
        self.width_scale = width_scale
        self.repeat = repeat
        self.cache: dict[int, tuple] | None = {} if cache else None

    def recropped(self, crop: CropMode) -> GraspDataset:
        """The same views with another crop and no augmentation (e.g. the GG-CNN figure)."""
        opts = {**_options(self), "crop": crop}
        return GraspDataset(self.views, **opts, cache=self.cache is not None)

    @property
    def ids(self) -> list[str]:
        """View ids in item order."""
        return [v.view_id for v in self.views]

    @property
    def in_chans(self) -> int:
        """Channels of the input tensor."""
        return IN_CHANS[self.input]

    def __len__(self) -> int:
        return len(self.views) * self.repeat

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], np.ndarray]:
        if not -len(self) <= index < len(self):
            raise InputIndexError(f"view index {index} out of range for {len(self)} items")
        i = index % len(self.views)
        if self.cache is not None and i in self.cache:
            rgb, depth, rects = self.cache[i]
        else:
            rgb, depth, rects = self._load(self.views[i])
            if self.cache is not None:
                self.cache[i] = (rgb, depth, rects)
        if self.augment is not None:
            rgb, depth, rects = self.augment(rgb, depth, rects)
        S = self.output_size
        maps = encode_grasp_maps(rects, (S, S), width_scale=self.width_scale)
        targets = {k: torch.from_numpy(maps[k][None]) for k in MAP_KEYS}
        return to_input(rgb, depth, self.normalise), targets, rects

    def _load(self, view: GraspView) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        """Decode one view and cut its crop: ``(rgb, depth, rects)`` at the output size."""
        rgb = load_rgb(view.rgb_path) if self.input != "depth" else None
        depth = load_depth(view.depth_path) if self.input != "rgb" else None
        if rgb is not None and depth is not None and rgb.shape[:2] != depth.shape:
            raise GraspDataError(
                f"{view.depth_path}: depth {depth.shape} does not match RGB {rgb.shape[:2]}"
            )
        H, W = (rgb if rgb is not None else depth).shape[:2]  # fit the crop: see __init__
        centre = view.rects.reshape(-1, 2).mean(axis=0) if self.crop == "grasps" else None
        box = crop_box((H, W), self.crop_size or min(H, W), centre)
        S = self.output_size
        rgb, depth = crop_resize(rgb, depth, box, S)
        return rgb, depth, crop_to_output(view.rects, box, S)


def _depth_name(view: GraspView) -> Path:
    """The depth file a view would need (for error messages)."""
    name = view.rgb_path.name
    if name.endswith("_RGB.png"):
        return view.rgb_path.with_name(name[: -len("_RGB.png")] + "_perfect_depth.tiff")
    return view.rgb_path.with_name(name[: -len("r.png")] + "d.tiff")


def _select(views: list[GraspView], ids: Sequence[str] | None) -> list[GraspView]:
    """Keep ``ids`` (in the given order) or all views; unknown ids are an error."""
    if ids is None:
        return views
    by_id = {v.view_id: v for v in views}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise UnknownKeyError(f"unknown view ids: {missing[:5]}")
    return [by_id[i] for i in ids]


class CornellGrasp(GraspDataset):
    """Cornell grasping dataset (positive rectangles only), GG-CNN-style 300-pixel crop."""

    def __init__(
        self,
        root: str | Path,
        *,
        ids: Sequence[str] | None = None,
        crop_size: int = 300,
        **kwargs: Any,
    ) -> None:
        """Views under ``root`` (``root/*/pcdXXXX*`` or ``root/pcdXXXX*``), or the ``ids`` among
        them (e.g. from :func:`split_ids`); ``kwargs`` are :class:`GraspDataset` options."""
        views, self.skipped_rects = find_cornell_views(root)  # one warning per file with skips
        super().__init__(_select(views, ids), crop_size=crop_size, **kwargs)


class JacquardGrasp(GraspDataset):
    """Jacquard dataset (``*_RGB.png``, ``*_perfect_depth.tiff``, ``*_grasps.txt``)."""

    def __init__(
        self,
        root: str | Path,
        *,
        ids: Sequence[str] | None = None,
        crop_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Views anywhere under ``root`` (one folder per object), or the ``ids``
        (``<object>_<view>``) among them; None ``crop_size`` keeps the whole square image."""
        super().__init__(_select(find_jacquard_views(root), ids), crop_size=crop_size, **kwargs)


def grasp_collate(
    batch: Sequence[tuple[torch.Tensor, dict[str, torch.Tensor], np.ndarray]],
) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[np.ndarray]]:
    """Stack inputs and maps; keep the per-view rectangles as a list since K varies.

    Returns:
        ``(inputs (B, C, S, S), {key: (B, 1, S, S)}, [rects (K_i, 4, 2)])``.
    """
    inputs = torch.stack([item[0] for item in batch])
    maps = {k: torch.stack([item[1][k] for item in batch]) for k in MAP_KEYS}
    return inputs, maps, [item[2] for item in batch]


def build_grasp_datasets(
    name: Literal["cornell", "jacquard"],
    root: str | Path,
    *,
    split: Literal["image", "object"] = "image",
    train_frac: float = 0.8,
    seed: int = 0,
    folds: int = 0,
    fold: int = 0,
    train_views: int = 0,
    augment: GraspAugment | bool = True,
    train_crop: CropMode = "centre",
    repeat: int = 1,
    cache: bool = False,
    **kwargs: Any,
) -> tuple[GraspDataset, GraspDataset, str]:
    """Build the train and validation datasets of one split (or one fold of k).

    Validation always crops at the image centre, as deployment does; ``train_crop`` may use
    the labels, since augmentation then moves the objects about anyway.

    Args:
        name: ``"cornell"`` or ``"jacquard"``, with its dataset folder ``root``.
        split, train_frac, seed: As :func:`split_ids` takes them (objects from the views).
        folds: Cross-validation folds (:func:`kfold_splits`); 0 uses ``train_frac`` instead.
        fold: Which fold validates (0-based) when ``folds`` > 0.
        train_views: Train on this many of the split's training views (:func:`fewer_train_views`,
            seeded with ``seed``); 0 keeps them all.
        augment: True for the default :class:`GraspAugment`, False for none, or an instance;
            applied to the training set only.
        train_crop: Crop of the training views (``"centre"`` or ``"grasps"``).
        repeat: Passes over the training views per epoch (see :class:`GraspDataset`).
        cache: Keep decoded crops in memory, both splits (see :class:`GraspDataset`).
        **kwargs: Dataset options (``input``, ``output_size``, ``crop_size``, ``normalise``,
            ``width_scale``); ``crop`` is set per split, not here.

    Returns:
        ``(train, val, split_name)``; print ``split_name`` beside every reported figure.
    """
    classes = {"cornell": CornellGrasp, "jacquard": JacquardGrasp}
    if name not in classes:
        raise ConfigError(f"unknown grasp dataset {name!r}; expected one of {sorted(classes)}")
    cls = classes[name]
    full = cls(root, **kwargs, crop="centre")
    groups = [v.object_id for v in full.views]
    if folds:
        cut = kfold_splits(full.ids, folds, split, seed, groups)[fold]
    else:
        cut = split_ids(full.ids, split, train_frac, seed, groups=groups)
    train_ids, val_ids, how = fewer_train_views(cut, train_views, seed) if train_views else cut
    if augment is True:
        augment = GraspAugment()
    train = GraspDataset(
        _select(full.views, train_ids),
        **{**_options(full), "crop": train_crop},
        augment=augment or None,
        repeat=repeat,
        cache=cache,
    )
    val = GraspDataset(_select(full.views, val_ids), **_options(full), cache=cache)
    return train, val, f"{name} {how}"


def grasp_datasets_from_config(
    d: Any, seed: int, root: str | Path | None = None, **train_options: Any
) -> tuple[GraspDataset, GraspDataset, str]:
    """:func:`build_grasp_datasets` as a run's ``data`` section (``GraspDataConfig``) and ``seed``
    describe it, so training and export read the views alike; ``root`` replaces ``d.root``, and
    ``train_options`` (``augment``, off by default, ``train_crop``, ...) shape the training set."""
    return build_grasp_datasets(
        d.dataset,
        root or d.root,
        train_views=d.train_views,
        **split_options(d, seed),
        **view_options(d),
        **{"augment": False, **train_options},
    )


def split_options(d: Any, seed: int) -> dict[str, Any]:
    """How a run's ``data`` section cuts its views (the split, its seed and the fold)."""
    return {"split": d.split, "train_frac": d.train_frac, "seed": seed, "folds": d.folds,
            "fold": d.fold}  # fmt: skip


def view_options(d: Any) -> dict[str, Any]:
    """How a run's ``data`` section turns a view into the model's input (every loader's)."""
    return {
        "input": d.input,
        "output_size": d.output_size,
        "crop_size": d.crop_size or None,
        "normalise": d.normalise,
        "width_scale": d.width_scale,
    }


def _options(ds: GraspDataset) -> dict[str, Any]:
    """Constructor options of a dataset, to derive subsets without re-reading annotations."""
    return {
        "input": ds.input,
        "output_size": ds.output_size,
        "crop_size": ds.crop_size,
        "crop": ds.crop,
        "normalise": ds.normalise,
        "width_scale": ds.width_scale,
    }

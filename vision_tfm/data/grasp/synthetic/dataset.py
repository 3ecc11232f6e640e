"""Generated views as Cornell files and as a Dataset: ``synthetic:N`` roots, the split, and
:class:`SyntheticGrasp`, which renders each view when first asked for."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vision_tfm.errors import ConfigError
from vision_tfm.files import atomic_write

from ..annotations import GraspView
from ..dataset import (
    GraspDataset,
    _options,
    grasp_datasets_from_config,
    split_options,
    view_options,
)
from ..images import GraspAugment, crop_box, crop_resize, crop_to_output
from ..splits import kfold_splits, split_ids
from .render import generate_labelled
from .scene import SceneSettings, SyntheticView

SYNTHETIC = "synthetic"
DEFAULT_VIEWS = 400


def _rect_lines(rects: np.ndarray) -> str:
    return "".join(f"{x:.2f} {y:.2f}\n" for x, y in rects.reshape(-1, 2))


def save_cornell(view: SyntheticView, folder: str | Path, number: int) -> Path:
    """Write a view as Cornell's ``pcd<number>r.png``, ``d.tiff``, ``cpos.txt``, ``cneg.txt``
    (each file written whole or not at all); returns the RGB path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"pcd{number:04d}"
    rgb = Path(f"{stem}r.png")
    atomic_write(lambda f: Image.fromarray(view.rgb).save(f, format="PNG"), rgb, "file")
    depth = Image.fromarray(view.depth.astype(np.float32), mode="F")
    atomic_write(lambda f: depth.save(f, format="TIFF"), Path(f"{stem}d.tiff"), "file")
    for suffix, rects in (("cpos", view.rects), ("cneg", view.negatives)):
        text = _rect_lines(rects).encode()
        atomic_write(lambda f, t=text: f.write(t), Path(f"{stem}{suffix}.txt"), "file")
    return rgb


MAX_VIEWS = 10_000_000
"""Most views a ``synthetic:N`` root may name: a dataset keeps an id per view (about 100 bytes
each), so the bound is checked before that index is built."""


def parse_root(root: str) -> int:
    """``"synthetic"`` or ``"synthetic:N"`` -> N views (:data:`DEFAULT_VIEWS` when absent)."""
    m = re.fullmatch(rf"{SYNTHETIC}(?::(\d{{1,12}}))?", str(root).strip())
    if m is None or (m.group(1) is not None and not 2 <= int(m.group(1)) <= MAX_VIEWS):
        raise ConfigError(
            f"synthetic data must be 'synthetic' or 'synthetic:N' (2 <= N <= {MAX_VIEWS:,}), "
            f"got {root!r}"
        )
    return int(m.group(1)) if m.group(1) else DEFAULT_VIEWS


def is_synthetic_root(root: str | Path | None) -> bool:
    """Whether a ``--data`` value names generated scenes rather than a folder."""
    return root is not None and re.fullmatch(rf"{SYNTHETIC}(:.*)?", str(root).strip()) is not None


class SyntheticGrasp(GraspDataset):
    """Generated views served like Cornell's: the same crop, maps and rectangles.

    The views exist only as indices; each is rendered when first asked for (and kept with
    ``cache``), so ``len`` costs nothing and a worker renders its own items.
    """

    def __init__(
        self,
        indices: Sequence[int],
        settings: SceneSettings | None = None,
        *,
        crop_size: int | None = 300,
        **kwargs: Any,
    ) -> None:
        """``indices`` of ``settings``' views; ``kwargs`` are :class:`GraspDataset` options."""
        self.settings = settings or SceneSettings()
        super().__init__([], crop_size=crop_size, **kwargs)  # no files to check
        H, W = self.settings.size_hw
        if crop_size and crop_size > min(H, W):
            raise ConfigError(f"synthetic views are {W}x{H}: smaller than the {crop_size} crop")
        self.index = {f"syn{self.settings.seed}_{i:05d}": int(i) for i in indices}
        none = np.zeros((0, 4, 2), np.float32)  # rendered with the view, see _load
        self.views = [
            GraspView(v, v, Path(SYNTHETIC, v), Path(SYNTHETIC, v), none) for v in self.index
        ]

    def subset(self, ids: Sequence[str], **opts: Any) -> SyntheticGrasp:
        """The views ``ids`` with other :class:`GraspDataset` options."""
        merged = {**_options(self), **opts}
        return SyntheticGrasp([self.index[i] for i in ids], self.settings, **merged)

    def recropped(self, crop: str) -> SyntheticGrasp:
        return self.subset(self.ids, crop=crop, cache=self.cache is not None)

    def _load(self, view: GraspView) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        index, side = self.index[view.view_id], self.crop_size or min(self.settings.size_hw)
        if self.crop == "grasps":  # the crop follows the labels: the whole view first
            scene = generate_labelled(index, self.settings)
            centre = scene.rects.reshape(-1, 2).mean(axis=0)
            box = crop_box(scene.rgb.shape[:2], side, centre)
        else:  # the centre crop is known before rendering: draw only it
            scene = generate_labelled(index, self.settings, crop_box(self.settings.size_hw, side))
            box = (0, 0, side)
        rgb = scene.rgb if self.input != "depth" else None
        depth = scene.depth if self.input != "rgb" else None
        S = self.output_size
        rgb, depth = crop_resize(rgb, depth, box, S)
        return rgb, depth, crop_to_output(scene.rects, box, S)


def synthetic_datasets(
    root: str,
    *,
    settings: SceneSettings | None = None,
    split: str = "image",
    train_frac: float = 0.8,
    seed: int = 0,
    folds: int = 0,
    fold: int = 0,
    augment: Any = False,
    train_crop: str = "centre",
    repeat: int = 1,
    cache: bool = False,
    **kwargs: Any,
) -> tuple[SyntheticGrasp, SyntheticGrasp, str]:
    """Train and validation sets of ``root`` = ``synthetic:N`` generated views, cut as
    :func:`~vision_tfm.data.grasp.build_grasp_datasets` cuts a folder (every view is its own
    object, so image- and object-wise agree); arguments as that function takes them."""
    n = parse_root(root)
    full = SyntheticGrasp(range(n), settings, **kwargs, crop="centre", cache=False)
    if folds:
        cut = kfold_splits(full.ids, folds, split, seed)[fold]
    else:
        cut = split_ids(full.ids, split, train_frac, seed)
    if augment is True:
        augment = GraspAugment()
    train = full.subset(cut.train, crop=train_crop)
    train.augment, train.repeat = augment or None, repeat
    train.cache = {} if cache else None
    val = full.subset(cut.val, cache=cache)
    return train, val, f"{SYNTHETIC} {cut.name}"


def datasets_from_config(
    d: Any, seed: int, root: str | Path | None = None, **train_options: Any
) -> tuple[GraspDataset, GraspDataset, str]:
    """:func:`~vision_tfm.data.grasp.grasp_datasets_from_config` that also serves
    ``dataset: synthetic`` (generated views, with ``d.synthetic`` as the generator settings)."""
    if d.dataset != SYNTHETIC:
        return grasp_datasets_from_config(d, seed, root, **train_options)
    return synthetic_datasets(
        str(root or d.root),
        settings=SceneSettings.from_dict(d.synthetic),
        **split_options(d, seed),
        **view_options(d),
        **{"augment": False, **train_options},
    )

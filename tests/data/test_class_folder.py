"""A flat folder of class subfolders: listed by ImageFolder's rules, split per class, seeded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import raises_naming
from PIL import Image

from vision_tfm.config import ConfigError
from vision_tfm.data import AugConfig, DataConfig, build_cls_datasets, infer_dataset_kind
from vision_tfm.data.datasets import scan_image_folder, split_stratified

NO_AUG = AugConfig(kind="none")


def _flat(root: Path, counts: dict[str, int]) -> Path:
    for c, n in counts.items():
        (root / c).mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", (9, 7), (10 * i, 0, 0)).save(root / c / f"{i}.png")
    (root / next(iter(counts)) / "notes.txt").write_text("not an image")
    return root


def test_flat_folder_splits_each_class_by_seed(tmp_path):
    root = _flat(tmp_path / "pets", {"cat": 20, "dog": 10, "eel": 2, "fox": 1})
    assert infer_dataset_kind(root) == "imagefolder"
    train, val, classes = scan_image_folder(root, 0.1, seed=2)
    assert classes == ["cat", "dog", "eel", "fox"]
    # 10% per class, at least one held out where a class has two, none from a singleton
    assert Counter(t for _, t in val) == {0: 2, 1: 1, 2: 1}
    assert Counter(t for _, t in train) == {0: 18, 1: 9, 2: 1, 3: 1}
    paths = [p for p, _ in train + val]
    assert len(set(paths)) == 33 and all(p.suffix == ".png" for p in paths)  # no notes.txt
    assert scan_image_folder(root, 0.1, seed=2) == (train, val, classes)  # the same every run
    assert scan_image_folder(root, 0.1, seed=3)[1] != val  # and the seed is what fixes it
    big = split_stratified([(Path(f"{i}"), i % 2) for i in range(1000)], 0.25, seed=0)[1]
    assert Counter(t for _, t in big) == {0: 125, 1: 125}


def test_flat_folder_datasets_and_errors(tmp_path):
    root = _flat(tmp_path / "pets", {"cat": 5, "dog": 5})
    cfg = DataConfig(name="imagefolder", root=str(root), img_size=8, val_split=0.2)
    data = build_cls_datasets(cfg, NO_AUG)
    assert (len(data.train), len(data.val), data.class_names) == (8, 2, ["cat", "dog"])
    assert data.split is not None and [p for p, _ in data.split["val"]] == [
        p for p, _ in data.val.samples
    ]
    assert data.val[0][0].shape == (3, 8, 8)
    with raises_naming(ConfigError, root, "data.val_split"):  # a flat folder needs a share
        build_cls_datasets(DataConfig(name="imagefolder", root=str(root)), NO_AUG)
    (root / "train").mkdir()  # train/ without val/: neither layout, and the error says so
    with raises_naming(ValueError, root, "val/"):
        infer_dataset_kind(root)


def test_train_val_folders_keep_their_split(tmp_path):
    root = tmp_path / "ds"
    for split in ("train", "val"):
        _flat(root / split, {"a": 3, "b": 2})
    cfg = DataConfig(name="imagefolder", root=str(root), img_size=8, val_split=0.5)
    data = build_cls_datasets(cfg, NO_AUG)  # val_split is for a flat folder only
    assert (len(data.train), len(data.val), data.split) == (5, 5, None)


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_val_split_range(bad):
    with raises_naming(ConfigError, "data.val_split", bad):
        DataConfig(val_split=bad)

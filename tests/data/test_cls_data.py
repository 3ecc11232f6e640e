"""Classification data: embedded MNIST facts, split, transforms, ImageFolder, CIFAR-10, errors."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import raises_naming
from PIL import Image
from torch.utils.data import DataLoader

import vision_tfm.data as data_pkg
from vision_tfm.data import (
    AugConfig,
    DataConfig,
    build_cls_datasets,
    build_eval_transform,
    build_train_transform,
    infer_dataset_kind,
    load_cifar10,
    load_image,
    load_mnist,
    read_idx,
    to_in_chans,
)
from vision_tfm.data.config import IMAGENET_MEAN, MNIST_MEAN, MNIST_STD, resolve_mean_std
from vision_tfm.data.datasets import ArrayDataset
from vision_tfm.data.mnist import mnist_split_indices, parse_idx
from vision_tfm.errors import DataError, MissingFileError
from vision_tfm.tasks import ClsConfig

MNIST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
NO_AUG = AugConfig(kind="none")


# ---------------------------------------------------------------------------- embedded MNIST


def test_mnist_known_facts() -> None:
    images, labels = load_mnist()
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and labels.dtype == np.int64
    assert np.bincount(labels).tolist() == MNIST_COUNTS
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    # White digits on a black background; corners are background.
    assert images[:, 0, 0].max() == 0 and images.max() == 255


def test_mnist_assets_small_and_inside_package() -> None:
    assets = Path(data_pkg.__file__).parent / "assets"
    files = sorted(assets.iterdir())
    assert sum(f.stat().st_size for f in files) < 2 * 1024 * 1024
    assert read_idx(assets / "t10k-labels-idx1-ubyte.gz", expected_magic=2049).shape == (10000,)


def test_mnist_split_sizes_disjoint_deterministic() -> None:
    train_idx, val_idx = mnist_split_indices()
    assert len(train_idx) == 8000 and len(val_idx) == 2000
    assert np.intersect1d(train_idx, val_idx).size == 0
    assert np.array_equal(np.sort(np.concatenate([train_idx, val_idx])), np.arange(10000))
    # Pinned: default_rng(0).permutation(10000) must not drift across numpy versions/platforms.
    assert train_idx[:5].tolist() == [3577, 8925, 1634, 485, 4753]
    assert val_idx[:5].tolist() == [3545, 8124, 8713, 31, 9368]
    assert np.array_equal(mnist_split_indices()[1], val_idx)
    all_x, all_y = load_mnist()
    val_x, val_y = load_mnist("val")
    assert np.array_equal(val_x, all_x[val_idx]) and np.array_equal(val_y, all_y[val_idx])
    with raises_naming(ValueError, "test"):
        load_mnist("test")


def _idx_bytes(magic: int, dims: tuple[int, ...], body: bytes) -> bytes:
    return magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + body


def test_idx_reader_roundtrip_and_errors(tmp_path: Path) -> None:
    good = _idx_bytes(2051, (2, 2, 3), bytes(range(12)))
    arr = parse_idx(good, expected_magic=2051)
    assert arr.shape == (2, 2, 3) and arr.dtype == np.uint8 and arr[1, 1, 2] == 11
    path = tmp_path / "x-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(good))
    assert np.array_equal(read_idx(path), arr)

    with raises_naming(ValueError, 2049, 2051):  # the magic found, the one expected
        parse_idx(_idx_bytes(2049, (3,), b"abc"), expected_magic=2051)
    with raises_naming(ValueError, 0x12340801):
        parse_idx(b"\x12\x34\x08\x01" + (1).to_bytes(4, "big") + b"a")
    with raises_naming(ValueError, (2, 2, 3)):  # the shape the truncated body cannot fill
        parse_idx(good[:-1], expected_magic=2051)
    bad_gz = tmp_path / "bad.gz"
    bad_gz.write_bytes(good)
    with raises_naming(ValueError, bad_gz):
        read_idx(bad_gz)
    with raises_naming(FileNotFoundError, tmp_path / "missing.gz"):
        read_idx(tmp_path / "missing.gz")


# ---------------------------------------------------------------------------- MNIST datasets


def test_build_mnist_default() -> None:
    data = build_cls_datasets(DataConfig(), AugConfig())
    assert (data.num_classes, data.in_chans) == (10, 1)
    assert data.class_names == [str(d) for d in range(10)]
    assert (len(data.train), len(data.val)) == (8000, 2000)
    assert data.mean == MNIST_MEAN and data.std == MNIST_STD
    x, y = data.train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and isinstance(y, int)


def test_eval_transform_is_exact_normalisation_and_deterministic() -> None:
    data = build_cls_datasets(DataConfig(), AugConfig())
    val_x, val_y = load_mnist("val")
    x, y = data.val[3]
    assert y == val_y[3]
    expected = (val_x[3].astype(np.float32) / 255.0 - 0.1307) / 0.3081
    np.testing.assert_allclose(x[0].numpy(), expected, atol=1e-5)
    assert torch.equal(x, data.val[3][0])


def test_train_augmentation_varies_but_keeps_shape() -> None:
    tf = build_train_transform(DataConfig(), AugConfig())
    img = load_mnist("train")[0][0]
    a, b = tf(img), tf(img)
    assert a.shape == (1, 28, 28) and not torch.equal(a, b)


def test_augmentation_reproducible_under_torch_seed() -> None:
    img = load_mnist("train")[0][0]
    outs = []
    for _ in range(2):
        torch.manual_seed(123)
        tf = build_train_transform(DataConfig(), AugConfig(random_erasing=0.5))
        outs.append(torch.stack([tf(img) for _ in range(4)]))
    assert torch.equal(outs[0], outs[1])


def test_loader_workers_and_epochs_draw_different_augmentations() -> None:
    img = load_mnist("train")[0][:1]
    tf = build_train_transform(DataConfig(), AugConfig())
    ds = ArrayDataset(np.repeat(img, 4, axis=0), np.zeros(4), tf)
    loader = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=False)
    epochs = [torch.cat([x for x, _ in loader]) for _ in range(2)]
    # Worker 0 gets items 0-1, worker 1 items 2-3: same image, so only the RNG tells them apart.
    assert not torch.equal(epochs[0][:2], epochs[0][2:])
    assert not torch.equal(epochs[0], epochs[1])


def test_random_erasing_fills_with_mean() -> None:
    tf = build_train_transform(DataConfig(), AugConfig(kind="none", random_erasing=1.0))
    out = tf(load_mnist("train")[0][0])
    # (v/255 - 0.1307)/0.3081 is never exactly 0 for uint8 v, so zeros are the erased hole.
    assert (out == 0).sum() >= 4


def test_rand_augment_optional_and_validated() -> None:
    tf = build_train_transform(DataConfig(), AugConfig(rand_augment="rand-m9-mstd0.5-inc1"))
    assert tf(load_mnist("train")[0][0]).shape == (1, 28, 28)
    with raises_naming(ValueError, "aug.rand_augment", "bogus-m9"):
        build_train_transform(DataConfig(), AugConfig(rand_augment="bogus-m9"))


def test_mnist_forced_rgb_resized_and_subset() -> None:
    cfg = DataConfig(in_chans=3, img_size=32, train_subset=100)
    data = build_cls_datasets(cfg, NO_AUG)
    assert data.in_chans == 3 and data.mean == MNIST_MEAN * 3 and len(data.train) == 100
    x, _ = data.val[0]
    assert x.shape == (3, 32, 32)
    assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])


def test_holdout_validates_on_unaugmented_training_samples_never_trained_on() -> None:
    data = build_cls_datasets(DataConfig(holdout=300), AugConfig())
    assert (len(data.train), len(data.val)) == (7700, 300)
    held, kept = set(data.val.indices), set(data.train.indices)
    assert not held & kept and len(held | kept) == 8000
    train_x, train_y = load_mnist("train")
    i = data.val.indices[5]
    x, y = data.val[5]
    assert y == train_y[i]  # a training sample, under the eval transform (exact, no aug)
    np.testing.assert_allclose(
        x[0].numpy(), (train_x[i].astype(np.float32) / 255.0 - 0.1307) / 0.3081, atol=1e-5
    )
    again = build_cls_datasets(DataConfig(holdout=300, train_subset=1000), AugConfig())
    assert again.val.indices == data.val.indices and len(again.train) == 1000
    subset = {again.train.dataset.indices[j] for j in again.train.indices}  # in the 8000
    assert len(subset) == 1000 and not subset & held  # drawn from what is left
    with raises_naming(ValueError, "data.holdout", 8000):
        build_cls_datasets(DataConfig(holdout=8000), AugConfig())


def test_color_jitter_only_for_rgb() -> None:
    aug = AugConfig(kind="rrc", color_jitter=0.4, hflip=0.5)
    gray = build_train_transform(DataConfig(), aug)
    rgb = build_train_transform(DataConfig(name="cifar10", root="x", img_size=32), aug)
    assert "ColorJitter" not in repr(gray) and "ColorJitter" in repr(rgb)
    assert "HorizontalFlip" in repr(gray) and "RandomResizedCrop" in repr(rgb)


def test_config_errors_name_the_field() -> None:
    with raises_naming(ValueError, "data.name", "svhn"):
        DataConfig(name="svhn")
    with raises_naming(ValueError, "aug.kind", "zoom"):
        AugConfig(kind="zoom")
    with raises_naming(ValueError, "data.root", "imagefolder"):
        build_cls_datasets(DataConfig(name="imagefolder"), NO_AUG)
    with raises_naming(ValueError, "data.in_chans", 2):
        DataConfig(in_chans=2)
    with raises_naming(ValueError, "data.mean", 2, 1):  # 2 values for a 1-channel model
        build_eval_transform(DataConfig(mean=(0.5, 0.5), std=(0.5, 0.5)))
    with raises_naming(ValueError, "data.crop_pct", 1.5):
        DataConfig(crop_pct=1.5)
    # timm's Mixup pairs each image with its mirror: an odd batch failed at the first step
    with raises_naming(ValueError, "data.batch_size", 5):
        ClsConfig(data=DataConfig(batch_size=5), aug=AugConfig(cutmix=1.0))


def test_mean_std_defaults() -> None:
    assert resolve_mean_std(DataConfig(name="imagefolder", root="x"))[0] == IMAGENET_MEAN
    gray_mean = resolve_mean_std(DataConfig(name="imagefolder", root="x", in_chans=1))[0]
    assert gray_mean == (pytest.approx(0.299 * 0.485 + 0.587 * 0.456 + 0.114 * 0.406, abs=1e-4),)
    assert resolve_mean_std(DataConfig(in_chans=3, mean=(0.5,), std=(0.25,))) == (
        (0.5,) * 3,
        (0.25,) * 3,
    )


# ---------------------------------------------------------------------------- eval / predict path


def test_eval_transform_accepts_pil_and_numpy_alike() -> None:
    cfg = DataConfig(name="imagefolder", root="x", img_size=16, crop_pct=0.875)
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    tf = build_eval_transform(cfg)
    a = tf(rgb)
    assert a.shape == (3, 16, 16) and a.dtype == torch.float32
    assert torch.equal(a, tf(Image.fromarray(rgb))) and torch.equal(a, tf(rgb))
    # RGBA drops alpha; gray input is repeated to RGB.
    assert torch.equal(a, tf(np.concatenate([rgb, rgb[:, :, :1]], axis=2)))
    assert tf(rgb[:, :, 0]).shape == (3, 16, 16)


def test_to_in_chans_gray_matches_pil() -> None:
    rgb = np.random.default_rng(2).integers(0, 256, (8, 9, 3), dtype=np.uint8)
    ours = to_in_chans(rgb, 1)[:, :, 0].astype(int)
    pil = np.asarray(Image.fromarray(rgb).convert("L")).astype(int)
    assert ours.shape == (8, 9) and np.abs(ours - pil).max() <= 1
    assert to_in_chans(rgb[:, :, 0], 3).shape == (8, 9, 3)
    with raises_naming(ValueError, "uint8", "float32"):  # the dtype wanted, the one given
        to_in_chans(rgb.astype(np.float32), 3)


# ---------------------------------------------------------------------------- ImageFolder


def _write_image(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (12, 10)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for split, n in (("train", 3), ("val", 1)):
        for cls, color in (("dog", (0, 200, 0)), ("cat", (200, 0, 0))):
            for i in range(n):
                ext = ".JPG" if i == 2 else ".png"
                _write_image(root / split / cls / f"{i}{ext}", color)
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    return root


def test_image_folder_build(image_folder: Path) -> None:
    cfg = DataConfig(name="imagefolder", root=str(image_folder), img_size=8)
    data = build_cls_datasets(cfg, AugConfig(kind="rrc", hflip=0.5, color_jitter=0.3))
    assert data.class_names == ["cat", "dog"] and data.num_classes == 2 and data.in_chans == 3
    assert (len(data.train), len(data.val)) == (6, 2)
    assert sorted(data.train.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    x, y = data.val[0]
    assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and y == 0
    # A solid red "cat": red channel normalised from 200, green/blue from 0.
    expected_r = (200 / 255 - IMAGENET_MEAN[0]) / 0.229
    assert x[0].mean().item() == pytest.approx(expected_r, abs=1e-3)
    assert data.train[5][0].shape == (3, 8, 8)
    gray = build_cls_datasets(
        DataConfig(name="imagefolder", root=str(image_folder), in_chans=1), NO_AUG
    )
    assert gray.in_chans == 1 and gray.val[1][0].shape == (1, 28, 28)
    assert infer_dataset_kind(image_folder) == "imagefolder"


def test_image_folder_errors(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    cfg = DataConfig(name="imagefolder", root=str(root))
    with raises_naming(FileNotFoundError, root):
        build_cls_datasets(cfg, NO_AUG)
    root.mkdir()
    with raises_naming(FileNotFoundError, root / "train"):
        build_cls_datasets(cfg, NO_AUG)
    (root / "train").mkdir()
    with raises_naming(FileNotFoundError, root / "val"):
        build_cls_datasets(cfg, NO_AUG)
    (root / "val").mkdir()
    with raises_naming(ValueError, root / "train"):  # no class subfolders
        build_cls_datasets(cfg, NO_AUG)
    (root / "train" / "a").mkdir()
    (root / "train" / "a" / "readme.txt").write_text("x")
    (root / "val" / "a").mkdir()
    with raises_naming(ValueError, root / "train" / "a"):  # a class folder without images
        build_cls_datasets(cfg, NO_AUG)
    _write_image(root / "train" / "a" / "0.png", (1, 2, 3))
    _write_image(root / "val" / "b" / "0.png", (1, 2, 3))
    with raises_naming(ValueError, root / "val", "'b'"):  # the class train/ lacks
        build_cls_datasets(cfg, NO_AUG)


def test_corrupt_image_raises_with_path_at_load(image_folder: Path) -> None:
    good = image_folder / "train" / "dog" / "0.png"
    bad = image_folder / "train" / "dog" / "1.png"
    bad.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])  # truncated PNG
    data = build_cls_datasets(DataConfig(name="imagefolder", root=str(image_folder)), NO_AUG)
    assert len(data.train) == 6  # listing does not decode, so construction stays fast
    bad_index = [p for p, _ in data.train.samples].index(bad)
    with raises_naming(DataError, bad):
        data.train[bad_index]
    (image_folder / "junk.png").write_text("plain text")
    with raises_naming(DataError, image_folder / "junk.png"):
        load_image(image_folder / "junk.png")
    with raises_naming(FileNotFoundError, image_folder / "nope.png"):
        load_image(image_folder / "nope.png")


def test_load_image_channels(tmp_path: Path) -> None:
    path = tmp_path / "g.png"
    Image.new("L", (5, 4), 77).save(path)
    rgb = load_image(path, 3)
    assert rgb.shape == (4, 5, 3) and rgb.dtype == np.uint8 and (rgb == 77).all()
    assert load_image(path, 1).shape == (4, 5, 1)


def test_load_image_scales_16_bit_gray(tmp_path: Path) -> None:
    """Pillow's convert clips 16-bit gray at 255; it must be scaled (65535 -> 255) instead."""
    ramp = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16  # 0 .. 65520
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    for chans in (1, 3):
        img = load_image(tmp_path / "g16.png", chans)
        assert img.dtype == np.uint8 and img.shape == (64, 64, chans)
        assert np.abs(img[..., 0].astype(int) - np.round(ramp / 257)).max() <= 1
    # 32-bit int (mode I) has no bit depth: 8-bit-range data stays, wider data is scaled
    Image.fromarray((ramp // 257).astype(np.int32)).save(tmp_path / "i8.tiff")
    Image.fromarray(ramp.astype(np.int32)).save(tmp_path / "i16.tiff")
    assert (load_image(tmp_path / "i8.tiff", 1)[..., 0] == ramp // 257).all()
    assert np.abs(load_image(tmp_path / "i16.tiff", 1)[..., 0] - np.round(ramp / 257)).max() <= 1
    Image.fromarray(np.ones((4, 4), np.float32)).save(tmp_path / "f.tiff")
    with raises_naming(ValueError, tmp_path / "f.tiff", "F"):  # the file and its pixel mode
        load_image(tmp_path / "f.tiff", 1)


# ---------------------------------------------------------------------------- CIFAR-10


def _write_cifar(folder: Path, per_batch: int = 2) -> None:
    folder.mkdir(parents=True)
    names = [f"c{i}".encode() for i in range(10)]
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": names, b"num_vis": 3072}, f)
    for k, fname in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        data = np.zeros((per_batch, 3072), np.uint8)
        data[:, :1024], data[:, 1024:2048], data[:, 2048:] = 10 * k, 100, 200  # R, G, B planes
        data[:, 5] = 255  # row 0, column 5 of the red plane
        labels = [(k + j) % 10 for j in range(per_batch)]
        with (folder / fname).open("wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f)


def test_cifar10_reader_decodes_planar_channels(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "cifar-10-batches-py")
    train_x, train_y, val_x, val_y, names = load_cifar10(tmp_path)  # finds the subfolder
    assert train_x.shape == (10, 32, 32, 3) and train_x.dtype == np.uint8
    assert val_x.shape == (2, 32, 32, 3) and train_y.dtype == np.int64
    assert names == [f"c{i}" for i in range(10)]
    assert train_x[2, 1, 1].tolist() == [10, 100, 200]  # batch 2 red plane = 10
    assert train_x[0, 0, 5].tolist() == [255, 100, 200] and val_x[0, 3, 3, 0] == 50
    assert train_y.tolist()[:4] == [0, 1, 1, 2] and val_y.tolist() == [5, 6]
    assert infer_dataset_kind(tmp_path) == "cifar10"

    data = build_cls_datasets(DataConfig(name="cifar10", root=str(tmp_path), img_size=32), NO_AUG)
    assert (data.num_classes, data.in_chans, len(data.train), len(data.val)) == (10, 3, 10, 2)
    assert data.val[0][0].shape == (3, 32, 32)


def test_cifar10_errors(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    _write_cifar(folder)
    (folder / "test_batch").unlink()
    with raises_naming(FileNotFoundError, folder / "test_batch"):
        load_cifar10(folder)
    with (folder / "test_batch").open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, f)
    with raises_naming(DataError, folder / "test_batch", "b'data'", (2, 100)):  # key, shape
        load_cifar10(folder)
    (folder / "test_batch").write_bytes(b"garbage")
    with raises_naming(DataError, folder / "test_batch"):
        load_cifar10(folder)
    with raises_naming(FileNotFoundError, tmp_path, "data_batch_1"):
        load_cifar10(tmp_path)


# ---------------------------------------------------------------------------- --data PATH


def test_infer_dataset_kind_errors(tmp_path: Path) -> None:
    with raises_naming(MissingFileError, tmp_path / "none"):
        infer_dataset_kind(tmp_path / "none")
    (tmp_path / "f.txt").write_text("x")
    with raises_naming(DataError, tmp_path / "f.txt"):
        infer_dataset_kind(tmp_path / "f.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    with raises_naming(ValueError, empty):
        infer_dataset_kind(empty)
    with raises_naming(ValueError, tmp_path):  # neither ImageFolder nor CIFAR-10
        infer_dataset_kind(tmp_path)
    (tmp_path / "train").mkdir()
    with raises_naming(ValueError, tmp_path, "val/"):  # the half that is missing
        infer_dataset_kind(tmp_path)


def test_exact_bicubic_resize_is_opencvs_kernel_in_integers() -> None:
    """The eval resize is stated exactly in model.json; it stays OpenCV's INTER_CUBIC up to
    the one level its float32 SIMD rounding moves, keeps flat images flat, and rounds the
    long side half to even."""
    import cv2

    from vision_tfm.data.transforms import resize_bicubic, resize_short_side

    rng = np.random.default_rng(0)
    for h, w, oh, ow, c in [(37, 50, 64, 23, 3), (9, 7, 32, 40, 1), (120, 90, 33, 33, 3)]:
        img = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        ref = cv2.resize(img, (ow, oh), interpolation=cv2.INTER_CUBIC).reshape(oh, ow, c)
        diff = np.abs(resize_bicubic(img, oh, ow).astype(int) - ref)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.1
    flat = np.full((13, 17, 3), 200, np.uint8)
    assert (resize_bicubic(flat, 40, 9) == 200).all()
    assert resize_short_side(np.zeros((64, 97, 1), np.uint8), 32).shape == (32, 48, 1)

"""Classification datasets: in-memory arrays (MNIST, CIFAR-10) and ImageFolder trees.

Corrupt-image policy (ImageFolder): construction only lists files, which stays fast for
ImageNet-sized trees. A file that cannot be decoded (truncated, not an image) raises a
one-line ValueError naming its path when it is first read. Nothing is skipped silently:
skipping would shift class balance and make epoch lengths lie. Delete or fix the file and
restart.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_VAL_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_SUBDIR = "cifar-10-batches-py"  # what the official tarball extracts to

Transform = Callable[[np.ndarray], torch.Tensor]


class ArrayDataset(Dataset):
    """uint8 images held in memory: indexing costs one transform call, no file I/O."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Transform) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[index]), int(self.labels[index])


class ImageFolderDataset(Dataset):
    """Image files decoded on access; see the module docstring for the corrupt-file policy."""

    def __init__(
        self, samples: list[tuple[Path, int]], in_chans: int, transform: Transform
    ) -> None:
        self.samples = samples
        self.labels = np.asarray([label for _, label in samples], dtype=np.int64)
        self.in_chans = in_chans
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return self.transform(load_image(path, self.in_chans)), label


def load_image(path: str | Path, in_chans: int = 3) -> np.ndarray:
    """Decode an image file to HWC uint8 with `in_chans` (1 or 3) channels.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: The file is truncated, corrupt or not an image; the message names it.
    """
    if in_chans not in (1, 3):
        raise ValueError(f"in_chans={in_chans} is invalid; expected 1 or 3")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    try:
        with Image.open(path) as im:
            # convert() forces the full decode, so truncation surfaces here, not later.
            arr = np.asarray(_as_8bit(im, path).convert("L" if in_chans == 1 else "RGB"))
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot decode image {path}: {e}") from None
    return arr[:, :, None] if in_chans == 1 else arr


def _as_8bit(im: Image.Image, path: Path) -> Image.Image:
    """16-bit gray to 8-bit by scaling; Pillow's own convert would clip everything above 255
    (a 16-bit PNG came out 99.6% white).

    32-bit integer images (mode I, e.g. TIFF) carry no bit depth: values up to 255 are read
    as 8-bit data saved wide, anything larger as 16-bit.
    """
    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.asarray(im, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise ValueError(f"{im.mode} pixels outside 0..65535; expected an 8- or 16-bit image")
        if im.mode == "I" and (not a.size or a.max() <= 255):
            return Image.fromarray(a.astype(np.uint8), "L")
        return Image.fromarray(((a + 128) // 257).astype(np.uint8), "L")  # 65535 -> 255
    if im.mode == "F":
        raise ValueError("32-bit float pixels (mode F) have no fixed range; save as 8 or 16 bit")
    return im


def _check_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: missing, expected {what}")


def _list_class_images(class_dir: Path) -> list[Path]:
    files = sorted(
        p for p in class_dir.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS
    )
    if not files:
        raise ValueError(f"{class_dir}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


def scan_image_folder(
    root: str | Path,
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]], list[str]]:
    """List `<root>/{train,val}/<class>/<image>` files, without decoding them.

    Classes are the sorted subfolder names of train/; val/ may lack a class but may not add
    one, so label indices mean the same in both splits.

    Returns:
        (train samples, val samples, class names), samples as (path, label index).
    """
    root = Path(root)
    _check_dir(root, "a dataset folder with train/ and val/ subfolders")
    train_dir, val_dir = root / "train", root / "val"
    _check_dir(train_dir, "a train/ folder with one subfolder per class")
    _check_dir(val_dir, "a val/ folder with one subfolder per class")
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{train_dir}: no class subfolders, expected train/<class>/<image>")
    index = {name: i for i, name in enumerate(classes)}
    val_classes = sorted(p.name for p in val_dir.iterdir() if p.is_dir())
    if not val_classes:
        raise ValueError(f"{val_dir}: no class subfolders, expected val/<class>/<image>")
    unknown = [c for c in val_classes if c not in index]
    if unknown:
        raise ValueError(f"{val_dir}: classes {unknown} are not in {train_dir}")

    def samples(split_dir: Path, names: list[str]) -> list[tuple[Path, int]]:
        return [(p, index[c]) for c in names for p in _list_class_images(split_dir / c)]

    return samples(train_dir, classes), samples(val_dir, val_classes), classes


def find_cifar10_dir(root: str | Path) -> Path | None:
    """The folder holding `data_batch_1`: `root` itself or its `cifar-10-batches-py/`."""
    root = Path(root)
    for cand in (root, root / CIFAR10_SUBDIR):
        if (cand / CIFAR10_TRAIN_FILES[0]).is_file():
            return cand
    return None


def _read_pickle(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR-10 file not found: {path}")
    try:
        # Pickle can run code: only point data.root at CIFAR files you trust.
        with path.open("rb") as f:
            return pickle.load(f, encoding="bytes")
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not a CIFAR-10 python pickle ({e})") from None


def _read_cifar_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    batch = _read_pickle(path)
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: expected a dict with b'data' and b'labels'")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: b'data' is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    if (
        labels.shape != (len(data),)
        or labels.min(initial=0) < 0
        or labels.max(initial=0) >= num_classes
    ):
        raise ValueError(f"{path}: b'labels' must be {len(data)} ints in 0..{num_classes - 1}")
    # Rows are channel-planar: 1024 R, then 1024 G, then 1024 B, each row-major 32x32.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
    return np.ascontiguousarray(images), labels


def load_cifar10(
    root: str | Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Read the CIFAR-10 "python version" folder (data_batch_1..5, test_batch, batches.meta).

    Returns:
        train images uint8 (N, 32, 32, 3), train labels int64, the same for val (test_batch),
        and the class names from batches.meta.
    """
    folder = find_cifar10_dir(root)
    if folder is None:
        raise FileNotFoundError(f"{root}: no {CIFAR10_TRAIN_FILES[0]} here or in {CIFAR10_SUBDIR}/")
    meta_path = folder / CIFAR10_META_FILE
    meta = _read_pickle(meta_path)
    if not isinstance(meta, dict) or b"label_names" not in meta:
        raise ValueError(f"{meta_path}: expected a dict with b'label_names'")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[b"label_names"]]
    parts = [_read_cifar_batch(folder / f, len(names)) for f in CIFAR10_TRAIN_FILES]
    val_x, val_y = _read_cifar_batch(folder / CIFAR10_VAL_FILE, len(names))
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    return train_x, train_y, val_x, val_y, names


def infer_dataset_kind(root: str | Path) -> str:
    """Map a `--data PATH` folder to a `DataConfig.name`: "imagefolder" or "cifar10"."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"data folder not found: {root}")
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder, expected a dataset folder")
    if not any(root.iterdir()):
        raise ValueError(f"{root}: folder is empty, expected train/ and val/ or CIFAR-10 batches")
    if find_cifar10_dir(root) is not None:
        return "cifar10"
    has_train, has_val = (root / "train").is_dir(), (root / "val").is_dir()
    if has_train and has_val:
        return "imagefolder"
    if has_train or has_val:
        missing = "val/" if has_train else "train/"
        raise ValueError(f"{root}: has {'train/' if has_train else 'val/'} but no {missing}")
    raise ValueError(
        f"{root}: unknown layout, expected train/<class>/ and val/<class>/ (ImageFolder) "
        f"or data_batch_1..5 (CIFAR-10 python)"
    )

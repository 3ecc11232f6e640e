"""Classification datasets: in-memory arrays (MNIST, CIFAR-10) and ImageFolder trees, with
their own train/ and val/ or one flat folder of classes split here.

Corrupt-image policy (ImageFolder): construction only lists files, which stays fast for
ImageNet-sized trees. A file that cannot be decoded (truncated, not an image) raises a
one-line DataError naming its path when it is first read. Nothing is skipped silently:
skipping would shift class balance and make epoch lengths lie. Delete or fix the file and
restart. An image past :data:`MAX_IMAGE_PIXELS` or :data:`MAX_ASPECT_RATIO` is refused from its
header, before any pixel is decoded.

CIFAR-10 pickles are read by a restricted unpickler: plain containers, bytes, str, numbers and
numpy arrays only, so a crafted ``data_batch_1`` cannot run code.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets.folder import make_dataset

from ..errors import ConfigError, DataError, InputError, MissingFileError, UnsafeFileError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_VAL_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_SUBDIR = "cifar-10-batches-py"  # what the official tarball extracts to

MAX_IMAGE_PIXELS = 64_000_000
"""Largest image (width x height) any loader decodes: 8000 x 8000. Larger files are refused
before decoding (Pillow's own limit is a warning at 89 MP and a traceback at 179 MP)."""
MAX_ASPECT_RATIO = 32
"""Largest long-side / short-side ratio: a 1 x 20,000,000 strip passes a pixel limit but
resizing its short side to the model's input would allocate gigabytes."""

Transform = Callable[[np.ndarray], torch.Tensor]


class ArrayDataset(Dataset):
    """uint8 images held in memory: indexing costs one transform call, no file I/O."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Transform) -> None:
        if len(images) != len(labels):
            raise InputError(f"{len(images)} images but {len(labels)} labels")
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
        MissingFileError: The file does not exist (a FileNotFoundError).
        DataError: The file is truncated, corrupt or not an image; the message names it.
    """
    if in_chans not in (1, 3):
        raise ConfigError(f"in_chans={in_chans} is invalid; expected 1 or 3")
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"image file not found: {path}")
    with open_image(path) as im:
        # convert() forces the full decode, so truncation surfaces here, not later.
        arr = np.asarray(_as_8bit(im, path).convert("L" if in_chans == 1 else "RGB"))
    return arr[:, :, None] if in_chans == 1 else arr


def check_image_size(width: int, height: int, path: str | Path) -> None:
    """Refuse sizes past :data:`MAX_IMAGE_PIXELS` / :data:`MAX_ASPECT_RATIO` (or empty)."""
    if width < 1 or height < 1:
        raise DataError(f"{path}: image is {width}x{height}, empty")
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(
            f"{path}: image is {width}x{height} = {width * height:,} pixels, over the "
            f"{MAX_IMAGE_PIXELS:,}-pixel limit (vision_tfm.data.MAX_IMAGE_PIXELS)"
        )
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise DataError(
            f"{path}: image is {width}x{height}, more than {MAX_ASPECT_RATIO}:1 "
            f"(vision_tfm.data.MAX_ASPECT_RATIO)"
        )


@contextlib.contextmanager
def open_image(path: str | Path) -> Iterator[Image.Image]:
    """``Image.open`` that checks the header's size before anything is decoded.

    Decoding errors inside the ``with`` block, as at open, become a one-line
    :class:`~vision_tfm.errors.DataError` naming the file.
    """
    try:
        with Image.open(path) as im:
            check_image_size(*im.size, path)
            yield im
    except DataError:
        raise
    except Image.DecompressionBombError:  # Pillow's own check runs inside open()
        raise DataError(
            f"{path}: image is over the {MAX_IMAGE_PIXELS:,}-pixel limit "
            f"(vision_tfm.data.MAX_IMAGE_PIXELS)"
        ) from None
    except (OSError, SyntaxError, ValueError) as e:
        raise DataError(f"cannot decode image {path}: {e}") from None


def _as_8bit(im: Image.Image, path: Path) -> Image.Image:
    """16-bit gray to 8-bit by scaling; Pillow's own convert would clip everything above 255
    (a 16-bit PNG came out 99.6% white).

    32-bit integer images (mode I, e.g. TIFF) carry no bit depth: values up to 255 are read
    as 8-bit data saved wide, anything larger as 16-bit.
    """
    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.asarray(im, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise DataError(f"{path}: {im.mode} pixels outside 0..65535; expected 8 or 16 bit")
        if im.mode == "I" and (not a.size or a.max() <= 255):
            return Image.fromarray(a.astype(np.uint8), "L")
        return Image.fromarray(((a + 128) // 257).astype(np.uint8), "L")  # 65535 -> 255
    if im.mode == "F":
        raise DataError(f"{path}: 32-bit float pixels (mode F) have no fixed range; use 8/16 bit")
    return im


def _check_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise MissingFileError(f"{path}: missing, expected {what}")


def list_class_folder(
    folder: Path, index: dict[str, int] | None = None
) -> tuple[list[tuple[Path, int]], list[str]]:
    """List ``<folder>/<class>/<image>`` files by torchvision's ImageFolder rules (classes are
    the sorted subfolders, images found below them by extension, case-insensitive), without
    decoding them.

    Args:
        folder: The folder of class subfolders.
        index: Label index per class name (another split's classes); ``None``: this folder's
            own, in sorted order. A class outside ``index`` is an error.

    Returns:
        (samples as (path, label index), this folder's class names).
    """
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if not classes:
        raise DataError(f"{folder}: no class subfolders, expected {folder.name}/<class>/<image>")
    index = index if index is not None else {c: i for i, c in enumerate(classes)}
    unknown = [c for c in classes if c not in index]
    if unknown:
        raise DataError(f"{folder}: classes {unknown} are not in the training classes")
    found = make_dataset(
        folder, {c: index[c] for c in classes}, extensions=IMAGE_EXTENSIONS, allow_empty=True
    )
    have = {t for _, t in found}
    empty = [c for c in classes if index[c] not in have]
    if empty:
        raise DataError(
            f"{folder / empty[0]}: class folder has no images ({', '.join(IMAGE_EXTENSIONS)})"
        )
    return [(Path(p), t) for p, t in found], classes


def is_class_folder(root: Path) -> bool:
    """Whether ``root`` is a flat ``<root>/<class>/<image>`` folder (no train/ or val/)."""
    if (root / "train").exists() or (root / "val").exists():
        return False
    return any(
        p.suffix.lower() in IMAGE_EXTENSIONS for d in root.iterdir() if d.is_dir()
        for p in d.rglob("*")
    )  # fmt: skip


def split_stratified(
    samples: list[tuple[Path, int]], share: float, seed: int
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Hold ``share`` of each class out for validation, by a seeded permutation per class.

    Each class keeps at least one image on either side where it has two, so every class is
    both trained and scored; the order within each side stays the listing's.

    Returns:
        (train samples, val samples).
    """
    labels = np.asarray([t for _, t in samples], dtype=np.int64)
    rng = np.random.default_rng(seed)
    held: list[int] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        k = min(max(int(share * len(idx) + 0.5), 1), len(idx) - 1)
        held += idx[rng.permutation(len(idx))[:k]].tolist()
    val = set(held)
    return (
        [s for i, s in enumerate(samples) if i not in val],
        [s for i, s in enumerate(samples) if i in val],
    )


def scan_image_folder(
    root: str | Path, val_split: float = 0.0, seed: int = 0
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]], list[str]]:
    """List an image folder's files, without decoding them: ``<root>/{train,val}/<class>/``,
    or a flat ``<root>/<class>/`` whose val share ``val_split`` is held out per class
    (:func:`split_stratified` with ``seed``).

    Classes are the sorted subfolder names of train/ (or of the flat root); val/ may lack a
    class but may not add one, so label indices mean the same in both splits.

    Returns:
        (train samples, val samples, class names), samples as (path, label index).
    """
    root = Path(root)
    _check_dir(root, "a dataset folder with train/ and val/ subfolders, or class subfolders")
    if is_class_folder(root):
        if not val_split:
            raise ConfigError(
                f"{root} holds class folders but no val/: set data.val_split (e.g. 0.1) to "
                "hold out that share of each class for validation"
            )
        samples, classes = list_class_folder(root)
        if len(samples) < 2:
            raise DataError(f"{root}: {len(samples)} image, too few to split")
        return (*split_stratified(samples, val_split, seed), classes)
    train_dir, val_dir = root / "train", root / "val"
    _check_dir(train_dir, "a train/ folder with one subfolder per class")
    _check_dir(val_dir, "a val/ folder with one subfolder per class")
    train, classes = list_class_folder(train_dir)
    val, _ = list_class_folder(val_dir, {c: i for i, c in enumerate(classes)})
    return train, val, classes


def find_cifar10_dir(root: str | Path) -> Path | None:
    """The folder holding `data_batch_1`: `root` itself or its `cifar-10-batches-py/`."""
    root = Path(root)
    for cand in (root, root / CIFAR10_SUBDIR):
        if (cand / CIFAR10_TRAIN_FILES[0]).is_file():
            return cand
    return None


# The only globals a CIFAR-10 pickle needs: numpy array reconstruction (numpy 1.x and 2.x
# module paths) and bytes from protocol-2 pickles. Containers, str, bytes and numbers are
# opcodes, not globals.
_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
}
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


class _DataUnpickler(pickle.Unpickler):
    """Loads plain data only; any other global is refused before its module is imported."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file, encoding="bytes")
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        module = _PY2_MODULES.get(module, module)
        if (module, name) not in _PICKLE_GLOBALS:
            raise UnsafeFileError(
                f"{self.path}: refused: the pickle names {module}.{name}, which is not plain "
                f"data (a CIFAR-10 batch holds only dicts, lists, bytes, str, numbers and numpy "
                f"arrays)"
            )
        return super().find_class(module, name)


def read_data_pickle(path: str | Path) -> Any:
    """Read a pickle of plain data (CIFAR-10's format) without running any code from it.

    Raises:
        MissingFileError: No such file (a FileNotFoundError).
        UnsafeFileError: The pickle names a function or class beyond numpy arrays.
        DataError: Anything else that makes it unreadable, naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"CIFAR-10 file not found: {path}")
    try:
        with path.open("rb") as f:
            return _DataUnpickler(f, path).load()
    except UnsafeFileError:
        raise
    except Exception as e:  # untrusted bytes: numpy and pickle fail in many ways
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{path}: not a CIFAR-10 python pickle ({why})") from None


def _int_labels(value: Any, path: Path) -> np.ndarray:
    labels = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if labels is None or labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise DataError(f"{path}: b'labels' must be a list of integers")
    return labels.astype(np.int64)


def _read_cifar_batch(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    batch = read_data_pickle(path)
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{path}: expected a dict with b'data' and b'labels'")
    data = batch[b"data"]
    labels = _int_labels(batch[b"labels"], path)
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != 3 * 32 * 32
    ):
        what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{path}: b'data' is {what}, expected uint8 (N, 3072)")
    if (
        labels.shape != (len(data),)
        or labels.min(initial=0) < 0
        or labels.max(initial=0) >= num_classes
    ):
        raise DataError(f"{path}: b'labels' must be {len(data)} ints in 0..{num_classes - 1}")
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
        raise MissingFileError(f"{root}: no {CIFAR10_TRAIN_FILES[0]} here or in {CIFAR10_SUBDIR}/")
    meta_path = folder / CIFAR10_META_FILE
    meta = read_data_pickle(meta_path)
    names = meta.get(b"label_names") if isinstance(meta, dict) else None
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, (bytes, str)) for n in names)
    ):
        raise DataError(f"{meta_path}: expected a dict with b'label_names', a list of names")
    try:
        names = [n.decode() if isinstance(n, bytes) else n for n in names]
    except UnicodeDecodeError:
        raise DataError(f"{meta_path}: b'label_names' are not UTF-8 text") from None
    parts = [_read_cifar_batch(folder / f, len(names)) for f in CIFAR10_TRAIN_FILES]
    val_x, val_y = _read_cifar_batch(folder / CIFAR10_VAL_FILE, len(names))
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    return train_x, train_y, val_x, val_y, names


def infer_dataset_kind(root: str | Path) -> str:
    """Map a `--data PATH` folder to a `DataConfig.name`: "imagefolder" or "cifar10"."""
    root = Path(root)
    if not root.exists():
        raise MissingFileError(f"data folder not found: {root}")
    if not root.is_dir():
        raise DataError(f"{root}: not a folder, expected a dataset folder")
    if not any(root.iterdir()):
        raise DataError(
            f"{root}: folder is empty, expected train/ and val/, class folders or CIFAR-10"
        )
    if find_cifar10_dir(root) is not None:
        return "cifar10"
    has_train, has_val = (root / "train").is_dir(), (root / "val").is_dir()
    if has_train and has_val:
        return "imagefolder"
    if has_train or has_val:
        missing = "val/" if has_train else "train/"
        raise DataError(f"{root}: has {'train/' if has_train else 'val/'} but no {missing}")
    if is_class_folder(root):
        return "imagefolder"
    raise DataError(
        f"{root}: unknown layout, expected train/<class>/ and val/<class>/ (ImageFolder), "
        f"<class>/ folders of images (with data.val_split) or data_batch_1..5 (CIFAR-10 python)"
    )

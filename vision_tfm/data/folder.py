"""Unlabelled images for scoring and calibration: a user's folder as evaluation sees it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..errors import DataError
from .datasets import (
    IMAGE_EXTENSIONS,
    find_cifar10_dir,
    load_cifar10,
    load_image,
    scan_image_folder,
)
from .mnist import IDX_IMAGES_MAGIC, read_idx


class ImageList(Dataset):
    """Image files or uint8 arrays through a transform, each labelled -1 (no label)."""

    def __init__(self, items: Sequence[Any], in_chans: int, transform: Callable) -> None:
        self.items, self.in_chans, self.transform = items, in_chans, transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        item = self.items[i]
        img = load_image(item, 1 if self.in_chans == 1 else 3) if isinstance(item, Path) else item
        return self.transform(img), -1


def list_images(root: Path, what: str = "images") -> Sequence[Any]:
    """Images (uint8 arrays) or image paths found at ``root``, in a fixed order: MNIST idx,
    CIFAR-10 batches, an ImageFolder root's train split, or every image file below it.

    Raises:
        DataError: There are none.
    """
    if root.is_file():
        if "idx3-ubyte" in root.name:
            return read_idx(root, IDX_IMAGES_MAGIC)
        return [root]
    idx = sorted(root.glob("*idx3-ubyte*"))
    if idx:
        return read_idx(idx[0], IDX_IMAGES_MAGIC)  # (N, H, W) uint8
    if find_cifar10_dir(root) is not None:
        return load_cifar10(root)[0]  # the training batches
    if (root / "train").is_dir():
        return [p for p, _ in scan_image_folder(root)[0]]
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not files:
        raise DataError(
            f"{root}: no {what} (expected image files, an ImageFolder root, CIFAR-10 batches "
            "or MNIST idx files)"
        )
    return files

"""Numbers that more than one floor agrees on, defined once.

The model's ``pretrained_cfg``, the data pipelines and the export contract read the same
normalisation statistics; the grasp head, the map codec and export name the same four maps.
"""

from __future__ import annotations

from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "MAP_KEYS", "MNIST_MEAN", "MNIST_STD"]

IMAGENET_MEAN: tuple[float, ...] = tuple(IMAGENET_DEFAULT_MEAN)
IMAGENET_STD: tuple[float, ...] = tuple(IMAGENET_DEFAULT_STD)
MNIST_MEAN: tuple[float, ...] = (0.1307,)
MNIST_STD: tuple[float, ...] = (0.3081,)

MAP_KEYS: tuple[str, ...] = ("quality", "cos", "sin", "width")
"""The dense grasp maps, in the order of a grasp head's output channels."""

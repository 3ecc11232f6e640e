"""Train/val splits and k folds of grasp views: image-wise (shuffled) or object-wise
(consecutive ids, cut only at object boundaries when objects are known), and the nested
subsets a learning curve takes. Every cut is a pure function of the ids and the seed, so a
fold named in a log is the same views on every machine."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Literal, NamedTuple

import numpy as np

from vision_tfm.errors import ConfigError, DataError


class Split(NamedTuple):
    """Train and validation view ids plus a name to print beside every reported figure."""

    train: list[str]
    val: list[str]
    name: str


def _ordered(
    ids: list[str], split: str, seed: int, groups: Sequence[str] | None
) -> tuple[list[str], list[str] | None, str]:
    """Ids in the order splits cut them, each one's object (object-wise with ``groups`` only),
    and how the cut is named: shuffled with ``seed`` (``"image"``) or sorted (``"object"``)."""
    if split == "image":
        order = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
        return order, None, f"image-wise (shuffled, seed {seed})"
    if split == "object":
        idx = np.argsort(ids, kind="stable")
        group = [groups[i] for i in idx] if groups is not None else None
        return [ids[i] for i in idx], group, "object-wise (consecutive ids)"
    raise ConfigError(f"split must be 'image' or 'object', got {split!r}")


def _object_boundary(cut: int, group: list[str] | None, end: int) -> int:
    """Move a cut forward, up to ``end``, until no object lies on both sides of it."""
    while group is not None and cut < end and group[cut] == group[cut - 1]:
        cut += 1
    return cut


def split_ids(
    ids: Sequence[str],
    split: Literal["image", "object"] = "image",
    train_frac: float = 0.8,
    seed: int = 0,
    groups: Sequence[str] | None = None,
) -> Split:
    """Split view ids into train and validation sets.

    ``"image"`` shuffles the views with ``seed``; ``"object"`` takes consecutive sorted ids, which
    is roughly object-wise on Cornell (an object fills several consecutive views). When ``groups``
    (one object id per view) is given, the object cut moves forward to the next object boundary
    so no object straddles the two sets.

    Returns:
        ``Split(train, val, name)``, e.g. 56/14 ids for 70 views at 0.8.
    """
    ids = list(ids)
    if len(ids) < 2:
        raise DataError(f"need at least 2 views to split, got {len(ids)}")
    if not 0 < train_frac < 1:
        raise ConfigError(f"train_frac must be in (0, 1), got {train_frac}")
    order, group, how = _ordered(ids, split, seed, groups)
    n_train = min(max(round(train_frac * len(ids)), 1), len(ids) - 1)
    n_train = _object_boundary(n_train, group, len(ids) - 1)
    train, val = sorted(order[:n_train]), sorted(order[n_train:])
    return Split(train, val, f"{how} {len(train)} train / {len(val)} val")


def kfold_splits(
    ids: Sequence[str],
    folds: int,
    split: Literal["image", "object"] = "image",
    seed: int = 0,
    groups: Sequence[str] | None = None,
) -> list[Split]:
    """Cut the views into ``folds`` disjoint validation sets that together cover every view.

    ``split``, ``seed`` and ``groups`` work as in :func:`split_ids`, so object-wise folds hold
    consecutive ids and, with ``groups``, no object is in two folds.

    Returns:
        One ``Split(train, val, name)`` per fold; fold ``i`` validates on block ``i``.
    """
    ids = list(ids)
    if folds < 2 or folds > len(ids):
        raise ConfigError(f"folds must be in [2, {len(ids)}] for {len(ids)} views, got {folds}")
    order, group, how = _ordered(ids, split, seed, groups)
    cuts = [0]
    for i in range(1, folds):
        cut = max(round(i * len(ids) / folds), cuts[-1] + 1)
        cuts.append(_object_boundary(cut, group, len(ids)))
    cuts.append(len(ids))
    if any(b <= a for a, b in pairwise(cuts)):
        raise ConfigError(f"{len(set(group or ids))} objects cannot fill {folds} object-wise folds")
    out = []
    for k in range(folds):
        val = sorted(order[cuts[k] : cuts[k + 1]])
        train = sorted(order[: cuts[k]] + order[cuts[k + 1] :])
        name = f"{how} fold {k + 1}/{folds}: {len(train)} train / {len(val)} val"
        out.append(Split(train, val, name))
    return out


def fewer_train_views(split: Split, n: int, seed: int = 0) -> Split:
    """Keep ``n`` of a split's training views, for a learning curve; validation is untouched.

    The views kept are the first ``n`` of one seeded order of the training ids, so a smaller
    ``n`` keeps a subset of what a larger one keeps: along the curve views are added, never
    swapped, and a step in the figure is the views added, not a new draw.
    """
    if not 1 <= n <= len(split.train):
        raise ConfigError(
            f"train_views must be in [1, {len(split.train)}] (the split's training views), got {n}"
        )
    if n == len(split.train):
        return split
    order = np.random.default_rng(seed).permutation(len(split.train))
    train = sorted(split.train[i] for i in order[:n])
    name = split.name.replace(f"{len(split.train)} train", f"{n} of {len(split.train)} train", 1)
    return Split(train, split.val, name)

"""A Cornell folder holding only the training views of one k-fold fold, for recipe search.

Choosing a recipe by its score on the folds that are then reported would tune on the test
views. This script links the training views of one fold (``kfold_splits``, the split
``train_grasp.py --folds`` uses) into a new folder; ``train_grasp.py`` on that folder with
``data.folds``/``data.fold`` then trains and validates inside those views only, and the
fold's own validation views stay unseen until the final run.

    python benchmarks/grasp_nested_split.py --data ../shared/data/cornell --fold 0 \
        --out runs/inner/cornell_f0train
    python train_grasp.py --data runs/inner/cornell_f0train --model grasp_hybrid_t \
        data.folds=4 data.fold=0
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vision_tfm.data.grasp import find_cornell_views, kfold_splits


def link_fold_train_views(
    root: Path, out: Path, folds: int, fold: int, split: str = "image", seed: int = 0
) -> list[str]:
    """Symlink every file of the fold's training views into ``out/01``; returns their ids."""
    views, _ = find_cornell_views(root)
    groups = [v.object_id for v in views]
    train, _, _ = kfold_splits([v.view_id for v in views], folds, split, seed, groups)[fold]
    dest = out / "01"
    if dest.exists():
        raise FileExistsError(f"{dest} exists; pick a new --out")
    dest.mkdir(parents=True)
    keep = set(train)
    for v in views:
        if v.view_id in keep:
            for f in v.rgb_path.parent.glob(f"{v.view_id}*"):  # r.png, d.tiff, cpos/cneg.txt
                os.symlink(f.resolve(), dest / f.name)
    return sorted(keep)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="Cornell root")
    p.add_argument("--out", type=Path, required=True, help="new folder for the linked views")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--fold", type=int, default=0, help="0-based, as data.fold")
    p.add_argument("--split", choices=["image", "object"], default="image")
    p.add_argument("--seed", type=int, default=0, help="run.seed of the reporting run")
    a = p.parse_args()
    ids = link_fold_train_views(a.data, a.out, a.folds, a.fold, a.split, a.seed)
    print(f"{len(ids)} training views of fold {a.fold + 1}/{a.folds} linked into {a.out / '01'}")


if __name__ == "__main__":
    main()

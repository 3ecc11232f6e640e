"""Why a grasp checkpoint misses the views it misses: angle, overlap, opening or place.

The rectangle metric is pass/fail. A recipe change should address the way the top grasp
fails: the wrong angle, the wrong opening at the right spot (overlap just under 0.25), or
the wrong spot. For every val view a checkpoint gets wrong (deployment crop, the run's
decoding, the shipped weights), this prints the top grasp against the ground truth, then a
tally over all checkpoints given.

    python benchmarks/grasp_failures.py runs/inner/s160_k*/*/last.pt --data runs/inner/f0

Run it on inner (nested) folds when choosing a change, never on the folds being reported.

``--all-views`` scores every view of ``--data`` instead of the run's val split: on a fold's
training folder (``grasp_nested_split.py``) it says how well the model fits the views it
learned from. ``--width-fit`` adds, over every ground-truth rectangle, the opening the model
reads at the rectangle's centre against the true one, by opening size.

    python benchmarks/grasp_failures.py runs/grasp/<fold1>/last.pt --data runs/inner/f0 \
        --all-views --width-fit
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
from collections import Counter

import numpy as np
import torch

from vision_tfm.export.source import load_source
from vision_tfm.grasp import (
    ANGLE_THRESHOLD,
    IOU_THRESHOLD,
    MAP_KEYS,
    angle_difference,
    as_grasps,
    decode_grasps,
    grasp_correct,
    split_maps,
)

OPENING_OFF = 1.4  # an opening this many times too large (or small) counts as wrong
OPENING_BINS = (0, 12, 20, 30, 45, math.inf)  # ground-truth opening, map pixels


def failures(
    checkpoint: str, data: str | None, all_views: bool = False
) -> tuple[int, list[dict], list[tuple[float, float]]]:
    """(views scored, one dict per failed view, (true, read) opening per ground-truth
    rectangle) for one checkpoint on its val split, or on every view of ``data``."""
    src = load_source(checkpoint, data_root=data)
    if all_views:  # one view trains, the rest validate: the split's floor on train_frac
        d = dataclasses.replace(src.cfg.data, folds=0, train_frac=1e-9)
        src.cfg = dataclasses.replace(src.cfg, data=d)
    val = src.datasets()[1]
    kw = src.cfg.eval.decode_kwargs(src.cfg.data.width_scale)
    out, openings = [], []
    for i in range(len(val)):
        x, _, rects = val[i]
        with torch.no_grad():
            maps = split_maps(src.model(x[None]))
        width = maps["width"][0, 0].numpy() * src.cfg.data.width_scale
        for g in as_grasps(rects):
            r, c = round(g.y), round(g.x)
            if 0 <= r < width.shape[0] and 0 <= c < width.shape[1]:
                openings.append((g.opening, float(width[r, c])))
        preds = decode_grasps(*(maps[k][0, 0] for k in MAP_KEYS), num_grasps=1, **kw)
        if grasp_correct(preds, rects):
            continue
        view = val.views[i].view_id
        if not preds:
            out.append({"view": view, "kind": "no grasp"})
            continue
        p, gts = preds[0], as_grasps(rects)
        best = max(gts, key=p.iou)  # the rectangle it overlaps most
        near = min(gts, key=lambda g: math.hypot(g.x - p.x, g.y - p.y))
        angle = angle_difference(p.angle, best.angle)
        ratio = p.opening / max(near.opening, 1e-6)
        if p.iou(best) <= 0.0:
            kind = "wrong place"
        elif angle > ANGLE_THRESHOLD:
            kind = "wrong angle"
        elif ratio > OPENING_OFF or ratio < 1 / OPENING_OFF:
            kind = "wrong opening"
        else:
            kind = "overlap short"
        out.append(
            {
                "view": view,
                "kind": kind,
                "iou": p.iou(best),
                "angle_deg": math.degrees(angle),
                "opening_ratio": ratio,
                "dist_px": math.hypot(near.x - p.x, near.y - p.y),
                "quality": p.quality,
            }
        )
    return len(val), out, openings


def print_width_fit(openings: list[tuple[float, float]]) -> None:
    """Read / true opening per size bin: where the width map regresses to the mean."""
    a = np.array(openings).reshape(-1, 2)
    print("\n| true opening (map px) | rectangles | median read / true | within 1.4x |")
    print("|---|---|---|---|")
    for lo, hi in itertools.pairwise(OPENING_BINS):
        sel = a[(a[:, 0] >= lo) & (a[:, 0] < hi)]
        if len(sel):
            r = sel[:, 1] / sel[:, 0]
            ok = np.mean((r < OPENING_OFF) & (r > 1 / OPENING_OFF))
            print(f"| {lo:g}-{hi:g} | {len(sel)} | {np.median(r):.2f} | {ok:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", nargs="+", help="grasp run checkpoints (last.pt / best.pt)")
    p.add_argument("--data", help="dataset folder, if not the runs' data.root")
    p.add_argument("--all-views", action="store_true", help="every view of --data, not val")
    p.add_argument("--width-fit", action="store_true", help="read / true opening by size")
    args = p.parse_args()
    torch.set_num_threads(1)
    tally: Counter[str] = Counter()
    scored = 0
    openings: list[tuple[float, float]] = []
    for ckpt in args.checkpoints:
        n, failed, read = failures(ckpt, args.data, args.all_views)
        scored += n
        openings += read
        print(f"{ckpt}: {n - len(failed)} / {n} correct")
        for f in failed:
            tally[f["kind"]] += 1
            if f["kind"] == "no grasp":
                print(f"  {f['view']}: no grasp above the threshold")
                continue
            print(
                f"  {f['view']}: {f['kind']:13s} IoU {f['iou']:.2f} (needs > {IOU_THRESHOLD}), "
                f"angle {f['angle_deg']:.0f} deg, opening x{f['opening_ratio']:.2f} of the "
                f"nearest rectangle's, {f['dist_px']:.1f} px from its centre, q {f['quality']:.2f}"
            )
    print(
        f"{sum(tally.values())} failures in {scored} views: "
        + ", ".join(f"{k} {v}" for k, v in tally.most_common())
    )
    if args.width_fit:
        print_width_fit(openings)


if __name__ == "__main__":
    main()

"""Why a grasp checkpoint misses the views it misses: angle, overlap, opening or place.

The rectangle metric is pass/fail. A recipe change should address the way the top grasp
fails: the wrong angle, the wrong opening at the right spot (overlap just under 0.25), or
the wrong spot. For every val view a checkpoint gets wrong (deployment crop, the run's
decoding, the shipped weights), this prints the top grasp against the ground truth, then a
tally over all checkpoints given.

    python benchmarks/grasp_failures.py runs/inner/s160_k*/*/last.pt --data runs/inner/f0

Run it on inner (nested) folds when choosing a change, never on the folds being reported.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

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


def failures(checkpoint: str, data: str | None) -> tuple[int, list[dict]]:
    """(views scored, one dict per failed view) for one checkpoint on its val split."""
    src = load_source(checkpoint, data_root=data)
    val = src.datasets()[1]
    kw = src.cfg.eval.decode_kwargs(src.cfg.data.width_scale)
    out = []
    for i in range(len(val)):
        x, _, rects = val[i]
        with torch.no_grad():
            maps = split_maps(src.model(x[None]))
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
    return len(val), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", nargs="+", help="grasp run checkpoints (last.pt / best.pt)")
    p.add_argument("--data", help="dataset folder, if not the runs' data.root")
    args = p.parse_args()
    torch.set_num_threads(1)
    tally: Counter[str] = Counter()
    scored = 0
    for ckpt in args.checkpoints:
        n, failed = failures(ckpt, args.data)
        scored += n
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


if __name__ == "__main__":
    main()

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
learned from; for a model pre-trained on generated scenes, it gives the zero-shot figure.
``--width-fit`` adds, over every ground-truth rectangle, the opening the model reads at the
rectangle's centre against the true one, by opening size.

    python benchmarks/grasp_failures.py runs/grasp/<fold1>/last.pt --data runs/inner/f0 \
        --all-views --width-fit

Over several runs, ``--per-view`` says whether the misses are the same views whatever the
recipe (a view most runs miss is a limit of the data, not of one recipe), and
``--ensemble`` scores the map-averaged ensemble of the runs that share a validation split
(quality, angle and width maps averaged after their activations, then decoded as usual):

    python benchmarks/grasp_failures.py runs/inner/{a,b,c}_k*/*/last.pt --data runs/inner/f0 \
        --per-view --ensemble
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
from vision_tfm.tasks.grasp import display_image, draw_overlay
from vision_tfm.tasks.grasp.task import grasp_all_views
from vision_tfm.viz import pyplot

OPENING_OFF = 1.4  # an opening this many times too large (or small) counts as wrong
OPENING_BINS = (0, 12, 20, 30, 45, math.inf)  # ground-truth opening, map pixels


@dataclasses.dataclass
class Scored:
    """One checkpoint on every view it scores: its activated maps, its top grasp (decoded
    once, as the run decodes) and whether that grasp is right."""

    checkpoint: str
    views: list[str]
    maps: list[torch.Tensor]  # per view (1, 4, H, W), MAP_KEYS order, after the activations
    rects: list[np.ndarray]  # per view (K, 4, 2) ground truth, map pixels
    decode: dict
    width_scale: float
    top: list[list] = dataclasses.field(default_factory=list)  # per view, at most one grasp
    right: list[bool] = dataclasses.field(default_factory=list)  # per view, rectangle metric
    images: list[np.ndarray] = dataclasses.field(default_factory=list)  # per view, as shown


def score(checkpoint: str, data: str | None, all_views: bool = False) -> Scored:
    """Run one checkpoint on its val split, or on every view of ``data``, as it is deployed:
    the preprocessing its config names, in fp32. (A run validates under its own precision,
    bf16 autocast on a CPU with native bf16, so a view near the metric's thresholds can score
    differently in its log.)"""
    if all_views:  # every view, in the folder's own layout (generated scenes -> Cornell)
        src = load_source(checkpoint)
        val = grasp_all_views(src.cfg, data or src.task.data_root())
    else:
        src = load_source(checkpoint, data_root=data)
        val = src.datasets()[1]
    scored = Scored(
        checkpoint=checkpoint,
        views=[],
        maps=[],
        rects=[],
        decode=src.cfg.eval.decode_kwargs(src.cfg.data.width_scale),
        width_scale=src.cfg.data.width_scale,
    )
    for i in range(len(val)):
        x, _, rects = val[i]
        with torch.no_grad():
            scored.maps.append(src.model(x[None]))
        scored.views.append(val.views[i].view_id)
        scored.rects.append(rects)
        scored.top.append(top_grasps(scored.maps[-1], scored.decode))
        scored.right.append(grasp_correct(scored.top[-1], rects))
        scored.images.append(display_image(x, src.cfg.data.input, src.cfg.data.normalise))
    return scored


def picture(runs: list[Scored], views: list[str], path: str, cols: int = 4) -> None:
    """The ``views`` as the model saw them (the deployment crop), each with its labelled
    rectangles and the top grasp of the first run that scored it: what a miss looks like."""
    plt = pyplot()
    where = {}
    for scored in runs:
        for i, view in enumerate(scored.views):
            where.setdefault(view, (scored, i))
    views = [v for v in views if v in where]
    if not views:
        return
    rows = math.ceil(len(views) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3.2 * rows), squeeze=False)
    handles = []
    for ax, view in itertools.zip_longest(axes.flat, views):
        if view is None:
            ax.axis("off")
            continue
        scored, i = where[view]
        handles = draw_overlay(ax, scored.images[i], scored.top[i], scored.rects[i])
        ax.set_title(f"{view}: {'right' if scored.right[i] else 'miss'}", fontsize=9)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def top_grasps(maps: torch.Tensor, decode: dict) -> list:
    """The top grasp of one view's stacked maps, decoded as the run decodes (post-filters)."""
    m = split_maps(maps)
    return decode_grasps(*(m[k][0, 0] for k in MAP_KEYS), num_grasps=1, **decode)


def failures(scored: Scored) -> list[dict]:
    """One dict per view the checkpoint gets wrong: how its top grasp misses."""
    out = []
    for view, preds, rects, ok in zip(scored.views, scored.top, scored.rects, scored.right):
        if ok:
            continue
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
    return out


def openings(scored: Scored) -> list[tuple[float, float]]:
    """(true, read) opening at the centre of every ground-truth rectangle, map pixels."""
    out = []
    for m, rects in zip(scored.maps, scored.rects):
        width = split_maps(m)["width"][0, 0].numpy() * scored.width_scale
        for g in as_grasps(rects):
            r, c = round(g.y), round(g.x)
            if 0 <= r < width.shape[0] and 0 <= c < width.shape[1]:
                out.append((g.opening, float(width[r, c])))
    return out


def print_per_view(runs: list[Scored]) -> None:
    """How many of the runs that score each view get it right: the views most runs miss."""
    right: dict[str, list[bool]] = {}
    for scored in runs:
        for view, ok in zip(scored.views, scored.right):
            right.setdefault(view, []).append(ok)
    print("\n| view | runs right |\n|---|---|")
    for view, oks in sorted(right.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0])):
        if not all(oks):
            print(f"| {view} | {sum(oks)} / {len(oks)} |")
    tally = Counter(sum(oks) for oks in right.values())
    print(
        f"{len(right)} views; by the number of runs right: "
        + ", ".join(f"{k}: {tally[k]}" for k in sorted(tally))
    )


def print_ensembles(runs: list[Scored]) -> None:
    """Score the map-averaged ensemble of the runs that share a validation split (same
    views in the same order) and a map size, split by split, against the runs alone. Each
    ensemble decodes with its first run's settings."""
    splits: dict[tuple, list[Scored]] = {}
    for scored in runs:
        key = (tuple(scored.views), tuple(scored.maps[0].shape) if scored.maps else ())
        splits.setdefault(key, []).append(scored)
    together, views, lo, mean, hi = 0, 0, 0, 0.0, 0
    for members in splits.values():
        first = members[0]
        alone = [sum(s.right) for s in members]
        lo, mean, hi = lo + min(alone), mean + sum(alone) / len(alone), hi + max(alone)
        for i, rects in enumerate(first.rects):
            avg = torch.stack([s.maps[i] for s in members]).mean(0)
            together += grasp_correct(top_grasps(avg, first.decode), rects)
        views += len(first.views)
    sizes = sorted(len(m) for m in splits.values())
    print(
        f"\nensembles of {sizes[0]}-{sizes[-1]} runs, {len(splits)} validation splits, "
        f"{views} views: ensemble {together} right; the runs alone {mean:.1f} on average "
        f"(worst per split summed {lo}, best {hi})"
    )


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
    p.add_argument("--per-view", action="store_true", help="how many runs get each view right")
    p.add_argument("--ensemble", action="store_true", help="map-averaged runs per val split")
    p.add_argument("--picture", help="PNG of the missed views (at most 12): labels, top grasp")
    args = p.parse_args()
    torch.set_num_threads(1)
    tally: Counter[str] = Counter()
    runs = [score(ckpt, args.data, args.all_views) for ckpt in args.checkpoints]
    for scored in runs:
        failed = failures(scored)
        print(
            f"{scored.checkpoint}: {len(scored.views) - len(failed)} / {len(scored.views)} correct"
        )
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
        f"{sum(tally.values())} failures in {sum(len(r.views) for r in runs)} views: "
        + ", ".join(f"{k} {v}" for k, v in tally.most_common())
    )
    if args.width_fit:
        print_width_fit([o for scored in runs for o in openings(scored)])
    if args.per_view:
        print_per_view(runs)
    if args.ensemble:
        print_ensembles(runs)
    if args.picture:
        missed = [v for r in runs for v, ok in zip(r.views, r.right) if not ok]
        picture(runs, list(dict.fromkeys(missed))[:12], args.picture)
        print(f"wrote {args.picture}")


if __name__ == "__main__":
    main()

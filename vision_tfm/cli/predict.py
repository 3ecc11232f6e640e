"""``vtfm predict``, ``attention`` and ``grasp``: a trained model on files, folders and globs,
in batches, with one row per image (``--output``) and pictures written whole or not at all."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, MissingFileError, OutputExistsError
from ..grasp.camera import Intrinsics
from ..io import check_writable_dir
from ..models.convert import check_checkpoint_path
from ..tasks.grasp import draw_grasps
from ..tasks.grasp.predict import GraspPredictor, is_view
from ..tasks.predict import (
    Classifier,
    Failed,
    batched,
    check_table_path,
    expand_inputs,
    finite_input,
    write_table,
)
from .flags import add_ema


def _check_count(flag: str, value: int) -> None:
    """A count flag below 1 would print nothing (0) or, sliced from the end, nearly everything."""
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1, got {value}")


def _out_png(out: str, image: Path, overwrite: bool) -> Path:
    """The PNG path ``--out`` names, checked before any work.

    With no extension ``.png`` is added (matplotlib would add it while saving, so the
    existence check and the printed path must see it). A folder is refused, as by
    ``vtfm export``; missing parent folders are created when the file is written.
    """
    given = Path(out)
    path = given if given.suffix else given.with_name(given.name + ".png")
    if path.suffix.lower() != ".png":
        raise ConfigError(f"--out must end in .png, got {out}")
    for p in (given, path):
        if p.is_dir():
            raise ConfigError(f"--out: {p} is a folder; give the .png file path")
    folder = next(p for p in path.absolute().parents if p.exists())
    if not folder.is_dir():
        raise ConfigError(f"--out: cannot create a folder under {folder}: it is a file")
    if path.exists() and path.resolve() == image.resolve():
        raise ConfigError(f"--out: {path} is the input image")
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path} exists; pass --overwrite to replace it")
    return path


def _out_pngs(args: argparse.Namespace, images: list[Path], suffix: str) -> list[Path]:
    """The picture each input gets, all checked before any work: ``--out`` for one input,
    else ``<stem><suffix>`` in ``--out-dir`` or beside the input (never the working folder
    by surprise)."""
    if args.out is not None:
        if len(images) != 1:
            raise ConfigError(f"--out names one PNG; for {len(images)} images pass --out-dir")
        return [_out_png(args.out, images[0], args.overwrite)]
    if args.out_dir is not None and Path(args.out_dir).is_file():
        raise ConfigError(f"--out-dir: {args.out_dir} is a file, not a folder")
    pngs: dict[Path, Path] = {}
    for image in images:
        png = (Path(args.out_dir) if args.out_dir else image.parent) / (image.stem + suffix)
        if png in pngs:
            raise ConfigError(
                f"{pngs[png]} and {image} would both write {png}; run them with different --out-dir"
            )
        pngs[png] = image
    existing = [p for p in pngs if p.exists()]
    if existing and not args.overwrite:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise OutputExistsError(f"{existing[0]} exists{more}; pass --overwrite to replace it")
    for folder in dict.fromkeys(p.parent for p in pngs):
        check_writable_dir(folder, "--out-dir" if args.out_dir else "beside the input (--out-dir)")
    return list(pngs)


def _save_png(save: Callable[[Path], None], path: Path) -> None:
    """``save(tmp)`` beside ``path``, then renamed over it: a picture is whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        save(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {path}")


def _report(failed: list[Failed], total: int) -> None:
    """Exit 1 after the work when any file failed (each was named as it failed)."""
    if failed:
        print(f"not ok: {len(failed)} of {total} images failed (named above)", file=sys.stderr)
        sys.exit(1)


def _each_batch(
    paths: list[Path], load: Callable, batch_size: int, failed: list[Failed]
) -> Iterator[tuple[list[Path], list]]:
    """:func:`batched`, naming each failed file on stderr as it fails."""
    for names, items, fails in batched(paths, load, batch_size):
        for f in fails:
            print(f.line(), file=sys.stderr)
        failed += fails
        if items:
            yield names, items


GRASP_FIELDS = ("x", "y", "angle_deg", "opening", "jaw", "quality")
METRIC_FIELDS = ("x_m", "y_m", "z_m", "yaw_deg", "opening_m")
"""With --intrinsics: the grasp in the camera's optical frame (x right, y down, z forward)."""


def _cls_cells(row: dict) -> list:
    """A predict row as CSV cells: the path, then label and score pairs, best first."""
    return [row["path"]] + [v for t in row["top"] for v in (t["label"], t["score"])]


def _grasp_cells(row: dict, fields: tuple[str, ...] = GRASP_FIELDS) -> list:
    """A grasp row as CSV cells: the paths, then each grasp's fields, best first (a view
    with fewer grasps than --top has a shorter row)."""
    return [row["path"], row["depth"]] + [g[c] for g in row["grasps"] for c in fields]


def cmd_predict(args: argparse.Namespace) -> None:
    """Print (or write with --output) the top-k classes of each image."""
    _check_count("--topk", args.topk)
    _check_count("--batch-size", args.batch_size)
    check_checkpoint_path(args.checkpoint)
    paths = expand_inputs(args.images)
    out = check_table_path(args.output, args.overwrite)
    clf = Classifier(args.checkpoint, args.ema)
    rows: list[dict] = []
    failed: list[Failed] = []
    for names, xs in _each_batch(paths, clf.preprocess, args.batch_size, failed):
        for path, top in zip(names, clf.top(torch.stack(xs), args.topk)):
            rows.append({"path": str(path), "top": [{"label": n, "score": p} for n, p in top]})
            if out is None:
                if len(paths) > 1:
                    print(f"{path}:")
                for name, p in top:
                    print(f"{name:>20s}  {p:.4f}")
    if out is not None:
        k = min(args.topk, len(clf.class_names))
        header = ["path"] + [f"{c}_{i}" for i in range(1, k + 1) for c in ("label", "score")]
        write_table(out, rows, header, _cls_cells)
        print(f"wrote {out}: {len(rows)} image{'' if len(rows) == 1 else 's'}")
    _report(failed, len(paths))


def cmd_attention(args: argparse.Namespace) -> None:
    """Write an attention-rollout heat map over each image."""
    from ..viz import attention_rollout, save_heatmap_overlay

    _check_count("--batch-size", args.batch_size)
    if not 0 <= args.discard_ratio < 1:  # 1 would drop every link
        raise ConfigError(f"--discard-ratio must be in [0, 1), got {args.discard_ratio}")
    check_checkpoint_path(args.checkpoint)
    paths = expand_inputs(args.images)
    pngs = dict(zip(paths, _out_pngs(args, paths, "_attention.png")))
    clf = Classifier(args.checkpoint, args.ema)

    def load(path: Path) -> tuple[np.ndarray, torch.Tensor]:
        img = clf.load(path)
        return img, finite_input(clf.transform(img), path)

    failed: list[Failed] = []
    for names, items in _each_batch(paths, load, args.batch_size, failed):
        x = torch.stack([x for _, x in items])
        heat = attention_rollout(clf.model, x, discard_ratio=args.discard_ratio)
        for path, (img, _), h in zip(names, items, heat):
            _save_png(lambda p: save_heatmap_overlay(img, h, p), pngs[path])  # noqa: B023
    _report(failed, len(paths))


def _grasp_values(predictor: GraspPredictor, view, grasps: list, k) -> list[tuple]:
    """Each grasp's printed fields: pixels (and, with intrinsics ``k``, the camera frame in
    metres; None where no valid depth lies under the grasp)."""
    values = [(g.x, g.y, math.degrees(g.angle), g.opening, g.jaw, g.quality) for g in grasps]
    if k is None:
        return values
    metric = [
        (m.x, m.y, m.z, math.degrees(m.yaw), m.opening) if m.has_depth else (None,) * 5
        for m in predictor.in_metres(view, grasps, k)
    ]
    return [v + m for v, m in zip(values, metric)]


def _print_grasps(values: list[tuple], fields: tuple[str, ...]) -> None:
    widths = [10 if f.endswith("_deg") else 8 for f in fields]
    print(" ".join(f"{f:>{w}}" for f, w in zip(fields, widths)))
    for v in values:
        cells = []
        for f, w, x in zip(fields, widths, v):
            digits = 3 if f == "quality" or f.endswith("_m") else 1
            cells.append(f"{'-':>{w}}" if x is None else f"{x:{w}.{digits}f}")
        print(" ".join(cells))


def _grasp_args(args: argparse.Namespace) -> Intrinsics | None:
    """Check the grasp command's settings once, where they enter; the parsed intrinsics."""
    _check_count("--top", args.top)
    _check_count("--batch-size", args.batch_size)
    check_checkpoint_path(args.checkpoint)
    if args.depth is not None and not Path(args.depth).is_file():
        raise MissingFileError(f"depth file not found: {args.depth}")
    if not args.overlay and (args.out or args.out_dir):
        raise ConfigError("--out and --out-dir name overlays, which --no-overlay turns off")
    if args.depth_scale is not None and not (0 < args.depth_scale < math.inf):
        raise ConfigError(f"--depth-scale must be a finite number > 0, got {args.depth_scale}")
    return Intrinsics.parse(args.intrinsics) if args.intrinsics is not None else None


def cmd_grasp(args: argparse.Namespace) -> None:
    """Print (or write with --output) the top grasps on each view, and an overlay PNG each;
    with --intrinsics each grasp also in the camera frame, in metres."""
    k = _grasp_args(args)
    paths = expand_inputs(args.images, keep=is_view)
    if args.depth is not None and len(paths) != 1:
        raise ConfigError(
            f"--depth goes with one image, got {len(paths)}: without it each view's depth "
            "file is found beside it by name (pcd0100r.png -> pcd0100d.tiff)"
        )
    out = check_table_path(args.output, args.overwrite)
    pngs = dict(zip(paths, _out_pngs(args, paths, "_grasps.png"))) if args.overlay else {}
    predictor = GraspPredictor(args.checkpoint, args.ema, args.depth_scale)
    fields = GRASP_FIELDS + (METRIC_FIELDS if k is not None else ())
    rows: list[dict] = []
    failed: list[Failed] = []
    load = lambda path: predictor.load(path, args.depth, keep_depth=k is not None)  # noqa: E731
    for names, views in _each_batch(paths, load, args.batch_size, failed):
        for path, view, grasps in zip(names, views, predictor.grasps(views, args.top)):
            values = _grasp_values(predictor, view, grasps, k)
            depth = str(view.depth) if view.depth is not None else ""
            grasp_rows = [dict(zip(fields, v)) for v in values]
            rows.append({"path": str(path), "depth": depth, "grasps": grasp_rows})
            if out is None:
                if len(paths) > 1:
                    print(f"{path}:")
                _print_grasps(values, fields)
            if path in pngs:
                _save_png(lambda p: draw_grasps(view.shown, grasps, None, p), pngs[path])  # noqa: B023
    if out is not None:
        header = ["path", "depth"]
        header += [f"{c}_{i}" for i in range(1, args.top + 1) for c in fields]
        write_table(out, rows, header, lambda row: _grasp_cells(row, fields))
        print(f"wrote {out}: {len(rows)} image{'' if len(rows) == 1 else 's'}")
    _report(failed, len(paths))


_OUT_HELP = (
    "PNG file to write, for one image; .png is added when there is no extension, missing "
    "folders are created, an existing folder is refused"
)
_INPUTS_HELP = (
    "image files, folders (searched recursively) and globs ('imgs/**/*.png'); a search skips "
    "the pictures attention and grasp write (*_attention.png, *_grasps.png)"
)


def _add_many(parser: argparse.ArgumentParser, what: str) -> None:
    """What predict, attention and grasp share: the inputs, the batch size, ``--output`` (where
    ``what`` names a row's contents), ``--overwrite`` and ``--ema``."""
    parser.add_argument("images", nargs="+", help=_INPUTS_HELP)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--batch-size", type=int, default=16, help="images per forward pass")
    if what:
        parser.add_argument(
            "--output",
            help=f"write one row per image with its {what} to a .csv or .jsonl file (then "
            "nothing is printed per image); files that fail are named on stderr, not written",
        )
    parser.add_argument("--overwrite", action="store_true")
    add_ema(parser)


def _add_pictures(parser: argparse.ArgumentParser, suffix: str) -> None:
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--out", help=_OUT_HELP)
    out.add_argument(
        "--out-dir",
        help=f"folder for the pictures, <image stem>{suffix} each (default: beside each image)",
    )


def add_commands(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser("predict", help="top-k classes of images")
    _add_many(pr, "top-k labels and scores")
    pr.add_argument(
        "--topk", type=int, default=5, help="classes per image, >= 1 (capped at the class count)"
    )
    pr.set_defaults(fn=cmd_predict)
    at = sub.add_parser("attention", help="ViT attention-rollout heat maps as PNGs")
    _add_many(at, "")
    _add_pictures(at, "_attention.png")
    at.add_argument(
        "--discard-ratio",
        type=float,
        default=0.0,
        help="fraction in [0, 1) of the weakest attention links dropped per layer",
    )
    at.set_defaults(fn=cmd_attention)
    gr = sub.add_parser("grasp", help="top grasps (x, y, angle, opening, jaw) + overlay PNGs")
    _add_many(gr, "top grasps (x, y, angle_deg, opening, jaw, quality)")
    gr.add_argument(
        "--depth",
        help="depth image of the one image (depth / RGB-D models); without it each view's is "
        "found beside it by name (pcd0100r.png -> pcd0100d.tiff, *_RGB.png -> "
        "*_perfect_depth.tiff)",
    )
    gr.add_argument(
        "--depth-scale",
        type=float,
        help="metres per unit of a 16-bit depth PNG/TIFF (default 0.001: millimetres, as "
        "RealSense and Kinect write); a float TIFF is read as metres",
    )
    gr.add_argument("--top", type=int, default=5, help="grasps per view, >= 1")
    gr.add_argument(
        "--intrinsics",
        metavar="FX,FY,CX,CY",
        help="the camera's pinhole intrinsics in pixels: each grasp is also given in its "
        "optical frame (x_m, y_m, z_m: centre in metres, x right, y down, z forward; yaw_deg "
        "about +z; opening_m), from the view's depth (--depth, or the file beside it)",
    )
    _add_pictures(gr, "_grasps.png")
    gr.add_argument(
        "--overlay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write an overlay PNG per view (default: on)",
    )
    gr.set_defaults(fn=cmd_grasp)

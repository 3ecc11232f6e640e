"""``vtfm``: predict, attention maps, ONNX export and the format benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from .errors import (
    ConfigError,
    MissingFileError,
    OutputExistsError,
    error_line,
    exit_code,
    warning_line,
)
from .io import check_writable_dir
from .models.convert import check_checkpoint_path
from .tasks.grasp import draw_grasps
from .tasks.grasp.predict import GraspPredictor, is_view
from .tasks.predict import (
    Classifier,
    Failed,
    batched,
    check_table_path,
    expand_inputs,
    finite_input,
    write_table,
)
from .version import __version__

__all__ = ["main"]


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


def _cls_cells(row: dict) -> list:
    """A predict row as CSV cells: the path, then label and score pairs, best first."""
    return [row["path"]] + [v for t in row["top"] for v in (t["label"], t["score"])]


def _grasp_cells(row: dict) -> list:
    """A grasp row as CSV cells: the paths, then each grasp's fields, best first (a view
    with fewer grasps than --top has a shorter row)."""
    return [row["path"], row["depth"]] + [g[c] for g in row["grasps"] for c in GRASP_FIELDS]


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
    from .viz import attention_rollout, save_heatmap_overlay

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


def cmd_grasp(args: argparse.Namespace) -> None:
    """Print (or write with --output) the top grasps on each view, and an overlay PNG each."""
    _check_count("--top", args.top)
    _check_count("--batch-size", args.batch_size)
    check_checkpoint_path(args.checkpoint)
    if args.depth is not None and not Path(args.depth).is_file():
        raise MissingFileError(f"depth file not found: {args.depth}")
    paths = expand_inputs(args.images, keep=is_view)
    if args.depth is not None and len(paths) != 1:
        raise ConfigError(
            f"--depth goes with one image, got {len(paths)}: without it each view's depth "
            "file is found beside it by name (pcd0100r.png -> pcd0100d.tiff)"
        )
    out = check_table_path(args.output, args.overwrite)
    if not args.overlay and (args.out or args.out_dir):
        raise ConfigError("--out and --out-dir name overlays, which --no-overlay turns off")
    pngs = dict(zip(paths, _out_pngs(args, paths, "_grasps.png"))) if args.overlay else {}
    if args.depth_scale is not None and not (0 < args.depth_scale < math.inf):
        raise ConfigError(f"--depth-scale must be a finite number > 0, got {args.depth_scale}")
    predictor = GraspPredictor(args.checkpoint, args.ema, args.depth_scale)
    rows: list[dict] = []
    failed: list[Failed] = []
    load = lambda path: predictor.load(path, args.depth)  # noqa: E731
    for names, views in _each_batch(paths, load, args.batch_size, failed):
        for path, view, grasps in zip(names, views, predictor.grasps(views, args.top)):
            values = [
                (g.x, g.y, math.degrees(g.angle), g.opening, g.jaw, g.quality) for g in grasps
            ]
            depth = str(view.depth) if view.depth is not None else ""
            grasp_rows = [dict(zip(GRASP_FIELDS, v)) for v in values]
            rows.append({"path": str(path), "depth": depth, "grasps": grasp_rows})
            if out is None:
                if len(paths) > 1:
                    print(f"{path}:")
                print(
                    f"{'x':>8} {'y':>8} {'angle_deg':>10} {'opening':>8} {'jaw':>8} {'quality':>8}"
                )
                for v in values:
                    print("{:8.1f} {:8.1f} {:10.1f} {:8.1f} {:8.1f} {:8.3f}".format(*v))
            if path in pngs:
                _save_png(lambda p: draw_grasps(view.shown, grasps, None, p), pngs[path])  # noqa: B023
    if out is not None:
        header = ["path", "depth"]
        header += [f"{c}_{i}" for i in range(1, args.top + 1) for c in GRASP_FIELDS]
        write_table(out, rows, header, _grasp_cells)
        print(f"wrote {out}: {len(rows)} image{'' if len(rows) == 1 else 's'}")
    _report(failed, len(paths))


def _hw(text: str) -> tuple[int, int]:
    """``"224"`` -> (224, 224); ``"224x320"`` -> (224, 320)."""
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts, default=0) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size like 224 or 224x320, got {text!r}")
    return (parts[0], parts[-1])


def cmd_export(args: argparse.Namespace) -> None:
    """Export a checkpoint to ONNX (+ int8), check parity, write the files and metadata;
    or (``--format hf``) to a Hugging Face / timm model folder."""
    from .export import ExportOptions, export_checkpoint

    if args.format == "hf":
        return _export_hf(args)

    int8 = ("dynamic", "static") if args.int8 == "both" else (args.int8,) if args.int8 else ()
    names = [f.name for f in dataclasses.fields(ExportOptions) if f.name != "int8"]
    opts = ExportOptions(int8=int8, **{k: getattr(args, k) for k in names})  # flag = field
    export_checkpoint(args.checkpoint, opts)


def _export_hf(args: argparse.Namespace) -> None:
    from .export.folder import export_folder

    if args.int8 or args.img_size:
        flag = "--int8" if args.int8 else "--img-size"
        raise ConfigError(f"{flag} is an ONNX option; --format hf writes the weights as they are")
    out = export_folder(args.checkpoint, args.out, args.ema, args.overwrite)
    print(f"wrote {out}/config.json + model.safetensors")
    print(f'load it: timm.create_model("local-dir:{out}", pretrained=True)')


def cmd_benchmark(args: argparse.Namespace) -> None:
    """Print and write (Markdown, CSV, JSON) one row per format."""
    from .export import BenchOptions, benchmark_checkpoint, write_tables
    from .export.pipeline import refuse_existing
    from .export.tables import TABLE_FILES, markdown_table

    names = [f.name for f in dataclasses.fields(BenchOptions) if hasattr(args, f.name)]
    given = {k: getattr(args, k) for k in names}  # each flag is named after its field
    given["formats"] = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    given = {k: v for k, v in given.items() if v is not None}
    opts = BenchOptions.quick(**given) if args.quick else BenchOptions(**given)
    opts.validate()  # bad flags and a missing checkpoint first, then the outputs
    if args.model is None:
        check_checkpoint_path(args.checkpoint)
        out = Path(args.out) if args.out else Path(args.checkpoint).parent / "benchmark"
    else:
        out = Path(args.out) if args.out else Path(f"benchmark-{args.model}")
    refuse_existing([out / n for n in TABLE_FILES], args.overwrite)
    check_writable_dir(out, "--out")  # the table is written last: fail now, not after the work
    keep = Path(args.keep_exports) if args.keep_exports else None
    if keep is not None and keep.exists() and any(keep.iterdir()) and not args.overwrite:
        raise OutputExistsError(
            f"--keep-exports: {keep} is not empty; pass --overwrite to reuse it"
        )
    if keep is not None:
        check_writable_dir(keep, "--keep-exports")
    progress = lambda line: print(line, file=sys.stderr)  # noqa: E731
    result = benchmark_checkpoint(args.checkpoint, opts, args.keep_exports, log=progress)
    paths = write_tables(result, out)  # files first: a closed stdout must not lose them
    print(markdown_table(result))
    for path in paths:
        print(f"wrote {path}")
    bad = [r["format"] for r in result["rows"] if not r["status"].startswith("ok")]
    if bad:  # the table is complete, but a script or CI job must not read this as a pass
        print(f"not ok: {', '.join(bad)} (see the status column)", file=sys.stderr)
        sys.exit(1)


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
    _add_ema(parser)


def _add_pictures(parser: argparse.ArgumentParser, suffix: str) -> None:
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--out", help=_OUT_HELP)
    out.add_argument(
        "--out-dir",
        help=f"folder for the pictures, <image stem>{suffix} each (default: beside each image)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vtfm",
        description="vision_tfm command line",
        epilog="Training: train_cls.py and train_grasp.py (--help); every config key, with its "
        "type and default: docs/config.md in the repository.",
    )
    p.add_argument("--version", action="version", version=f"vision_tfm {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
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
    _add_pictures(gr, "_grasps.png")
    gr.add_argument(
        "--overlay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write an overlay PNG per view (default: on)",
    )
    gr.set_defaults(fn=cmd_grasp)
    _add_export(sub)
    _add_benchmark(sub)
    return p


def _add_ema(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ema",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="use the EMA (or, with --no-ema, the raw) weights; default: what the run shipped",
    )


def _add_data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        help="dataset folder for the val (and calibration) images; default: the checkpoint's "
        "data.root, which is relative to where training ran",
    )


def _add_int8_scores(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--int8-scores",
        default="auto",
        help="attention's q/k projections: auto (dynamic int8 keeps them fp32 for agreement, "
        "static modes quantise them), fp32, or int8 (the fastest dynamic int8)",
    )


def _add_export(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "export", help="ONNX (fp32, dynamic shapes, int8) + parity check, or a timm / HF folder"
    )
    ex.add_argument("--checkpoint", required=True)
    ex.add_argument(
        "--format",
        default="onnx",
        choices=["onnx", "hf"],
        help="onnx, or hf: config.json + model.safetensors, as timm and the Hugging Face hub "
        "read them",
    )
    ex.add_argument(
        "--out",
        help=".onnx path (default: model.onnx beside the checkpoint); with --format hf, the "
        "folder (default: <checkpoint stem>-hf beside it)",
    )
    ex.add_argument("--dynamic", default="batch", help="batch, hw, batch,hw or none")
    ex.add_argument("--opset", type=int, default=18, help="18..25; SDPA -> Attention at >= 23")
    ex.add_argument("--attention", default="auto", choices=["auto", "fused", "explicit"])
    ex.add_argument("--img-size", type=_hw, help="export size, e.g. 28 or 28x42")
    ex.add_argument(
        "--int8",
        choices=["dynamic", "static", "openvino", "both"],
        help="dynamic, static (QDQ for onnxruntime), openvino (QDQ for OpenVINO's int8 "
        "plugin) or both (dynamic and static)",
    )
    ex.add_argument("--calib-data", help="images, ImageFolder, CIFAR or MNIST idx folder")
    ex.add_argument("--calib-size", type=int, default=256, help="calibration images")
    _add_int8_scores(ex)
    ex.add_argument("--atol", type=float, default=1e-4, help="parity tolerance (max abs diff)")
    ex.add_argument("--parity-images", type=int, default=16, help="val images per parity check")
    ex.add_argument("--val-images", type=int, default=0, help="int8 scoring images (0 = all)")
    ex.add_argument("--overwrite", action="store_true")
    _add_data(ex)
    _add_ema(ex)
    ex.set_defaults(fn=cmd_export)


def _add_benchmark(sub: argparse._SubParsersAction) -> None:
    bm = sub.add_parser("benchmark", help="latency/accuracy table over export formats")
    src = bm.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint")
    src.add_argument(
        "--model",
        help="a registered model instead (needs --data: a folder of real images, or a "
        "Cornell/Jacquard folder for a grasp model): speed, memory and agreement with fp32, "
        "no accuracy",
    )
    bm.add_argument("--img-size", type=int, help="with --model: input side (default: its own)")
    bm.add_argument(
        "--weights", help="with a classifier --model: timm/torchvision weights (default: random)"
    )
    bm.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="peak RSS per format, one child process each (default: on)",
    )
    bm.add_argument(
        "--formats",
        default="torch,torch-bf16,onnx,onnx-int8-dynamic,onnx-int8-static",
        help="comma list of torch, torch-bf16, torch-optimized, torch-compiled, onnx, "
        "onnx-opset23, onnx-int8-dynamic, onnx-int8-static, openvino, openvino-bf16, "
        "openvino-int8 (the openvino extra)",
    )
    bm.add_argument("--threads", type=int, default=2)
    bm.add_argument("--out", help="folder for benchmark.{md,csv,json} (default: beside ckpt)")
    bm.add_argument("--quick", action="store_true", help="few runs and images: a smoke test")
    bm.add_argument("--warmup", type=int, help="warmup runs (default 10)")
    bm.add_argument("--runs", type=int, help="at least this many timed runs (default 50)")
    bm.add_argument("--seconds", type=float, help="and at least this long (default 10)")
    bm.add_argument("--batch", type=int, help="throughput batch (default 32)")
    bm.add_argument("--val-images", type=int, help="val images scored (default: all)")
    bm.add_argument("--opset", type=int)
    bm.add_argument("--calib-data")
    bm.add_argument("--calib-size", type=int)
    _add_int8_scores(bm)
    bm.add_argument("--atol", type=float, help="fp32 parity tolerance (default 1e-4)")
    bm.add_argument("--keep-exports", help="keep the exported files (+ JSON) in this folder")
    bm.add_argument("--overwrite", action="store_true")
    _add_data(bm)
    _add_ema(bm)
    bm.set_defaults(fn=cmd_benchmark)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """``kill`` (SIGTERM) would end the process on the spot; raising instead lets the
    staging folders and temp files of an export or benchmark be cleaned up on the way out."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    prev, fmt = None, warnings.formatwarning
    if threading.current_thread() is threading.main_thread():  # signals only work there
        prev = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    warnings.formatwarning = warning_line  # one line each, as the errors
    try:
        args.fn(args)
    except Exception as e:  # ours; a library's, on bad input or a full disk; a bug re-raised
        code = exit_code(e)
        if code is None:
            raise
        print(error_line(e), file=sys.stderr)
        sys.exit(code)
    finally:
        warnings.formatwarning = fmt
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


if __name__ == "__main__":
    main()

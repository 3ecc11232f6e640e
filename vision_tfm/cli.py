"""``vtfm``: predict, attention maps, ONNX export and the format benchmark."""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import torch

from .data import build_eval_transform, load_image
from .errors import ConfigError, MissingFileError, OutputExistsError, VisionTfmError
from .io import check_writable_dir, load_checkpoint
from .models.convert import check_checkpoint_path
from .tasks import ClassificationTask, eval_data_config
from .tasks.grasp import draw_grasps, predict_grasps
from .version import __version__

__all__ = ["main"]


def _load_cls(args: argparse.Namespace) -> tuple[torch.nn.Module, dict, np.ndarray, torch.Tensor]:
    """The classifier of ``--checkpoint``, its meta, and ``image`` raw and preprocessed."""
    ckpt = load_checkpoint(args.checkpoint)
    model, cfg = ClassificationTask.restore(ckpt, use_ema=args.ema, source=str(args.checkpoint))
    meta = ckpt["meta"]
    img = load_image(args.image, 1 if meta["in_chans"] == 1 else 3)
    return model, meta, img, build_eval_transform(eval_data_config(cfg, meta))(img)[None]


def _check_count(flag: str, value: int) -> None:
    """A count flag below 1 would print nothing (0) or, sliced from the end, nearly everything."""
    if value < 1:
        raise ConfigError(f"{flag} must be >= 1, got {value}")


def _need_inputs(checkpoint: str, *images: str | None) -> None:
    """Missing inputs are the news, not an output that exists (checked next)."""
    check_checkpoint_path(checkpoint)
    for image in filter(None, images):
        if not Path(image).is_file():
            raise MissingFileError(f"image file not found: {image}")


def _out_png(out: str | None, image: str, default_suffix: str, overwrite: bool) -> Path:
    """The PNG path that will really be written, checked before any work.

    With no extension ``.png`` is added (matplotlib would add it while saving, so the
    existence check and the printed path must see it). A folder is refused, as by
    ``vtfm export``; missing parent folders are created when the file is written.
    """
    given = Path(out) if out is not None else Path(image).with_suffix("").name + default_suffix
    path = Path(given)
    path = path if path.suffix else path.with_name(path.name + ".png")
    if path.suffix.lower() != ".png":
        raise ConfigError(f"--out must end in .png, got {out}")
    for p in (Path(given), path):
        if p.is_dir():
            raise ConfigError(f"--out: {p} is a folder; give the .png file path")
    folder = next(p for p in path.absolute().parents if p.exists())
    if not folder.is_dir():
        raise ConfigError(f"--out: cannot create a folder under {folder}: it is a file")
    if path.exists() and path.resolve() == Path(image).resolve():
        raise ConfigError(f"--out: {path} is the input image")
    if path.exists() and not overwrite:
        raise OutputExistsError(f"{path} exists; pass --overwrite to replace it")
    return path


def cmd_predict(args: argparse.Namespace) -> None:
    """Print the top-k classes of one image."""
    _check_count("--topk", args.topk)
    model, meta, _, x = _load_cls(args)
    with torch.no_grad():
        prob = model(x).float().softmax(-1)[0]
    k = min(args.topk, prob.numel())
    top = prob.topk(k)
    for p, i in zip(top.values.tolist(), top.indices.tolist()):
        print(f"{meta['class_names'][i]:>20s}  {p:.4f}")


def cmd_attention(args: argparse.Namespace) -> None:
    """Write an attention-rollout heat map over the image."""
    from .viz import attention_rollout, save_heatmap_overlay

    _need_inputs(args.checkpoint, args.image)
    out = _out_png(args.out, args.image, "_attention.png", args.overwrite)
    model, _, img, x = _load_cls(args)
    heat = attention_rollout(model, x, discard_ratio=args.discard_ratio)[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    save_heatmap_overlay(img, heat, out)
    print(f"wrote {out}")


def cmd_grasp(args: argparse.Namespace) -> None:
    """Print the top grasps on one view and write an overlay PNG."""
    _check_count("--top", args.top)
    _need_inputs(args.checkpoint, args.image, args.depth)
    out = _out_png(args.out, args.image, "_grasps.png", args.overwrite)
    grasps, image = predict_grasps(args.checkpoint, args.image, args.depth, args.top, args.ema)
    print(f"{'x':>8} {'y':>8} {'angle_deg':>10} {'opening':>8} {'jaw':>8} {'quality':>8}")
    for g in grasps:
        print(
            f"{g.x:8.1f} {g.y:8.1f} {math.degrees(g.angle):10.1f} {g.opening:8.1f} "
            f"{g.jaw:8.1f} {g.quality:8.3f}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    draw_grasps(image, grasps, None, out)
    print(f"wrote {out}")


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
    """Export a checkpoint to ONNX (+ int8), check parity, write the files and metadata."""
    from .export import ExportOptions, export_checkpoint

    int8 = ("dynamic", "static") if args.int8 == "both" else (args.int8,) if args.int8 else ()
    names = [f.name for f in dataclasses.fields(ExportOptions) if f.name != "int8"]
    opts = ExportOptions(int8=int8, **{k: getattr(args, k) for k in names})  # flag = field
    export_checkpoint(args.checkpoint, opts)


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
    "PNG file to write; .png is added when there is no extension, missing folders are "
    "created, an existing folder is refused"
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
    pr = sub.add_parser("predict", help="top-k classes of an image")
    pr.add_argument("image")
    pr.add_argument("--checkpoint", required=True)
    pr.add_argument(
        "--topk", type=int, default=5, help="classes to print, >= 1 (capped at the class count)"
    )
    _add_ema(pr)
    pr.set_defaults(fn=cmd_predict)
    at = sub.add_parser("attention", help="ViT attention-rollout heat map as a PNG")
    at.add_argument("image")
    at.add_argument("--checkpoint", required=True)
    at.add_argument("--out", help=f"{_OUT_HELP} (default: <image>_attention.png)")
    at.add_argument(
        "--discard-ratio",
        type=float,
        default=0.0,
        help="fraction in [0, 1) of the weakest attention links dropped per layer",
    )
    at.add_argument("--overwrite", action="store_true")
    _add_ema(at)
    at.set_defaults(fn=cmd_attention)
    gr = sub.add_parser("grasp", help="top grasps (x, y, angle, opening, jaw) + overlay PNG")
    gr.add_argument("image")
    gr.add_argument("--depth", help="depth TIFF (needed by depth / RGB-D models)")
    gr.add_argument("--checkpoint", required=True)
    gr.add_argument("--top", type=int, default=5, help="number of grasps, >= 1")
    gr.add_argument("--out", help=f"{_OUT_HELP} (default: <image>_grasps.png)")
    gr.add_argument("--overwrite", action="store_true")
    _add_ema(gr)
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
    ex = sub.add_parser("export", help="ONNX export (fp32, dynamic shapes, int8) + parity check")
    ex.add_argument("--checkpoint", required=True)
    ex.add_argument("--format", default="onnx", choices=["onnx"])
    ex.add_argument("--out", help=".onnx path (default: model.onnx beside the checkpoint)")
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
    prev = None
    if threading.current_thread() is threading.main_thread():  # signals only work there
        prev = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        args.fn(args)
    except (VisionTfmError, OSError, ValueError) as e:  # ours; a library's, on bad input
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


if __name__ == "__main__":
    main()

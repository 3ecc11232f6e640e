"""``vtfm export`` and ``vtfm benchmark``: a checkpoint to ONNX (+ int8) or a timm / Hugging
Face folder, and the latency / accuracy table over export formats."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..errors import ConfigError, OutputExistsError
from ..io import check_writable_dir
from ..models.convert import check_checkpoint_path
from .flags import add_ema


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
    from ..export import ExportOptions, export_checkpoint

    if args.format == "hf":
        return _export_hf(args)

    int8 = ("dynamic", "static") if args.int8 == "both" else (args.int8,) if args.int8 else ()
    names = [f.name for f in dataclasses.fields(ExportOptions) if f.name != "int8"]
    opts = ExportOptions(int8=int8, **{k: getattr(args, k) for k in names})  # flag = field
    export_checkpoint(args.checkpoint, opts)


def _export_hf(args: argparse.Namespace) -> None:
    from ..export.folder import export_folder

    if args.int8 or args.img_size:
        flag = "--int8" if args.int8 else "--img-size"
        raise ConfigError(f"{flag} is an ONNX option; --format hf writes the weights as they are")
    out = export_folder(args.checkpoint, args.out, args.ema, args.overwrite)
    print(f"wrote {out}/config.json + model.safetensors")
    print(f'load it: timm.create_model("local-dir:{out}", pretrained=True)')


def cmd_benchmark(args: argparse.Namespace) -> None:
    """Print and write (Markdown, CSV, JSON) one row per format."""
    from ..export import BenchOptions, benchmark_checkpoint, write_tables
    from ..export.pipeline import refuse_existing
    from ..export.tables import TABLE_FILES, markdown_table

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
    add_ema(ex)
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
    add_ema(bm)
    bm.set_defaults(fn=cmd_benchmark)


def add_commands(sub: argparse._SubParsersAction) -> None:
    _add_export(sub)
    _add_benchmark(sub)

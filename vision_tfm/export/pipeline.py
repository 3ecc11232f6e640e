"""``vtfm export``: a checkpoint to ONNX (fp32, optionally int8), metadata and a parity verdict.

Nothing is written unless the export passes its parity check, and nothing is half-written:
files are built in a temp folder beside the destination and renamed into place, the
metadata JSON last. An existing output is refused unless ``overwrite`` is set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MissingFileError, OutputExistsError
from ..io import check_writable_dir
from ..models import check_input_memory
from ..models.convert import check_checkpoint_path
from .onnx import (
    DEFAULT_OPSET,
    ParityError,
    check_opset,
    check_parity,
    export_attention,
    export_onnx,
    file_records,
    graph_signature,
    ort_runner,
    ort_session,
    parity_inputs,
    parse_dynamic,
    resize,
    size_mb,
    staging_dir,
)
from .openvino import openvino_runner, openvino_version
from .quantize import (
    INT8_FORMATS,
    INT8_MODES,
    SCORES,
    calibration_images,
    check_int8_scores,
    quantize_int8,
)
from .source import ExportSource, load_source


@dataclass
class ExportOptions:
    """What ``vtfm export`` can be asked for; the defaults are its command-line defaults."""

    out: str | None = None  # .onnx path; default: model.onnx beside the checkpoint
    dynamic: str = "batch"  # "batch", "hw", "batch,hw" or "none"
    opset: int = DEFAULT_OPSET
    attention: str = "auto"  # "auto", "fused" or "explicit"
    img_size: tuple[int, int] | None = None  # export size; default: the training size
    int8: tuple[str, ...] = ()  # any of INT8_MODES
    calib_data: str | None = None  # default: the checkpoint's training split
    calib_size: int = 256
    int8_scores: str = "auto"  # q/k projections: "auto" (the mode's recipe), "fp32", "int8"
    atol: float = 1e-4
    parity_images: int = 16
    val_images: int = 0  # images scoring int8 against fp32; 0 = the whole val split
    overwrite: bool = False
    ema: bool | None = None  # None: the weights the run shipped (EMA if it tracked one)
    data: str | None = None  # dataset folder replacing the checkpoint's data.root


def int8_path(fp32: Path, mode: str) -> Path:
    """``model.onnx`` -> ``model-int8-static.onnx``."""
    return fp32.with_name(f"{fp32.stem}-int8-{mode}.onnx")


def refuse_existing(paths: list[Path], overwrite: bool) -> None:
    """Fail before any work if an output exists and overwriting was not asked for."""
    existing = [p for p in paths if p.exists()]
    if existing and not overwrite:
        raise OutputExistsError(f"{existing[0]} exists; pass --overwrite to replace it")


def _check_options(opts: ExportOptions, checkpoint: str | os.PathLike) -> tuple[Path, list[Path]]:
    """Validate everything that needs no model, so bad input fails in a second."""
    check_checkpoint_path(checkpoint)
    check_opset(opts.opset)
    parse_dynamic(opts.dynamic)
    bad = sorted(set(opts.int8) - set(INT8_MODES))
    if bad:
        raise ConfigError(f"--int8: unknown mode(s) {bad}; expected {', '.join(INT8_MODES)}")
    if "openvino" in opts.int8 and openvino_version() is None:
        raise ConfigError("--int8 openvino needs openvino: pip install -e '.[openvino]'")
    if opts.calib_data is not None and not Path(opts.calib_data).exists():
        raise MissingFileError(f"calibration data not found: {opts.calib_data}")
    check_int8_scores(opts.int8_scores)
    for name, value, least in (
        ("--calib-size", opts.calib_size, 1),
        ("--parity-images", opts.parity_images, 1),
        ("--val-images", opts.val_images, 0),
    ):
        if value < least:
            raise ConfigError(f"{name} must be >= {least}, got {value}")
    out = Path(opts.out) if opts.out else Path(checkpoint).parent / "model.onnx"
    if out.suffix != ".onnx":
        raise ConfigError(f"--out must end in .onnx, got {out}")
    planned = export_files(out, opts.int8)
    for p in planned:
        if p.is_dir():
            raise ConfigError(f"--out: {p} is a folder; give the .onnx file path")
    refuse_existing(planned, opts.overwrite)
    check_writable_dir(out.parent, "--out")
    return out, planned


def export_files(out: Path, int8: tuple[str, ...] = INT8_MODES) -> list[Path]:
    """Every file an export to ``out`` writes with these int8 modes (fp32 first)."""
    files = [out, out.with_name(out.name + ".data"), out.with_suffix(".json")]
    for mode in int8:
        files += [int8_path(out, mode), int8_path(out, mode).with_suffix(".json")]
    return files


def export_checkpoint(
    checkpoint: str | os.PathLike, opts: ExportOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Export, check parity, optionally quantise, then write everything at once.

    Returns:
        The fp32 model's metadata (also written as JSON beside it), with int8 results.

    Raises:
        ParityError: onnxruntime and PyTorch disagree; the message says by how much.
        FileExistsError, FileNotFoundError, ValueError: bad input, in one line.
    """
    out, planned = _check_options(opts, checkpoint)
    dynamic = parse_dynamic(opts.dynamic)
    source = load_source(checkpoint, opts.ema, opts.data)
    calib = None
    if opts.int8:  # before the export: bad calibration data fails fast
        calib = calibration_images(source, opts.calib_data, opts.calib_size)
    size = tuple(opts.img_size or source.img_size)
    if source.task.scores_at_train_size and size != source.img_size and opts.int8:
        what = source.task.title
        raise ConfigError(f"{what} maps are scored at the training size; drop --img-size for int8")
    model = source.model
    check_input_memory(model, opts.parity_images, size, "--img-size")  # before any tensor
    inputs = parity_inputs(source, size, dynamic, opts.parity_images)
    example = inputs[0][:2]  # parity_inputs puts a batch at the export size first

    with staging_dir(out.parent) as tmp:
        fp32 = tmp / out.name
        with export_attention(model, example, opts.attention) as attention:
            export_onnx(
                model,
                example,
                fp32,
                output_names=source.output_names,
                dynamic=dynamic,
                opset=opts.opset,
            )
        report = check_parity(ort_session(fp32), source.torch_runner(), inputs, opts.atol)
        if not report.ok:
            hint = ""
            if "hw" in dynamic and report.checks[0].ok(opts.atol):
                hint = (
                    " (it holds at the trace size only, so the graph was specialised to it: "
                    "export with --dynamic batch, and --img-size HxW for each size you need)"
                )
            raise ParityError(f"{source.model_name}: {report.summary()}{hint}")
        log(f"{source.model_name}: {report.summary()}")

        meta = _metadata(source, fp32, dynamic, size, opts, attention)
        meta["parity"] = report.as_dict()
        if opts.int8:
            meta["int8"] = _quantise(source, fp32, size, opts, calib, log)
        ships = [[p["name"] for p in meta["files"]] + [out.with_suffix(".json").name]]
        for mode, result in meta.get("int8", {}).items():
            q = int8_path(out, mode)
            info = {k: v for k, v in meta.items() if k not in ("int8", "parity")}
            fmt = next(f for f, m in INT8_FORMATS.items() if m == mode)
            info.update(format=fmt, fp32_file=out.name, **result)
            info.update(file=q.name, files=file_records(tmp / q.name))
            _write_json(tmp / q.with_suffix(".json").name, info)
            ships.append([p["name"] for p in info["files"]] + [q.with_suffix(".json").name])
        _write_json(tmp / out.with_suffix(".json").name, meta)
        written = _install(tmp, out.parent, [p.name for p in planned])
    # what the replaced export left: int8 files describing another fp32 model, or the weights
    # file of a model that now fits in one file
    stale = [p for p in export_files(out) if p not in written and p.exists()]
    for p in stale if opts.overwrite else []:
        p.unlink()
        log(f"removed {p} (left from the export this one replaced)")
    log(f"wrote {', '.join(str(p) for p in written)}")
    for names in ships:
        log(f"ship together: {', '.join(names)}")
    return meta


def _metadata(
    source: ExportSource,
    fp32: Path,
    dynamic: frozenset[str],
    size: tuple[int, int],
    opts: ExportOptions,
    attention: str,
) -> dict[str, Any]:
    import onnx
    import onnxruntime

    info = source.describe()
    info["versions"].update(onnx=onnx.__version__, onnxruntime=onnxruntime.__version__)
    batch = "batch" if "batch" in dynamic else 1
    hw = ["height", "width"] if "hw" in dynamic else list(size)
    return {
        **info,
        "img_size": list(size),  # what the graph was exported (and checked) at
        "train_img_size": info["img_size"],
        "format": "onnx",
        "file": fp32.name,  # staged under the name it is installed with
        "files": file_records(fp32),  # every file the graph needs: one below 2 GB of weights
        "size_mb": size_mb(fp32),
        "opset": opts.opset,
        "input_shape": [batch, source.in_chans, *hw],
        **graph_signature(fp32),  # inputs and outputs: names, shapes, dtypes
        "dynamic_axes": sorted(dynamic),
        "attention": attention,
    }


def _quantise(
    source: ExportSource,
    fp32: Path,
    size: tuple[int, int],
    opts: ExportOptions,
    calib: Any,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Quantise in the staging folder and score each int8 file against fp32 PyTorch."""
    if calib is not None:
        calib = resize(calib, size)
    bs = 64 if "batch" in parse_dynamic(opts.dynamic) else 1
    batches = [(resize(b[0], size), *b[1:]) for b in source.batches("val", bs, opts.val_images)]
    ref = source.evaluate(source.torch_runner(), batches)
    results = {}
    for mode in opts.int8:
        q = int8_path(fp32, mode)  # staged beside fp32, under its installed name
        recipe = quantize_int8(fp32, q, mode, calib, scores_fp32=SCORES[opts.int8_scores])
        # scored by the runtime the file is laid out for
        run = openvino_runner(q, 1)[0] if mode == "openvino" else ort_runner(ort_session(q))
        ev = source.evaluate(run, batches)
        results[mode] = r = {
            source.metric_name: ev.metric,
            f"{source.metric_name}_fp32": ref.metric,
            "metric_delta": ev.metric - ref.metric,
            "top1_agreement": ev.top1_agreement(ref),
            "val_images": len(ev.outputs[0]),
            "size_mb": size_mb(q),
            # the folder's name only: the JSON ships with the model, a path would leak the machine
            "calibration": {
                "data": Path(opts.calib_data).name if opts.calib_data else "train split",
                "images": len(calib),
                "smoothquant_alpha": recipe.smoothquant_alpha,
            },
            "fp32_matmuls": recipe.fp32_matmuls,
        }
        agree = r["top1_agreement"]
        log(
            f"int8 {mode}: {source.metric_name} {r[source.metric_name]:.4f} "
            f"({r['metric_delta']:+.4f} vs fp32)"
            + (f", top-1 agreement with fp32 {agree:.4f}" if agree is not None else "")
            + f" on {r['val_images']} val images"
        )
    return results


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def _install(tmp: Path, dest: Path, names: list[str]) -> list[Path]:
    """Rename staged files into place; JSON last, so its presence means the set is complete."""
    staged = sorted((n for n in names if (tmp / n).exists()), key=lambda n: n.endswith(".json"))
    for n in staged:
        os.replace(tmp / n, dest / n)
    return [dest / n for n in staged]

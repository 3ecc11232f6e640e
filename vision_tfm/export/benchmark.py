"""``vtfm benchmark``: one row per format - accuracy, parity, latency, throughput, FLOPs.

Every format runs the same real val images on the same number of threads, timed in
interleaved rounds (:func:`time_runs`) so that a noisy spell on a shared machine hits them
all alike. A format that fails gets a row saying why, and the table goes on. Peak memory is
measured apart from the timing, in a fresh process per format (:mod:`.memory`).

A grasp checkpoint is scored by grasp accuracy on its centre-cropped val views; agreement is
that of each view's top grasp with fp32 PyTorch's. Without a checkpoint (``--model NAME``) a
registered model gets speed, memory and agreement rows on real images, without their labels.

``torch-optimized`` and ``torch-compiled`` are PyTorch's deployment paths
(:func:`vision_tfm.optimize_for_inference`, eager, and with ``compile=True``): which one is
faster depends on the CPU, so the table measures both beside the runtimes. The compiled row
compiles once per input shape before it is timed; its peak memory includes the compilation.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from ..accel import cpu_native_bf16, warn_if_bf16_emulated
from ..errors import ConfigError, ExportError, MissingFileError
from ..models import check_input_memory, get_model_entry
from ..optimize import optimize_for_inference
from .flops import count_flops, cpu_description, matmul_ceiling, torch_threads
from .memory import peak_rss_mb
from .onnx import (
    ATTENTION_OPSET,
    DEFAULT_OPSET,
    check_opset,
    check_parity,
    export_attention,
    export_onnx,
    one_line,
    ort_runner,
    ort_session,
    parity_inputs,
    size_mb,
)
from .openvino import openvino_runner, openvino_version
from .quantize import (
    INT8_FORMATS,
    SCORES,
    calibration_images,
    check_int8_scores,
    quantize_int8,
)
from .source import ExportSource, Runner, load_source, max_abs_diff, model_source
from .tables import Row

FORMATS = (
    "torch",
    "torch-bf16",
    "torch-optimized",
    "torch-compiled",
    "onnx",
    f"onnx-opset{ATTENTION_OPSET}",
    "onnx-int8-dynamic",
    "onnx-int8-static",
    "openvino",
    "openvino-bf16",
    "openvino-int8",
)
# exported formats held to the fp32 tolerance against PyTorch on the val images
FP32_FORMATS = ("onnx", f"onnx-opset{ATTENTION_OPSET}", "openvino")
TORCH_FAST = ("torch-optimized", "torch-compiled")  # optimize_for_inference, fp32
_PATH_SETTINGS = ("data", "calib_data", "weights")  # recorded by name: no machine layout
MAX_SECONDS = 3600.0
"""Longest ``--seconds`` per format: an hour is already far past a stable median."""


@dataclass
class BenchOptions:
    """Benchmark settings; the defaults meet the issue's measurement rules."""

    formats: tuple[str, ...] = (
        "torch",
        "torch-bf16",
        "onnx",
        "onnx-int8-dynamic",
        "onnx-int8-static",
    )
    threads: int = 2
    warmup: int = 10
    runs: int = 50
    seconds: float = 10.0
    batch: int = 32
    val_images: int = 0  # 0 = the whole val split
    opset: int = DEFAULT_OPSET
    atol: float = 1e-4
    calib_data: str | None = None
    calib_size: int = 256
    int8_scores: str = "auto"  # q/k projections: "auto" (the mode's recipe), "fp32", "int8"
    ceiling_sizes: tuple[int, ...] = (512, 1024, 2048)  # square matmuls timed for the peak
    ceiling_seconds: float = 1.0  # time spent on each of them per dtype
    ema: bool | None = None  # None: the weights the run shipped (EMA if it tracked one)
    data: str | None = None  # dataset folder replacing data.root; with model: the images
    memory: bool = True  # peak RSS per format, one child process each
    model: str | None = None  # a registered model instead of a checkpoint
    img_size: int | None = None  # with model: the input side (default: its registered size)
    weights: str | None = None  # with a classifier model: timm / torchvision / official weights

    @classmethod
    def quick(cls, **kw: Any) -> BenchOptions:
        """Seconds instead of minutes, for tests and smoke runs (numbers are not comparable)."""
        base = dict(
            warmup=2,
            runs=5,
            seconds=0.0,
            val_images=64,
            calib_size=32,
            ceiling_sizes=(256, 512),
            ceiling_seconds=0.2,
        )
        return cls(**{**base, **kw})

    def validate(self) -> None:
        if not self.formats:
            raise ConfigError(f"--formats: none given; choose from {', '.join(FORMATS)}")
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown:
            raise ConfigError(f"--formats: unknown {unknown}; choose from {', '.join(FORMATS)}")
        check_opset(self.opset)
        if self.calib_data is not None and not Path(self.calib_data).exists():
            raise MissingFileError(f"calibration data not found: {self.calib_data}")
        check_int8_scores(self.int8_scores)
        if self.threads < 1 or self.batch < 1 or self.runs < 1 or self.calib_size < 1:
            raise ConfigError("--threads, --batch, --runs and --calib-size must be >= 1")
        if self.threads > (os.cpu_count() or 1):
            raise ConfigError(
                f"--threads must be at most {os.cpu_count() or 1} (the CPU cores here), "
                f"got {self.threads}"
            )
        if self.warmup < 0 or self.val_images < 0:
            raise ConfigError("--warmup and --val-images must be >= 0")
        if not 0 <= self.seconds <= MAX_SECONDS:  # inf never ends; nan compares false: 0
            raise ConfigError(f"--seconds must be in [0, {MAX_SECONDS}], got {self.seconds}")
        if not (math.isfinite(self.atol) and self.atol >= 0):
            raise ConfigError(f"--atol must be a finite number >= 0, got {self.atol}")
        if self.model is None and (self.img_size or self.weights):
            raise ConfigError("--img-size and --weights go with --model (a checkpoint has both)")
        if self.model is not None and self.ema is not None:
            raise ConfigError("--ema and --no-ema choose a checkpoint's weights; --model has none")
        if self.model is not None:
            if self.data is None:
                raise ConfigError("--model needs --data: a folder of real images to compare on")
            if self.img_size is not None and self.img_size < 1:
                raise ConfigError(f"--img-size must be >= 1, got {self.img_size}")


def time_runs(
    fns: dict[str, Callable[[torch.Tensor], Any]],
    x: torch.Tensor,
    warmup: int,
    runs: int,
    seconds: float,
    round_calls: int = 5,
) -> dict[str, list[float]]:
    """Milliseconds per call of each function, timed in interleaved rounds.

    Each function gets ``warmup`` untimed calls, then rounds of ``round_calls`` timed calls
    each, in turn, until all have ``runs`` calls and ``seconds * len(fns)`` have passed.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn(x)
    times: dict[str, list[float]] = {k: [] for k in fns}
    start, budget = time.perf_counter(), seconds * len(fns)

    def more() -> bool:
        fewest = min((len(t) for t in times.values()), default=runs)
        return fewest < runs or time.perf_counter() - start < budget

    while more():
        for k, fn in fns.items():
            for _ in range(round_calls):
                t0 = time.perf_counter()
                fn(x)
                times[k].append((time.perf_counter() - t0) * 1e3)
    return times


class _Formats:
    """Builds each format's runner on demand, sharing the fp32 export and its failure."""

    def __init__(self, source: ExportSource, opts: BenchOptions, workdir: Path) -> None:
        self.source, self.opts, self.workdir = source, opts, workdir
        self.exports: dict[int, tuple[Path, str] | Exception] = {}
        self.files: dict[str, tuple[Path, int]] = {}  # format -> the ONNX file it ran, opset
        self.calib: torch.Tensor | None = None  # drawn once, shared by the int8 formats
        self.recipes: dict[str, dict[str, Any]] = {}  # int8 format -> how it was quantised
        self.runs_in: dict[str, str] = {}  # OpenVINO format -> the precision it compiled to

    def describe_files(self) -> None:
        """A JSON beside each ONNX file (as ``vtfm export`` writes), for exports kept."""
        info = self.source.describe()
        for fmt, (path, opset) in self.files.items():
            meta = {**info, "format": fmt, "file": path.name, "opset": opset}
            path.with_suffix(".json").write_text(json.dumps(meta, indent=2, default=str) + "\n")

    def memory_target(self, fmt: str) -> tuple[str, Path]:
        """``(runtime kind, file)`` that :func:`peak_rss_mb` loads for ``fmt``."""
        if fmt.startswith("torch"):
            path = self.workdir / "model-torch.pt"
            if not path.exists():  # the whole module: the child has no config to rebuild it
                torch.save(self.source.model, path)
            return fmt, path
        if fmt == "openvino-int8":
            return "openvino", self.files[fmt][0]
        if fmt.startswith("openvino"):  # measured in the precision its row runs in
            kind = "openvino" if self.runs_in.get(fmt) == "fp32" else fmt
            return kind, self.onnx(self.opts.opset)[0]
        return "onnx", self.files[fmt][0]

    def build(self, fmt: str) -> tuple[Runner, str, float]:
        """``(runner, status, size in MB)`` for one format."""
        src, threads = self.source, self.opts.threads
        if fmt.startswith("torch"):
            fast = None  # the plain model; its fast forms run a copy, folded in place
            if fmt in TORCH_FAST:
                fast = optimize_for_inference(
                    copy.deepcopy(src.model), compile=fmt == "torch-compiled"
                )
            runner = src.torch_runner(bf16=fmt == "torch-bf16", model=fast)
            return runner, "ok", _state_dict_mb(src.model)
        if fmt in INT8_FORMATS:
            fp32, _ = self.onnx(self.opts.opset)
            path = self.workdir / f"{fmt}.onnx"
            if self.calib is None:
                self.calib = calibration_images(src, self.opts.calib_data, self.opts.calib_size)
            scores = SCORES[self.opts.int8_scores]
            recipe = quantize_int8(fp32, path, INT8_FORMATS[fmt], self.calib, scores_fp32=scores)
            self.recipes[fmt] = asdict(recipe)
            self.files[fmt] = path, self.opts.opset
            if fmt.startswith("openvino"):  # the int8 layers run int8; the rest fp32, not bf16
                return openvino_runner(path, threads)[0], "ok", size_mb(path)
            return ort_runner(ort_session(path, threads)), "ok", size_mb(path)
        if fmt.startswith("openvino"):
            path, _ = self.onnx(self.opts.opset)  # its parity is judged on OpenVINO's outputs
            want = "bf16" if fmt.endswith("-bf16") else "fp32"
            runner, runs_in = openvino_runner(path, threads, want)
            self.runs_in[fmt] = runs_in
            status = "ok" if runs_in == want else f"ok: runs {runs_in} (no {want} on this CPU)"
            return runner, status, size_mb(path)
        opset = ATTENTION_OPSET if fmt == f"onnx-opset{ATTENTION_OPSET}" else self.opts.opset
        path, status = self.onnx(opset)
        self.files[fmt] = path, opset
        return ort_runner(ort_session(path, threads)), status, size_mb(path)

    def onnx(self, opset: int) -> tuple[Path, str]:
        """The fp32 export at ``opset`` (dynamic batch, training size) and its parity status."""
        if opset not in self.exports:
            try:
                self.exports[opset] = self._export(opset)
            except Exception as e:
                self.exports[opset] = e
        done = self.exports[opset]
        if isinstance(done, Exception):
            raise ExportError(f"fp32 ONNX export at opset {opset} failed: {one_line(done)}")
        return done

    def _export(self, opset: int) -> tuple[Path, str]:
        src, dynamic = self.source, frozenset({"batch"})
        path = self.workdir / f"model-opset{opset}.onnx"
        inputs = parity_inputs(src, src.img_size, dynamic)
        with export_attention(src.model, inputs[0][:2]):
            export_onnx(src.model, inputs[0][:2], path, output_names=src.output_names, opset=opset)
        report = check_parity(ort_session(path), src.torch_runner(), inputs, self.opts.atol)
        status = "ok" if report.ok else f"exported but {report.summary()}"
        return path, status


def _state_dict_mb(model: torch.nn.Module) -> float:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 1e6


def benchmark_checkpoint(
    checkpoint: str | os.PathLike,
    opts: BenchOptions,
    workdir: str | os.PathLike | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure every requested format of a checkpoint; returns the table and its context.

    Args:
        checkpoint: A classification or grasp training checkpoint.
        opts: Formats, threads and timing rules.
        workdir: Where exported files go (kept); default: a temp folder, removed afterwards.
        log: Progress lines.
    """
    opts.validate()
    if opts.model is not None:
        size = opts.img_size or get_model_entry(opts.model).cfg.img_size
        source = model_source(opts.model, size, opts.data, opts.weights)
    else:
        source = load_source(checkpoint, opts.ema, opts.data)
    key = "--batch" if opts.img_size is None else "--batch and --img-size"
    check_input_memory(source.model, opts.batch, source.img_size, key)  # before any tensor
    with torch_threads(opts.threads), tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir) if workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        batches = source.batches("val", opts.batch, opts.val_images)
        x1 = batches[0][0][:1]
        xb = batches[0][0].repeat(math.ceil(opts.batch / len(batches[0][0])), 1, 1, 1)
        xb = xb[: opts.batch]
        gflops = count_flops(source.model, x1) / 1e9
        dtypes = {"fp32": torch.float32}
        bf16_note = None
        # no bf16 ceiling where bf16 is emulated: a square bf16 matmul would take minutes
        if any(f.endswith("-bf16") for f in opts.formats) and cpu_native_bf16():
            dtypes["bf16"] = torch.bfloat16
        if "torch-bf16" in opts.formats:
            bf16_note = warn_if_bf16_emulated("the torch row is the one to use")
        ceilings = {
            k: matmul_ceiling(dt, opts.threads, opts.ceiling_sizes, opts.ceiling_seconds)
            for k, dt in dtypes.items()
        }
        ref = source.evaluate(source.torch_runner(), batches)
        builder = _Formats(source, opts, work)
        rows, runners = [], {}
        for fmt in opts.formats:
            row = Row(fmt, threads=opts.threads, gflops=gflops)
            try:
                runner, row.status, row.size_mb = builder.build(fmt)
                ev = source.evaluate(runner, batches)
                row.metric = ev.metric
                if ev.metric is not None:
                    row.metric_delta = ev.metric - ref.metric
                row.top1_agreement = ev.top1_agreement(ref)
                row.max_abs_diff = max_abs_diff(ev.outputs, ref.outputs)
                fp32 = fmt in FP32_FORMATS or fmt in TORCH_FAST
                if fp32 and row.status == "ok" and row.max_abs_diff > opts.atol:
                    row.status = (
                        f"{'exported but ' if fmt in FP32_FORMATS else ''}parity failed: max "
                        f"abs diff {row.max_abs_diff:.2e} > {opts.atol:.0e} on the val images"
                    )
                runners[fmt] = runner
            except Exception as e:  # one format's failure is a row, not the end of the table
                row.status = f"failed: {one_line(e)}"
            if fmt in runners and opts.memory:
                try:
                    kind, path = builder.memory_target(fmt)
                    row.peak_rss_mb = peak_rss_mb(kind, path, x1.numpy(), opts.threads)
                except Exception as e:  # the row's other figures stand
                    row.status += f"; peak memory not measured: {one_line(e)}"
            rows.append(row)
            log(f"{fmt}: {row.status}")
        log(f"timing {len(runners)} formats, interleaved")
        lat = time_runs(runners, x1, opts.warmup, opts.runs, opts.seconds)
        tb = time_runs(runners, xb, opts.warmup, opts.runs, opts.seconds)
        for row in rows:
            if row.format not in runners:
                continue
            row.latency_median_ms = statistics.median(lat[row.format])
            row.latency_p90_ms = float(np.percentile(lat[row.format], 90))
            row.throughput_img_s = len(xb) / statistics.median(tb[row.format]) * 1e3
            ceiling = ceilings.get("bf16" if row.format.endswith("-bf16") else "fp32")
            if ceiling:
                row.pct_of_ceiling = 100 * gflops * 1e9 * row.throughput_img_s / ceiling
        if workdir:
            builder.describe_files()
    uses_openvino = any(f.startswith("openvino") for f in opts.formats)
    return {
        # the name only: the JSON is shared, a path would leak the machine's layout
        "checkpoint": None if opts.model else Path(checkpoint).name,
        "weights": source.meta.get("weights"),  # with --model
        "images": Path(opts.data).name if opts.model else None,
        "img_size": list(source.img_size),
        "model_name": source.model_name,
        "metric_name": source.metric_name,
        "val_images": len(ref.outputs[0]),
        # 1 would make top-1 agreement trivially high (random weights often collapse to one)
        "fp32_top1_classes": (
            len(ref.outputs[0].argmax(1).unique()) if ref.outputs[0].ndim == 2 else None
        ),
        # the same for grasps: random weights may put every view's top grasp on one pixel
        "fp32_top_grasp_pixels": (
            len({t[:2] for t in ref.top_grasps if t}) if ref.top_grasps is not None else None
        ),
        "task": source.task.name,
        "words": dict(source.task.table_words),
        "threads": opts.threads,
        "batch": opts.batch,
        "ceiling_gflops": {k: v / 1e9 for k, v in ceilings.items()},
        "machine": f"{platform.machine()}, {cpu_description()}, {os.cpu_count()} logical CPUs",
        # the runtime's version decides the kernels and fusions the ONNX rows measure
        "versions": {
            **source.describe()["versions"],
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            **({"openvino": openvino_version()} if uses_openvino else {}),
        },
        "settings": {
            k: Path(v).name if k in _PATH_SETTINGS and v else v
            for k, v in asdict(opts).items()
            if k != "formats"
        },
        "bf16_note": bf16_note,
        "int8_recipes": builder.recipes,
        "rows": [asdict(r) for r in rows],
    }

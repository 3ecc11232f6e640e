"""The benchmark's table: one :class:`Row` per format, written as Markdown, CSV and JSON.

The Markdown footer carries what a reader needs to trust the numbers: the machine, the
timing protocol, what agreement and the ceiling mean.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..io import atomic_write_text
from .memory import CALLS
from .quantize import INT8_FORMATS

TABLE_FILES = ("benchmark.md", "benchmark.csv", "benchmark.json")


def _column(head: str, fmt: str = "{}", default: Any = None) -> Any:
    """A table column: its Markdown header and cell format travel with the field."""
    return field(default=default, metadata={"head": head, "fmt": fmt})


@dataclass
class Row:
    """One format's line in the table (None where a measurement did not happen)."""

    format: str = field(metadata={"head": "format", "fmt": "{}"})
    status: str = _column("status", default="ok")
    size_mb: float | None = _column("size MB", "{:.2f}")
    peak_rss_mb: float | None = _column("peak RSS MB", "{:.0f}")
    metric: float | None = _column("{metric}", "{:.4f}")
    metric_delta: float | None = _column("Δ {metric}", "{:+.4f}")
    top1_agreement: float | None = _column("top-1 agree", "{:.4f}")
    max_abs_diff: float | None = _column("max abs diff", "{:.1e}")
    latency_median_ms: float | None = _column("b1 median ms", "{:.2f}")
    latency_p90_ms: float | None = _column("b1 p90 ms", "{:.2f}")
    throughput_img_s: float | None = _column("b{batch} img/s", "{:.1f}")
    gflops: float | None = _column("GFLOPs/img", "{:.3g}")
    pct_of_ceiling: float | None = _column("% of peak", "{:.1f}")
    threads: int | None = _column("threads")


COLUMNS = tuple(f.name for f in fields(Row))


def markdown_table(result: dict[str, Any]) -> str:
    """The table as Markdown, with the context a reader needs to trust the numbers below it."""
    metric = result["metric_name"]
    words = result["words"]
    columns = [c for c in COLUMNS if metric or c not in ("metric", "metric_delta")]
    col = {f.name: f.metadata for f in fields(Row)}
    heads = [col[c]["head"].format(metric=metric, batch=result["batch"]) for c in columns]
    if words.get("agree_head"):
        heads[columns.index("top1_agreement")] = words["agree_head"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in result["rows"]:
        cells = ["-" if r[c] is None else col[c]["fmt"].format(r[c]) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    ceil = ", ".join(f"{k} {v:.0f}" for k, v in result["ceiling_gflops"].items())
    s = result["settings"]
    size = "x".join(map(str, result["img_size"]))
    outputs = words["outputs"]
    if metric:
        views = words["views"]
        what = (
            f"{result['model_name']} ({result['checkpoint']}), {metric} on "
            f"{result['val_images']} {views}"
        )
    else:
        spread = words["spread"].format(**result)
        what = (
            f"{result['model_name']} at {size}, {result['weights']} weights: no accuracy "
            f"column, the {result['val_images']} images ({result['images']}) are used without "
            f"labels; agreement and max abs diff ({outputs}) are against fp32 PyTorch on them, "
            f"where {spread}"
        )
        if any(r["format"] in INT8_FORMATS for r in result["rows"]) and not s["calib_data"]:
            what += " (and int8 is calibrated on them: pass --calib-data to keep them apart)"
    what += words.get("agree_note", "")
    lines += [
        "",
        f"{what}; {result['machine']}; {result['threads']} threads.",
        f"Timing: {s['warmup']} warmup runs per format, then the formats take turns (5 calls "
        f"each) until each has >= {s['runs']} runs and >= {s['seconds']:g} s per format have "
        "passed, at batch 1 and again at the throughput batch. "
        "Δ, agreement and max abs diff are against fp32 PyTorch.",
        "GFLOPs count 1 multiply-add as 2 FLOPs (matmul, conv, attention; torch FlopCounterMode). "
        f"% of peak = GFLOPs/img x b{result['batch']} img/s over the measured matmul ceiling "
        f"in GFLOP/s ({ceil}; best of {', '.join(f'{n}²' for n in s['ceiling_sizes'])}): "
        "bf16 for the -bf16 rows, fp32 for every other row, int8 included.",
    ]
    if any(r["peak_rss_mb"] for r in result["rows"]):
        lines.append(
            "Peak RSS: a fresh process per format loads its runtime and the model and runs "
            f"{CALLS} batch-1 passes; it includes the interpreter and the runtime's libraries "
            "(torch rows import torch, onnxruntime rows only onnxruntime and numpy)."
        )
    if any(r["threads"] and r["threads"] > 1 for r in result["rows"]):
        lines.append(
            "onnxruntime sessions spin their worker threads within a run and stop when it "
            "returns (session.force_spinning_stop), as `ort_session` sets up for deployment: "
            "fast op-to-op hand-offs, and no spinning threads taking the cores from the next "
            "format in the interleaved rounds."
        )
    if any(r["format"].startswith("onnx") for r in result["rows"]):
        lines.append(
            "onnxruntime sessions flush denormals to zero (session.set_denormal_as_zero), as "
            "`ort_session` sets up for deployment: a trained model's activations underflow, and "
            "x86 CPUs compute denormals many times slower."
        )
    for fmt, r in result.get("int8_recipes", {}).items():
        alpha, kept = r["smoothquant_alpha"], r["fp32_matmuls"]
        how = [
            f"SmoothQuant alpha {alpha:g} (the one nearest fp32 on the calibration images)"
            if alpha
            else "no SmoothQuant"
        ]
        if kept:
            how.append(f"{kept} attention-score projections kept fp32")
        lines.append(f"{fmt}: {', '.join(how)}.")
    if result.get("bf16_note"):
        lines.append(f"torch-bf16: {result['bf16_note']}; the fp32 torch row is the one to use.")
    over = [
        r["format"]
        for r in result["rows"]
        if "int8" not in r["format"] and (r["pct_of_ceiling"] or 0) > 100
    ]
    if over:
        lines.append(
            f"Above 100% of the ceiling ({', '.join(over)}): the ceiling is PyTorch's own "
            "matmul, which a runtime with faster kernels for this CPU can beat; a ceiling run "
            "slowed by other work on the machine would also read low."
        )
    return "\n".join(lines) + "\n"


def write_tables(result: dict[str, Any], out_dir: str | os.PathLike) -> list[Path]:
    """Write ``benchmark.{md,csv,json}`` into ``out_dir``, each through a temp file + rename."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    csv_buf = io.StringIO()
    writer = csv.DictWriter(csv_buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(result["rows"])
    texts = {
        "benchmark.md": markdown_table(result),
        "benchmark.csv": csv_buf.getvalue(),
        "benchmark.json": json.dumps(result, indent=2) + "\n",
    }
    for name, text in texts.items():
        atomic_write_text(text, out / name)
    return [out / name for name in texts]

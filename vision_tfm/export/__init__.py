"""Edge export: ONNX (fp32, dynamic shapes, int8), parity on real images, a benchmark table.

``vtfm export`` and ``vtfm benchmark`` are thin wrappers over :func:`export_checkpoint` and
:func:`benchmark_checkpoint`. Needs the ``dev`` extra (onnx, onnxruntime, onnxscript);
the OpenVINO rows need ``openvino`` (in ``dev``, or the ``openvino`` extra alone).
"""

from .benchmark import FORMATS, BenchOptions, benchmark_checkpoint
from .flops import count_flops, cpu_description, matmul_ceiling
from .onnx import ParityError, check_parity, export_onnx
from .pipeline import ExportOptions, export_checkpoint
from .quantize import calibration_images, quantize_int8
from .source import ExportSource, load_source
from .tables import markdown_table, write_tables

__all__ = [
    "FORMATS",
    "BenchOptions",
    "ExportOptions",
    "ExportSource",
    "ParityError",
    "benchmark_checkpoint",
    "calibration_images",
    "check_parity",
    "count_flops",
    "cpu_description",
    "export_checkpoint",
    "export_onnx",
    "load_source",
    "markdown_table",
    "matmul_ceiling",
    "quantize_int8",
    "write_tables",
]

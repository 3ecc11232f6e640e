"""int8 through onnxruntime's quantiser: dynamic (weights int8, activations scaled per call)
and static QDQ, in the layout onnxruntime runs fast or the one OpenVINO runs fast.

All start from ``quant_pre_process`` (symbolic shape inference and graph fusions), which
lets the quantiser see through the exporter's shape arithmetic. Every mode calibrates on real
images (:func:`calibration_images`): static modes for their activation ranges, dynamic for
SmoothQuant's channel balancing (:mod:`.smoothing`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import torch
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quant_pre_process,
    quantize_dynamic,
    quantize_static,
)

from .smoothing import SMOOTH_ALPHA, smooth_onnx
from .source import INPUT_NAME, ExportSource

INT8_MODES = ("dynamic", "static", "openvino")
# benchmark / metadata format name -> mode; the openvino file runs in OpenVINO
INT8_FORMATS = {
    "onnx-int8-dynamic": "dynamic",
    "onnx-int8-static": "static",
    "openvino-int8": "openvino",
}
DYNAMIC_OPS = ("MatMul",)
STATIC_OPS = ("MatMul", "Gemm", "Conv")
# SmoothQuant alpha per mode: dynamic int8 scales a LayerNorm output per tensor at run time,
# so its outlier channels cost the most there (benchmarks/int8_smoothing.py)
SMOOTHED = {"dynamic": SMOOTH_ALPHA}
STATIC_LAYOUTS: dict[str, dict] = {
    # onnxruntime: u8 activations x s8 weights is its fast VNNI path on x86 CPUs.
    "static": {"activation_type": QuantType.QUInt8, "extra_options": {}},
    # OpenVINO's CPU plugin fuses symmetric s8 Q/DQ into its int8 (VNNI / AMX) convolutions,
    # FCs and attention; u8 zero points become a Subtract on every activation instead.
    # A quantised op's output is re-quantised only for the next one: the grasp maps stay fp32.
    "openvino": {
        "activation_type": QuantType.QInt8,
        "extra_options": {
            "ActivationSymmetric": True,
            "OpTypesToExcludeOutputQuantization": list(STATIC_OPS),
        },
    },
}


class TensorCalibrationReader(CalibrationDataReader):
    """Feeds preprocessed ``(N, C, H, W)`` images to the calibrator in fixed batches."""

    def __init__(
        self, images: torch.Tensor, batch_size: int = 16, input_name: str = INPUT_NAME
    ) -> None:
        self.batches = [
            {input_name: b.contiguous().numpy()} for b in images.float().split(batch_size)
        ]
        self.rewind()

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feed, None)

    def rewind(self) -> None:
        self.feed = iter(self.batches)


@contextmanager
def _quiet() -> Iterator[None]:
    """The quantiser logs advice at INFO/WARNING for every run; keep the CLI's output short."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


@contextmanager
def _inside(folder: str) -> Iterator[None]:
    """Run in ``folder``: on a failed symbolic shape inference, onnxruntime dumps
    ``sym_shape_infer_temp.onnx`` and a uuid-named ``.data`` file into the working directory.
    """
    prev = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(prev)


def quantize_int8(
    fp32_path: str | Path,
    out_path: str | Path,
    mode: str,
    calib: torch.Tensor,
    *,
    smooth: float | None = None,
    per_channel: bool = True,
) -> None:
    """Quantise an fp32 ONNX file to int8 with onnxruntime.

    Args:
        fp32_path: The exported fp32 model (its ``.data`` file beside it).
        out_path: Where to write the int8 model (a single file: int8 weights are small).
        mode: "dynamic" (activations scaled per call), "static" (QDQ, for onnxruntime) or
            "openvino" (the same, laid out for OpenVINO: ``STATIC_LAYOUTS``).
        calib: Preprocessed calibration images, for SmoothQuant's ``max|x|`` and the static
            modes' activation ranges.
        smooth: SmoothQuant's alpha; None: the mode's default (``SMOOTHED``), 0: off.
        per_channel: One weight scale per output channel instead of one per tensor.
        See ``benchmarks/int8_smoothing.py`` for what each costs and buys.
    """
    if mode not in INT8_MODES:
        raise ValueError(f"int8 mode {mode!r} is unknown; expected one of {INT8_MODES}")
    if calib is None or len(calib) == 0:
        raise ValueError(f"{mode} int8 needs calibration images")
    alpha = SMOOTHED.get(mode, 0.0) if smooth is None else smooth
    fp32_path, out_path = Path(fp32_path).resolve(), Path(out_path).resolve()
    with tempfile.TemporaryDirectory() as tmp, _quiet(), _inside(tmp):
        pre = Path(tmp) / "pre.onnx"
        # One self-contained file: quant_pre_process loses external data on its way through.
        single = Path(tmp) / "fp32.onnx"
        model = onnx.load(str(fp32_path))
        onnx.save(model, str(single))
        batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value or 16  # 0: dynamic
        try:
            quant_pre_process(str(single), str(pre))
        except Exception:
            # ORT's symbolic shape inference gives up on some dynamic-H/W shape arithmetic
            # (symbolic padding, resampling); ONNX shape inference alone is enough to quantise.
            quant_pre_process(str(single), str(pre), skip_symbolic_shape=True)
        reader = TensorCalibrationReader(calib, batch_size=batch)
        if alpha:
            balanced = onnx.load(str(pre))
            smooth_onnx(balanced, reader.batches, alpha)
            onnx.save(balanced, str(pre))
        if mode == "dynamic":
            # Weight MatMuls only: ORT's dynamic ConvInteger is slower than its fp32 Conv, it has
            # no dynamic Gemm, and attention's q@k / attn@v would quantise two activations.
            quantize_dynamic(
                str(pre),
                str(out_path),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=list(DYNAMIC_OPS),
                extra_options={"MatMulConstBOnly": True},
                per_channel=per_channel,
            )
        else:
            # Q/DQ around norms, softmax and residual adds cost accuracy and buy no speed.
            quantize_static(
                str(pre),
                str(out_path),
                reader,
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                op_types_to_quantize=list(STATIC_OPS),
                **STATIC_LAYOUTS[mode],
            )


# --- calibration images ------------------------------------------------------------------------


def calibration_images(
    source: ExportSource, calib_data: str | Path | None = None, n: int = 256, seed: int = 0
) -> torch.Tensor:
    """``n`` preprocessed calibration images, drawn at random (seeded) from the given data.

    Without ``calib_data`` the checkpoint's training split is used (with eval preprocessing),
    so calibration never sees the val images the int8 model is scored on.

    Raises:
        ValueError: ``calib_data`` holds no images in a layout this function reads (that it
            exists is checked where the flag enters: ``vtfm export`` / ``vtfm benchmark``).
    """
    if calib_data is None:
        ds = source.datasets()[0]
    else:
        ds = source.folder_dataset(Path(calib_data), "calibration images")
    if len(ds) == 0:
        raise ValueError("the calibration data holds no images")
    idx = np.sort(np.random.default_rng(seed).permutation(len(ds))[:n])
    return torch.stack([ds[int(i)][0] for i in idx])

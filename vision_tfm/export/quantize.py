"""int8 through onnxruntime's quantiser: dynamic (weights int8, activations scaled per call)
and static QDQ, in the layout onnxruntime runs fast or the one OpenVINO runs fast.

All start from ``quant_pre_process`` (symbolic shape inference and graph fusions), which
lets the quantiser see through the exporter's shape arithmetic. Every mode calibrates on real
images (:func:`calibration_images`): static modes for their activation ranges, dynamic for
SmoothQuant's channel balancing (:mod:`.smoothing`) and the choice of its alpha.

Each mode has a recipe (``RECIPES``): the SmoothQuant alpha (a number, "auto" or 0 for off)
and whether the projections that feed attention scores (q and k, fused with v in one MatMul)
stay fp32. Softmax turns their rounding into attention-weight error in every later block;
on a trained ViT-S/16 they carried half of dynamic int8's logit error from a quarter of its
MatMuls (``benchmarks/int8_smoothing.py``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

from ..errors import ConfigError, DataError
from .onnx import ort_session
from .smoothing import channel_ranges, smooth_onnx
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


@dataclass(frozen=True)
class Int8Recipe:
    """How one int8 file was made; recorded in its JSON."""

    smoothquant_alpha: float  # 0: no smoothing
    fp32_matmuls: int  # weight MatMuls kept in fp32 (attention-score projections)


# "auto": the alpha among SMOOTH_ALPHAS whose int8 output is nearest fp32 on the calibration
# images. Dynamic int8 scales a LayerNorm output per tensor at run time, so its outlier
# channels cost the most there; static modes gained nothing from smoothing.
RECIPES: dict[str, dict[str, Any]] = {
    "dynamic": {"smooth": "auto", "scores_fp32": True},
    "static": {"smooth": 0.0, "scores_fp32": False},
    "openvino": {"smooth": 0.0, "scores_fp32": False},
}
# --int8-scores: "auto" follows the recipe; "int8" buys dynamic int8 speed for agreement
SCORES = {"auto": None, "fp32": True, "int8": False}
SMOOTH_ALPHAS = (0.5, 0.65, 0.8, 0.95)  # 0.5: the paper's default; 1 moves all range to weights
STATIC_LAYOUTS: dict[str, dict] = {
    # onnxruntime: u8 activations x s8 weights is its fast int8 dot-product path on x86.
    "static": {"activation_type": QuantType.QUInt8, "extra_options": {}},
    # OpenVINO's CPU plugin fuses symmetric s8 Q/DQ into its int8 convolutions, FCs and
    # attention; u8 zero points become a Subtract on every activation instead.
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


# Ops that carry q and k from their projection to the score MatMul and the scores on to the
# softmax without mixing tokens: layout changes (follow the data input), and elementwise ops
# with a constant (the bias, the 1/sqrt(d) scale, Swin's relative bias and shift mask).
_LAYOUT = {"Reshape", "Transpose", "Split", "Slice", "Gather", "Squeeze", "Unsqueeze", "Identity"}
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Where", "Cast"}


def score_projections(model: onnx.ModelProto) -> list[str]:
    """Names of the weight MatMuls whose outputs meet in an attention score product.

    A score product is a MatMul of two activations whose output reaches a Softmax through
    layout and elementwise ops, or the q and k inputs of an opset-23 Attention. Walking back
    from each of its inputs through the same ops (taking the one input that is not constant)
    ends at the projection that made it.
    """
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    const = {t.name for t in g.initializer}
    for n in g.node:  # topological order: shape arithmetic on constants is constant too
        if n.op_type in ("Constant", "Shape") or all(i in const for i in n.input if i):
            const.update(n.output)
    carry = _LAYOUT | _ELEMENTWISE

    def weight(n: onnx.NodeProto) -> bool:
        return n.op_type == "MatMul" and n.input[1] in const

    def to_softmax(t: str, hops: int = 8) -> bool:
        return hops > 0 and any(
            c.op_type == "Softmax" or (c.op_type in carry and to_softmax(c.output[0], hops - 1))
            for c in consumers.get(t, [])
        )

    def projection(t: str, hops: int = 16) -> onnx.NodeProto | None:
        n = producer.get(t)
        if n is None or hops == 0 or weight(n):
            return n
        if n.op_type not in carry:
            return None
        data = n.input[:1] if n.op_type in _LAYOUT else [i for i in n.input if i not in const]
        return projection(data[0], hops - 1) if len(data) == 1 else None

    found: list[str] = []
    for n in g.node:
        if n.op_type == "Attention":  # opset >= 23: q @ k and its softmax inside one op
            scored = n.input[:2]
        elif n.op_type == "MatMul" and not weight(n) and to_softmax(n.output[0]):
            scored = n.input
        else:
            continue
        for t in scored:
            p = projection(t)
            if p is not None and weight(p) and p.name not in found:
                found.append(p.name)
    return found


def _output_error(
    path: Path, feeds: list[dict[str, np.ndarray]], ref: list[list[np.ndarray]]
) -> float:
    """Squared error of every output against fp32 (``ref``, per feed), each relative to the
    output's variance, summed. Batch by batch: two sets of a grasp model's maps for 256
    images, in float64, would take over a gigabyte."""
    sess = ort_session(path)
    n = np.zeros(len(ref[0]))
    total, total_sq, err = n.copy(), n.copy(), n.copy()
    for feed, want in zip(feeds, ref, strict=True):
        for k, (a, b) in enumerate(zip(want, sess.run(None, feed), strict=True)):
            a64 = a.astype(np.float64)
            n[k] += a64.size
            total[k] += a64.sum()
            total_sq[k] += np.square(a64).sum()
            err[k] += np.square(a64 - b).sum()
    var = np.maximum(total_sq / n - (total / n) ** 2, 1e-12)
    return float(np.sum(err / n / var))


def quantize_int8(
    fp32_path: str | Path,
    out_path: str | Path,
    mode: str,
    calib: torch.Tensor,
    *,
    smooth: float | str | None = None,
    per_channel: bool = True,
    scores_fp32: bool | None = None,
) -> Int8Recipe:
    """Quantise an fp32 ONNX file to int8 with onnxruntime.

    Args:
        fp32_path: The exported fp32 model (its ``.data`` file beside it).
        out_path: Where to write the int8 model (a single file: int8 weights are small).
        mode: "dynamic" (activations scaled per call), "static" (QDQ, for onnxruntime) or
            "openvino" (the same, laid out for OpenVINO: ``STATIC_LAYOUTS``).
        calib: Preprocessed calibration images, for SmoothQuant's ``max|x|`` and alpha, and
            the static modes' activation ranges.
        smooth: SmoothQuant's alpha, "auto" (searched over ``SMOOTH_ALPHAS`` on ``calib``) or
            0 (off); None: the mode's recipe (``RECIPES``).
        per_channel: One weight scale per output channel instead of one per tensor.
        scores_fp32: Keep the attention-score projections (:func:`score_projections`) in
            fp32; None: the mode's recipe.
        See ``benchmarks/int8_smoothing.py`` for what each costs and buys.

    Returns:
        The alpha used and how many MatMuls stayed fp32.
    """
    if mode not in INT8_MODES:
        raise ConfigError(f"int8 mode {mode!r} is unknown; expected one of {INT8_MODES}")
    if calib is None or len(calib) == 0:
        raise ConfigError(f"{mode} int8 needs calibration images")
    smooth = RECIPES[mode]["smooth"] if smooth is None else smooth
    scores_fp32 = RECIPES[mode]["scores_fp32"] if scores_fp32 is None else scores_fp32
    if smooth != "auto" and not (isinstance(smooth, int | float) and 0 <= smooth <= 1):
        raise ConfigError(f"SmoothQuant alpha must be 'auto' or in [0, 1], got {smooth!r}")
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
        base = onnx.load(str(pre))
        keep = score_projections(base) if scores_fp32 else []
        if smooth == 0:
            _quantize(pre, out_path, mode, reader, per_channel, keep)
            return Int8Recipe(0.0, len(keep))
        ranges = channel_ranges(base, reader.batches)
        alphas = SMOOTH_ALPHAS if smooth == "auto" else (float(smooth),)
        if not ranges.amax:  # no norm to balance: every alpha gives the same file
            alphas = (0.0,)
        ref = None  # fp32 outputs on the calibration images, to score each alpha against
        if len(alphas) > 1:
            fp32 = ort_session(pre)
            ref = [fp32.run(None, f) for f in reader.batches]
        best, chosen = math.inf, alphas[0]
        for alpha in alphas:
            balanced = onnx.load(str(pre))
            smooth_onnx(balanced, ranges, alpha)
            smoothed, cand = Path(tmp) / "smoothed.onnx", Path(tmp) / "int8.onnx"
            onnx.save(balanced, str(smoothed))
            _quantize(smoothed, cand, mode, reader, per_channel, keep)
            err = 0.0 if ref is None else _output_error(cand, reader.batches, ref)
            if err < best:
                best, chosen = err, alpha
                shutil.move(cand, out_path)
        return Int8Recipe(chosen, len(keep))


def _quantize(
    src: Path,
    out: Path,
    mode: str,
    reader: TensorCalibrationReader,
    per_channel: bool,
    keep: list[str],
) -> None:
    if mode == "dynamic":
        # Weight MatMuls only: ORT's dynamic ConvInteger is slower than its fp32 Conv, it has
        # no dynamic Gemm, and attention's q@k / attn@v would quantise two activations.
        quantize_dynamic(
            str(src),
            str(out),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=list(DYNAMIC_OPS),
            extra_options={"MatMulConstBOnly": True},
            per_channel=per_channel,
            nodes_to_exclude=keep,
        )
    else:
        # Q/DQ around norms, softmax and residual adds cost accuracy and buy no speed.
        reader.rewind()
        quantize_static(
            str(src),
            str(out),
            reader,
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            op_types_to_quantize=list(STATIC_OPS),
            nodes_to_exclude=keep,
            **STATIC_LAYOUTS[mode],
        )


def check_int8_scores(value: str) -> None:
    """``--int8-scores`` is one of ``SCORES``."""
    if value not in SCORES:
        raise ConfigError(f"--int8-scores must be one of {', '.join(SCORES)}, got {value!r}")


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
        raise DataError("the calibration data holds no images")
    idx = np.sort(np.random.default_rng(seed).permutation(len(ds))[:n])
    return torch.stack([ds[int(i)][0] for i in idx])

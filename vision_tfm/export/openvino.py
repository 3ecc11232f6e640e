"""OpenVINO as a second runtime for the exported ONNX file (the ``openvino`` extra).

It reads the ``model.onnx`` onnxruntime runs, so the runtimes compare on one graph. Its CPU
plugin picks bf16 by itself on CPUs with bf16 units: the precision is always set, and the
row reports the one the compiled model runs in (fp32 where bf16 cannot be built, as when
``ONEDNN_MAX_CPU_ISA`` holds oneDNN below bf16 on a CPU that has bf16 units). Loaded into a
process that later ran ``torch.compile``, the plugin made that compile segfault, so tests run
OpenVINO in a child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, DependencyError
from .source import Runner

OV_PRECISIONS = {"fp32": "f32", "bf16": "bf16"}  # our name -> OpenVINO's hint value
_OUR_NAME = {v: k for k, v in OV_PRECISIONS.items()}


def _openvino() -> Any:
    try:
        import openvino
    except ImportError:
        raise DependencyError(
            "openvino is not installed; pip install -e '.[openvino]' to benchmark it"
        ) from None
    return openvino


def openvino_version() -> str | None:
    """The installed OpenVINO's version, or None without it."""
    try:
        return _openvino().__version__
    except DependencyError:
        return None


def openvino_runner(path: str | Path, threads: int, precision: str = "fp32") -> tuple[Runner, str]:
    """Compile ``path`` for the CPU plugin: ``(runner, the precision it really runs in)``.

    Args:
        path: An ONNX file (external data beside it).
        threads: Inference threads, one stream (latency mode, as the other formats run).
        precision: ``"fp32"`` (parity with PyTorch) or ``"bf16"``.
    """
    if precision not in OV_PRECISIONS:
        raise ConfigError(f"OpenVINO precision {precision!r} is unknown; expected fp32 or bf16")
    ov = _openvino()
    config = {
        "INFERENCE_PRECISION_HINT": OV_PRECISIONS[precision],
        "INFERENCE_NUM_THREADS": threads,
        "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY",
    }
    core = ov.Core()
    try:
        compiled = core.compile_model(str(path), "CPU", config)
    except RuntimeError:
        if precision == "fp32":
            raise
        # the plugin lists BF16 from the CPU's own flags, but the oneDNN inside it also obeys
        # ONEDNN_MAX_CPU_ISA: held below bf16, no bf16 primitive can be built. Run fp32 and
        # say so, as on a CPU without bf16 units.
        compiled = core.compile_model(
            str(path), "CPU", {**config, "INFERENCE_PRECISION_HINT": "f32"}
        )
    used = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # "f32" | "bf16"
    request = compiled.create_infer_request()
    outputs = list(compiled.outputs)

    def run(x: torch.Tensor) -> list[torch.Tensor]:
        res = request.infer({0: x.detach().float().contiguous().numpy()})
        # the request reuses its output buffers on the next call: copy them out
        return [torch.from_numpy(res[o].copy()) for o in outputs]

    return run, _OUR_NAME.get(used, used)

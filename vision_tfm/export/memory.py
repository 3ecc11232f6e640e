"""Peak memory of one format: a fresh process loads the runtime and the model, runs it.

Measured in a child so that formats do not share a heap (torch's allocator keeps what the
last format freed); the child imports only what its runtime needs, so the figure is what a
deployment of that format would hold.

Run as a script (``python memory.py spec.json``), not as ``-m vision_tfm...``: the package's
``__init__`` would import torch into every child.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CALLS = 3  # forward passes before the peak is read: the first allocates, the rest reuse


def peak_rss_mb(
    kind: str, model: str | os.PathLike, x: Any, threads: int, timeout: float = 600.0
) -> float:
    """Peak resident memory (MB, 10^6 bytes) of a process that runs ``model`` on ``x``.

    Args:
        kind: ``onnx`` (onnxruntime), ``openvino``, ``openvino-bf16``, ``torch``,
            ``torch-bf16``, ``torch-optimized`` or ``torch-compiled`` (a module saved whole
            with ``torch.save``; the last two are optimised in the child).
        model: The file the runtime loads.
        x: The input, a float32 NCHW numpy array (or a tensor).
        threads: Intra-op threads, as in the timed runs.

    Raises:
        ExportError: The child failed; its last stderr line says why.
    """
    import numpy as np

    from ..errors import ExportError  # here, not above: the child runs this file as a script

    # the child must import this vision_tfm (a pickled module names its classes), not another
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        np.save(Path(tmp) / "x.npy", np.asarray(x, dtype=np.float32))
        spec = {"kind": kind, "model": str(model), "input": str(Path(tmp) / "x.npy")}
        (Path(tmp) / "spec.json").write_text(json.dumps({**spec, "threads": threads}))
        done = subprocess.run(
            [sys.executable, __file__, str(Path(tmp) / "spec.json")],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": path},
        )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExportError(f"memory child ({kind}) failed: {last}")
    return float(done.stdout.strip().splitlines()[-1])


def _run(spec: dict[str, Any]) -> float:
    import numpy as np

    x = np.load(spec["input"])
    kind, path, threads = spec["kind"], spec["model"], spec["threads"]
    if kind == "onnx":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        for _ in range(CALLS):
            sess.run(None, {name: x})
    elif kind.startswith("openvino"):
        import openvino as ov

        precision = "bf16" if kind.endswith("-bf16") else "f32"
        config = {
            "INFERENCE_PRECISION_HINT": precision,
            "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
        }
        request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
        for _ in range(CALLS):
            request.infer({0: x})
    elif kind.startswith("torch"):
        import torch

        torch.set_num_threads(threads)
        model = torch.load(path, weights_only=False)  # our own hand-off file, written just now
        if kind in ("torch-optimized", "torch-compiled"):
            from vision_tfm.optimize import optimize_for_inference

            model = optimize_for_inference(model, compile=kind == "torch-compiled")
        t = torch.from_numpy(x)
        dtype = torch.bfloat16 if kind.endswith("-bf16") else torch.float32
        with torch.inference_mode(), torch.autocast("cpu", dtype, enabled=dtype != torch.float32):
            for _ in range(CALLS):
                model(t)
    else:
        sys.exit(f"unknown runtime kind {kind!r}")  # the parent reports the last line
    return _peak_rss_bytes() / 1e6


def _peak_rss_bytes() -> int:
    """This process's peak RSS. Linux's ``ru_maxrss`` survives ``exec``: a child forked from
    the benchmark would report at least the benchmark's own peak. ``VmHWM`` is per image."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, else KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit


if __name__ == "__main__":
    # the script's own folder shadows onnx and openvino with this package's modules
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    print(_run(json.loads(Path(sys.argv[1]).read_text())))

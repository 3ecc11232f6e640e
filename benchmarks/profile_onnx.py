"""Where an ONNX model spends its time in onnxruntime: self time per op type, per run.

    vtfm export --checkpoint runs/cls/hybrid_mnist-.../best.pt --int8 dynamic --out /tmp/h/m.onnx
    python benchmarks/profile_onnx.py /tmp/h/m.onnx /tmp/h/m-int8-dynamic.onnx --threads 1

Runs each model (after the graph optimisations onnxruntime applies in a real session) with
its profiler on and prints, per model, the op types by summed kernel time. It answers "how
much faster could int8 make this": the quantised ops' share is the most any int8 scheme can
remove. Profiling adds a few microseconds per node, so read shares, not absolute latencies
(``vtfm benchmark`` measures those).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np
import onnxruntime as ort

from vision_tfm.export.onnx import ORT_SESSION_CONFIG


def input_shape(dims: list, img_size: int) -> list[int]:
    """The profiled input: a dynamic batch is 1 and dynamic spatial dims are ``img_size``
    (a dynamic-H/W export would otherwise be profiled at 1x1 pixels)."""
    return [d if isinstance(d, int) else 1 if i < 2 else img_size for i, d in enumerate(dims)]


def profile(
    path: str, threads: int, runs: int, img_size: int = 224
) -> tuple[dict[str, float], dict[str, int], list[int]]:
    """Microseconds and node count per op type, per run, and the input shape profiled."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    for key, value in ORT_SESSION_CONFIG.items():  # spinning as the shipped sessions spin
        so.add_session_config_entry(key, value)
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        inp = sess.get_inputs()[0]
        shape = input_shape(inp.shape, img_size)
        x = {inp.name: np.random.default_rng(0).random(shape, dtype=np.float32)}
        for _ in range(runs):
            sess.run(None, x)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    time: dict[str, float] = collections.Counter()
    count: dict[str, int] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            time[e["args"]["op_name"]] += e["dur"] / runs
            count[e["args"]["op_name"]] += 1
    return dict(time), {k: v // runs for k, v in count.items()}, shape


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help=".onnx files (batch 1 where the batch is dynamic)")
    p.add_argument("--img-size", type=int, default=224, help="H and W where they are dynamic")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    for path in args.models:
        time, count, shape = profile(path, args.threads, args.runs, args.img_size)
        total = sum(time.values())
        print(
            f"\n{path}: {total:.0f} us of kernel time per run, {sum(count.values())} nodes "
            f"(input {'x'.join(map(str, shape))})\n"
        )
        print("| op type | us per run | share | nodes |\n|---|---|---|---|")
        for op in sorted(time, key=lambda k: -time[k])[: args.top]:
            print(f"| {op} | {time[op]:.1f} | {100 * time[op] / total:.0f}% | {count[op]} |")


if __name__ == "__main__":
    main()

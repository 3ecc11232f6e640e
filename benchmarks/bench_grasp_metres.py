"""What ``vtfm grasp --intrinsics`` adds to one 640x480 view's prediction, against the issue's
5 ms target.

Run: ``python benchmarks/bench_grasp_metres.py [--model grasp_hybrid_s] [--runs 50]`` (about
a minute on 2 cores). A freshly initialised model (the cost does not depend on its weights)
predicts the top 5 grasps on a Cornell-sized view with a real depth map; the prediction and
the prediction followed by the conversion to metres run interleaved, so load drifts hit both
alike. The added time is the difference of medians; for an RGB model, decoding the depth file
is added too and timed on its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vision_tfm.config import apply_overrides, config_to_dict
from vision_tfm.data.grasp import load_depth
from vision_tfm.grasp.camera import Intrinsics
from vision_tfm.io import atomic_save
from vision_tfm.tasks.grasp import GraspConfig, build_grasp_model
from vision_tfm.tasks.grasp.predict import GraspPredictor

TARGET_MS = 5.0
K = Intrinsics(570.3, 570.3, 319.5, 239.5)


def _view(folder: Path) -> tuple[Path, Path]:
    """A 640x480 RGB view and a float depth map of a box on a table, with sensor holes."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    depth = np.full((480, 640), 0.65, np.float32)
    depth[180:300, 250:400] = 0.58  # the box's top
    depth[rng.random(depth.shape) < 0.05] = np.nan
    Image.fromarray(rgb).save(folder / "pcd0100r.png")
    Image.fromarray(depth).save(folder / "pcd0100d.tiff")
    return folder / "pcd0100r.png", folder / "pcd0100d.tiff"


def _checkpoint(folder: Path, model: str, inp: str) -> Path:
    cfg = apply_overrides(GraspConfig(), {"model.name": model, "data.input": inp})
    meta = {
        "task": "grasp",
        "model_name": model,
        "input": inp,
        "in_chans": {"rgb": 3, "depth": 1, "rgbd": 4}[inp],
    }
    torch.manual_seed(0)
    ckpt = folder / f"{model}-{inp}.pt"
    state = build_grasp_model(cfg).state_dict()
    atomic_save({"model": state, "config": config_to_dict(cfg), "meta": meta}, ckpt)
    return ckpt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="grasp_hybrid_s")
    p.add_argument("--input", default="rgbd", choices=("rgb", "depth", "rgbd"))
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        rgb, depth = _view(Path(tmp))
        predictor = GraspPredictor(_checkpoint(Path(tmp), args.model, args.input))
        view = predictor.load(rgb, depth, keep_depth=True)
        plain, metric, convert, decode = [], [], [], []
        for i in range(args.runs + 5):  # interleaved; the first 5 warm up
            t0 = time.perf_counter()
            grasps = predictor.grasps([view], 5)[0]
            t1 = time.perf_counter()
            grasps = predictor.grasps([view], 5)[0]
            t2 = time.perf_counter()
            metres = predictor.in_metres(view, grasps, K)
            t3 = time.perf_counter()
            load_depth(depth)
            t4 = time.perf_counter()
            if i >= 5:
                plain.append(t1 - t0)
                metric.append(t3 - t1)
                convert.append(t3 - t2)
                decode.append(t4 - t3)
    ms = {
        k: 1e3 * statistics.median(v)
        for k, v in {"plain": plain, "metric": metric, "convert": convert, "decode": decode}.items()
    }
    added = ms["convert"] + (ms["decode"] if args.input == "rgb" else 0.0)
    print(
        f"{args.model} ({args.input}), 640x480 view, top 5, {args.threads} threads, "
        f"load {os.getloadavg()[0]:.2f}, median of {args.runs}:"
    )
    print(f"  prediction {ms['plain']:.2f} ms; with metres {ms['metric']:.2f} ms")
    print(
        f"  conversion of {len(metres)} grasps {ms['convert']:.3f} ms; depth decode "
        f"{ms['decode']:.3f} ms ({'added' if args.input == 'rgb' else 'already read'})"
    )
    verdict = "ok" if added <= TARGET_MS else "over"
    print(f"added by --intrinsics: {added:.3f} ms (target <= {TARGET_MS:g} ms: {verdict})")


if __name__ == "__main__":
    main()

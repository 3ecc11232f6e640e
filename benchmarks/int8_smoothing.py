"""Does int8 keep a trained classifier's top-1? SmoothQuant, weight scales and fp32 scores.

    python benchmarks/int8_smoothing.py --checkpoint runs/cls/vit_small_patch16_224-.../best.pt

Dynamic int8 (onnxruntime's ``quantize_dynamic``, the ``onnx-int8-dynamic`` format) quantises
each MatMul's input per tensor at run time. This script scores, against fp32 PyTorch on the
checkpoint's val images, each int8 mode with and without:

- per-channel weights: one weight scale per output channel (static modes always have them);
- SmoothQuant: channel balancing (Xiao et al. 2023, ``vision_tfm.export.smoothing``) at
  ``--alpha`` (the paper's 0.5) or "auto" (the alpha of ``SMOOTH_ALPHAS`` whose int8 output
  is nearest fp32 on the calibration images); ``max|x|`` and the choice come from training
  images, never from the scored ones;
- fp32 score projections: the MatMuls whose outputs meet in attention's q @ k stay fp32
  (``score_projections``), because softmax amplifies their rounding.

Every variant is ``vision_tfm.export.quantize.quantize_int8`` with explicit settings; the row
marked "default" is what ``vtfm export`` / ``vtfm benchmark`` ship (``RECIPES``). Each file's
batch-1 latency is timed against ORT fp32 in interleaved rounds.

``--calib-seeds N`` then re-quantises the shipped dynamic variant with N random calibration
draws, as ``vtfm export`` draws them: an agreement near a target must hold across draws, not
for one lucky subset.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vision_tfm.export.flops import cpu_description
from vision_tfm.export.onnx import export_onnx, ort_runner, ort_session
from vision_tfm.export.openvino import openvino_runner, openvino_version
from vision_tfm.export.quantize import RECIPES, calibration_images, quantize_int8
from vision_tfm.export.source import load_source


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--calib", type=int, default=128, help="training images for max|x|")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10, help="timing rounds of 5 runs each")
    p.add_argument(
        "--calib-seeds",
        type=int,
        default=0,
        help="then quantise the shipped dynamic int8 again with this many random calibration "
        "draws (as vtfm export draws them: --calib-size images, seeds 0, 1, ...)",
    )
    p.add_argument("--calib-size", type=int, default=256)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    src = load_source(a.checkpoint)
    val = src.batches("val", 50)
    calib = torch.cat([b[0] for b in src.batches("train", 32, limit=a.calib)])
    ref = src.evaluate(src.torch_runner(), val)
    top1 = ref.outputs[0].argmax(1)
    print(
        f"fp32 PyTorch: top-1 {ref.metric:.4f} on {len(top1)} val images, "
        f"{len(set(top1.tolist()))} distinct top-1 classes"
    )
    example = val[0][0][:1]
    # (mode, SmoothQuant alpha, per-channel weights, score projections fp32)
    variants: list[tuple[str, float | str, bool, bool]] = [
        ("dynamic", 0.0, False, False),
        ("dynamic", 0.0, True, False),
        ("dynamic", a.alpha, True, False),
        ("dynamic", "auto", True, False),
        ("dynamic", a.alpha, True, True),
        ("dynamic", "auto", True, True),
        ("static", 0.0, True, False),
        ("static", 0.0, True, True),
    ]
    if openvino_version() is not None:
        variants += [("openvino", 0.0, True, False), ("openvino", 0.0, True, True)]
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        export_onnx(src.model, example, fp32, output_names=["logits"])
        runners = {"onnx fp32": ort_runner(ort_session(fp32, a.threads))}
        for mode, alpha, pc, scores in variants:
            path = Path(tmp) / f"{len(runners)}.onnx"
            r = quantize_int8(
                fp32, path, mode, calib, smooth=alpha, per_channel=pc, scores_fp32=scores
            )
            recipe = RECIPES[mode]
            default = (alpha, pc, scores) == (recipe["smooth"], True, recipe["scores_fp32"])
            name = (
                f"{mode}, {'per-channel' if pc else 'per-tensor'} weights, "
                + (
                    f"SmoothQuant {alpha} (chose {r.smoothquant_alpha:g})"
                    if alpha == "auto"
                    else f"SmoothQuant {alpha:g}"
                    if alpha
                    else "no smoothing"
                )
                + f", {'scores fp32' if scores else 'all int8'}"
                + (" (default)" if default else "")
            )
            run = (
                openvino_runner(path, a.threads)[0]
                if mode == "openvino"
                else ort_runner(ort_session(path, a.threads))
            )
            runners[name] = run
        times: dict[str, list[float]] = {k: [] for k in runners}
        for run in runners.values():
            for _ in range(5):
                run(example)
        for _ in range(a.rounds):
            for k, run in runners.items():
                t = time.perf_counter()
                for _ in range(5):
                    run(example)
                times[k].append((time.perf_counter() - t) / 5)
        base = statistics.median(times["onnx fp32"])
        print(
            "\n| int8 variant | top-1 | top-1 agree | max abs diff | b1 ms | "
            "speed vs ORT fp32 |\n|---|---|---|---|---|---|"
        )
        for k, run in runners.items():
            ev = src.evaluate(run, val)
            agree = ev.top1_agreement(ref)
            diff = (ev.outputs[0] - ref.outputs[0]).abs().max().item()
            ms = statistics.median(times[k])
            print(
                f"| {k} | {ev.metric:.4f} | {agree:.4f} | {diff:.3f} | {ms * 1e3:.2f} | "
                f"{base / ms:.2f}x |"
            )
        if a.calib_seeds:
            print(f"\nshipped dynamic int8, {a.calib_size} calibration images per draw:")
            draws: list[float] = []
            for seed in range(a.calib_seeds):
                draw = calibration_images(src, None, a.calib_size, seed=seed)
                path = Path(tmp) / f"seed{seed}.onnx"
                r = quantize_int8(fp32, path, "dynamic", draw)
                ev = src.evaluate(ort_runner(ort_session(path, a.threads)), val)
                draws.append(ev.top1_agreement(ref))
                print(
                    f"  seed {seed}: SmoothQuant {r.smoothquant_alpha:g}, top-1 {ev.metric:.4f}, "
                    f"top-1 agree {draws[-1]:.4f}"
                )
            spread = statistics.stdev(draws) if len(draws) > 1 else 0.0
            print(
                f"  top-1 agree over {len(draws)} draws: {statistics.mean(draws):.4f} ± "
                f"{spread:.4f} (min {min(draws):.4f}, max {max(draws):.4f})"
            )
    print(f"\n{cpu_description()}; {a.threads} threads; agreement against fp32 PyTorch")


if __name__ == "__main__":
    main()

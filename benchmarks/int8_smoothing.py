"""Does dynamic int8 keep a trained classifier's top-1? Four weight/activation treatments.

    python benchmarks/int8_smoothing.py --checkpoint runs/cls/vit_small_patch16_224-.../best.pt

Dynamic int8 (onnxruntime's ``quantize_dynamic``, the ``onnx-int8-dynamic`` format) quantises
each MatMul's input per tensor at run time. A LayerNorm output whose channels differ widely in
range loses its small channels to the large ones' step. This script scores, against fp32
PyTorch on the checkpoint's val images:

- ``shipped``: per-tensor weights, as ``vtfm export --int8 dynamic`` writes today;
- ``per-channel``: one weight scale per output channel;
- ``smoothed``: SmoothQuant's channel balancing (Xiao et al. 2023) first: for each pre-norm
  block, every input channel j of ``attn.qkv`` and ``mlp.fc1`` is divided by
  ``s_j = max|x_j|^a / max|W_:,j|^(1-a)`` (``a`` = ``--alpha``, the paper's 0.5), folded
  into the LayerNorm's weight and bias, and its weight column multiplied by ``s_j``. The fp32
  function is unchanged (the script prints the max abs difference); ``max|x_j|`` comes from
  training images, never from the scored ones;
- ``smoothed + per-channel``: both.

Each variant is ``vision_tfm.export.quantize.quantize_int8(..., "dynamic")``, so "shipped"
follows the package; each file's batch-1 latency is timed against ORT fp32 in interleaved
rounds.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from vision_tfm.export.flops import cpu_description
from vision_tfm.export.onnx import export_onnx, ort_runner, ort_session
from vision_tfm.export.quantize import quantize_int8
from vision_tfm.export.source import load_source
from vision_tfm.layers.block import Block, PreNorm


def smooth(model: nn.Module, calib: torch.Tensor, alpha: float) -> nn.Module:
    """A copy of ``model`` with each pre-norm block's LayerNorm -> linear channels balanced."""
    model = copy.deepcopy(model).eval()
    pairs = [
        (norm, lin)
        for b in model.modules()
        if isinstance(b, Block) and b.place is PreNorm
        for norm, lin in ((b.norm1, b.attn.qkv), (b.norm2, b.mlp.fc1))
        if isinstance(norm, nn.LayerNorm) and norm.elementwise_affine and norm.bias is not None
    ]
    amax: dict[nn.Module, torch.Tensor] = {}

    def record(lin: nn.Module, args: tuple) -> None:
        a = args[0].detach().abs().flatten(0, -2).amax(0)
        amax[lin] = torch.maximum(amax[lin], a) if lin in amax else a

    hooks = [lin.register_forward_pre_hook(record) for _, lin in pairs]
    with torch.inference_mode():
        for x in calib.split(32):
            model(x)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for norm, lin in pairs:
            w = lin.weight.abs().amax(0).clamp(min=1e-5)
            s = amax[lin].clamp(min=1e-5).pow(alpha) / w.pow(1 - alpha)
            norm.weight.div_(s)
            norm.bias.div_(s)
            lin.weight.mul_(s)
    print(f"smoothed {len(pairs)} LayerNorm -> linear pairs (alpha {alpha})")
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--calib", type=int, default=128, help="training images for max|x|")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=10, help="timing rounds of 5 runs each")
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
    smoothed = smooth(src.model, calib, a.alpha)
    with torch.inference_mode():
        x = torch.cat([b[0] for b in val[:2]])
        drift = (smoothed(x) - src.model(x)).abs().max().item()
    print(f"smoothed fp32 vs fp32: max abs logit diff {drift:.2e}")
    example = val[0][0][:1]
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = {"plain": Path(tmp) / "fp32.onnx", "smoothed": Path(tmp) / "smoothed.onnx"}
        export_onnx(src.model, example, fp32["plain"], output_names=["logits"])
        export_onnx(smoothed, example, fp32["smoothed"], output_names=["logits"])
        runners = {"onnx fp32": ort_runner(ort_session(fp32["plain"], a.threads))}
        for name, weights, pc in (
            ("shipped", "plain", False),
            ("per-channel", "plain", True),
            ("smoothed", "smoothed", False),
            ("smoothed + per-channel", "smoothed", True),
        ):
            path = Path(tmp) / f"{len(runners)}.onnx"
            quantize_int8(fp32[weights], path, "dynamic", per_channel=pc)
            runners[name] = ort_runner(ort_session(path, a.threads))
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
            "\n| int8-dynamic variant | top-1 | top-1 agree | max abs diff | b1 ms | "
            "speed vs ORT fp32 |\n|---|---|---|---|---|---|"
        )
        for k, run in runners.items():
            ev = src.evaluate(run, val)
            agree = (ev.outputs[0].argmax(1) == top1).float().mean().item()
            diff = (ev.outputs[0] - ref.outputs[0]).abs().max().item()
            ms = statistics.median(times[k])
            print(
                f"| {k} | {ev.metric:.4f} | {agree:.4f} | {diff:.3f} | {ms * 1e3:.2f} | "
                f"{base / ms:.2f}x |"
            )
    print(f"\n{cpu_description()}; {a.threads} threads; agreement against fp32 PyTorch")


if __name__ == "__main__":
    main()

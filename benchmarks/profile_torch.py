"""Where eager PyTorch spends a forward pass: self time per op, beside the matmul ceiling.

    python benchmarks/profile_torch.py --model grasp_hybrid_s --img-size 224 --threads 2
    python benchmarks/profile_onnx.py model.onnx --threads 2      # the same graph in ORT

The eager twin of ``profile_onnx.py``: it times the model (median of ``--runs`` batch-1
forward passes without autograd, as ``vtfm benchmark``'s torch row), profiles it, and
prints the top ops by self CPU time. The footer puts the model's FLOPs against the CPU's
fp32 matmul ceiling: the share of the ceiling the eager pass reaches, and the share any
runtime would need to run it ``--speedup`` times faster. Random weights (the op mix and the
FLOPs do not depend on them; a trained model's denormals can, see ``ORT_SESSION_CONFIG``).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from profile_vs_timm import profile_rounds

from vision_tfm.export.benchmark import time_runs
from vision_tfm.export.flops import count_flops, cpu_description, matmul_ceiling
from vision_tfm.models import create_model


def self_times(model: torch.nn.Module, x: torch.Tensor, runs: int) -> dict[str, tuple[float, int]]:
    """Per op, slowest first: self CPU milliseconds and calls, per forward pass."""

    def step() -> None:
        with torch.inference_mode():
            model(x)

    ops = profile_rounds({"eager": step}, runs)["eager"]  # microseconds, summed over runs
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])
    return {k: (t / runs / 1e3, n // runs) for k, (t, n) in ranked}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a registered model name")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--in-chans", type=int, help="input channels (default: the model's own)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--speedup", type=float, default=2.0, help="the target for the footer")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kw = {"in_chans": args.in_chans} if args.in_chans else {}
    try:
        model = create_model(args.model, **kw).eval()
    except ValueError as e:  # an unknown name: the registry's one line, not a traceback
        p.error(str(e))
    chans = model.pretrained_cfg["input_size"][0] if not args.in_chans else args.in_chans
    x = torch.randn(1, chans, args.img_size, args.img_size)
    with torch.inference_mode():  # vtfm benchmark's timer, as its torch row
        ms = statistics.median(
            time_runs({"eager": model}, x, max(5, args.runs // 5), args.runs, 0)["eager"]
        )
    ops = self_times(model, x, args.runs)
    total = sum(t for t, _ in ops.values())
    print(f"{cpu_description()}, {args.threads} thread(s), torch {torch.__version__}")
    print(f"\n{args.model} at {args.img_size}², batch 1: median {ms:.2f} ms; profiled self time")
    print(f"{total:.2f} ms per pass\n\n| op | ms per pass | share | calls |\n|---|---|---|---|")
    for name, (t, n) in list(ops.items())[: args.top]:
        print(f"| {name} | {t:.2f} | {100 * t / total:.0f}% | {n} |")
    flops = count_flops(model, x)
    ceiling = matmul_ceiling(torch.float32, args.threads)
    reached = flops / (ms / 1e3) / ceiling
    print(
        f"\n{flops / 1e9:.2f} GFLOPs per image; fp32 matmul ceiling {ceiling / 1e9:.0f} GFLOP/s "
        f"on {args.threads} thread(s). Eager reaches {100 * reached:.0f}% of it; "
        f"{args.speedup:g}x eager needs {100 * reached * args.speedup:.0f}% over the whole pass."
    )


if __name__ == "__main__":
    main()

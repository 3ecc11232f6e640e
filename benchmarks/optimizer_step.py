"""The optimiser update alone: torch's AdamW per-parameter loop, foreach and fused kernels.

    python benchmarks/optimizer_step.py                          # vit_mnist, 1 thread
    python benchmarks/optimizer_step.py --models vit_mnist,vit_small_patch16_224 --threads 2

The evidence behind ``build_optimizer`` (``vision_tfm/train/engine.py``) running AdamW fused.
Each variant is built through timm's ``create_optimizer_v2``, as ``build_optimizer`` builds
it (weight-decay groups included), on one model with gradients in place, and times what a
training step spends after ``backward``: gradient clipping, then ``step()``. The variants
take turns in rounds (order flipped each round) and the best round is kept, since other load
only ever slows a round down. The last column is the fused update's speed over the loop's;
the footer names the CPU.
"""

from __future__ import annotations

import argparse
import time

import torch
from timm.optim import create_optimizer_v2

import vision_tfm as vt
from vision_tfm.export.flops import cpu_description

VARIANTS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def time_variants(name: str, rounds: int, iters: int) -> dict[str, float]:
    """Best-round milliseconds per clip + step for each AdamW variant on ``name``."""
    torch.manual_seed(0)
    model = vt.create_model(name)
    size = model.default_cfg.get("input_size", (3, 224, 224))
    model(torch.randn(2, *size)).float().sum().backward()
    opts = {
        k: create_optimizer_v2(model, opt="adamw", lr=1e-4, weight_decay=0.05, **kw)
        for k, kw in VARIANTS.items()
    }
    best = {k: float("inf") for k in opts}
    names = list(opts)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            for _ in range(iters):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opts[k].step()
            best[k] = min(best[k], (time.perf_counter() - t) / iters * 1e3)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_mnist")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | params | loop ms | foreach ms | fused ms | fused speed-up |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        t = time_variants(name, args.rounds, args.iters)
        n = sum(p.numel() for p in vt.create_model(name).parameters())
        print(
            f"| {name} | {n / 1e6:.2f} M | {t['loop']:.2f} | {t['foreach']:.2f} | "
            f"{t['fused']:.2f} | {t['loop'] / t['fused']:.2f}x |",
            flush=True,
        )
    print(f"\nCPU: {cpu_description()}; {args.threads} threads; torch {torch.__version__}")


if __name__ == "__main__":
    main()

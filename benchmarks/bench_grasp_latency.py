"""CPU batch-1 latency of the grasp models at 224x224, against the issue's targets.

Run: ``python benchmarks/bench_grasp_latency.py [--threads 2] [--runs 50] [--warmup 10]``
(about 30 s on 2 cores). Targets: grasp_hybrid_t <= 35 ms, grasp_hybrid_s <= 100 ms
(GR-ConvNet: 66 ms at 0.48 M parameters, 195 ms at 1.9 M). Each model is timed in eval mode
under ``no_grad`` and under ``inference_mode``, with NCHW and channels_last inputs (the model
runs its convs channels_last either way). Timings on a shared box are only as good as its
load, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

import vision_tfm as vt

TARGET_MS = {"grasp_hybrid_t": 35.0, "grasp_hybrid_s": 100.0}


def time_ms(fn: Callable[[], object], runs: int, warmup: int) -> list[float]:
    """Wall time of ``fn()`` in milliseconds for ``runs`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in [0, 100]."""
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, max(0, round(q / 100 * len(ranked)) - 1))]


def bench(name: str, size: int, runs: int, warmup: int) -> None:
    """Print one line per (grad mode, memory format) for model ``name``."""
    torch.manual_seed(0)
    model = vt.create_model(name).eval()
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(1, model.in_chans, size, size)
    modes: dict[str, Callable[[], AbstractContextManager]] = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
    }
    # the model keeps its convs channels_last itself; only the caller's input format varies
    for fmt in (torch.contiguous_format, torch.channels_last):
        xi = x.contiguous(memory_format=fmt)
        for mode, ctx in modes.items():
            with ctx():
                times = time_ms(lambda xi=xi: model(xi), runs, warmup)
            fmt_name = "in:channels_last" if fmt is torch.channels_last else "in:nchw"
            print(
                f"{name:16s} {params / 1e6:5.3f}M  {fmt_name:16s} {mode:14s} "
                f"median {statistics.median(times):6.1f} ms  p90 {percentile(times, 90):6.1f} ms"
                f"  (target {TARGET_MS.get(name, float('nan')):.0f} ms)"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--models", nargs="+", default=list(TARGET_MS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())  # other jobs on the box skew timings
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.size}x{args.size}")
    print(f"{os.cpu_count()} CPUs, load average {load}")
    for name in args.models:
        bench(name, args.size, args.runs, args.warmup)


if __name__ == "__main__":
    main()

"""Softmax (SDPA) vs linear attention as the token count grows: time and peak memory.

    python benchmarks/attention_scaling.py                        # full grid: long (ViT-S at
                                                                  # 16384 tokens is ~1 min a call)
    python benchmarks/attention_scaling.py --vit-sizes 196,784 --rounds 3     # a few minutes
    python benchmarks/attention_scaling.py --sizes 3136,6400,16384 --kernels softmax,elu1 \\
        --precisions fp32 --vit-sizes none                        # the acceptance case only

Two scopes, each at every token count N of ``--sizes`` / ``--vit-sizes``:

- ``attn``: one ViT-S/16-width attention layer (dim 384, 6 heads: qkv, attention, proj) on
  ``(1, N, 384)`` tokens;
- ``vit``: a whole ViT-S/16 forward at the image size that gives N patch tokens
  (``16 * sqrt(N)`` pixels a side; 196 tokens = 224², 16384 = 2048²).

Kernels: ``softmax`` is the layer's SDPA path (the plain layer's in every precision: accel's
plan, not applied here, would pick the explicit path for bf16 on some CPUs, which forms the
whole N x N matrix), ``elu1``/``relu``/``favor`` the linear
feature maps (favor with the default ``d ln d`` = 266 features per head). For every
(scope, N, precision) the kernels run in alternating rounds (one call each, order reversed
every round) after one warm-up call, and the median is reported, so a noisy spell hits all of
them alike. Peak memory is the high-water mark of tensor memory allocated during one call
above what was live before it (``torch.profiler`` memory events). bf16 runs under
``torch.autocast``. The script ends with, per kernel, precision and scope, the token count
where linear attention becomes faster than softmax (log-log interpolation between grid
points) and its growth per doubling of N over the largest sizes (linear: 2x; softmax: ~4x).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from collections.abc import Callable

import torch

import vision_tfm as vt
from vision_tfm.export.flops import cpu_description
from vision_tfm.layers import Attention

KERNELS = ("softmax", "elu1", "relu", "favor")
PRECISIONS = ("fp32", "bf16")
SCOPES = ("attn", "vit")
DIM, HEADS, PATCH = 384, 6, 16


def parse_ints(spec: str) -> list[int]:
    return [] if spec in ("", "none") else [int(s) for s in spec.split(",")]


def attn_kwargs(kernel: str) -> dict:
    return {} if kernel == "softmax" else {"attn_type": "linear", "feature_map": kernel}


def build(scope: str, kernel: str, n: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if scope == "attn":
        model = Attention(DIM, HEADS, **attn_kwargs(kernel))
        x = torch.randn(1, n, DIM)
    else:
        side = math.isqrt(n)
        if side * side != n:
            raise ValueError(f"--vit-sizes: {n} is not a square number of tokens")
        model = vt.create_model("vit_small_patch16_224", **attn_kwargs(kernel))
        x = torch.randn(1, 3, side * PATCH, side * PATCH)
    return model.eval(), x


def runner(model: torch.nn.Module, x: torch.Tensor, prec: str) -> Callable[[], None]:
    def call() -> None:
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if prec == "bf16" else None
        with torch.inference_mode(), amp or contextlib.nullcontext():
            model(x)

    return call


def peak_mb(fn: Callable[[], None]) -> float:
    """High-water mark (MB) of tensor memory allocated during ``fn`` above its start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    cur = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak / 2**20


def measure(scope: str, n: int, prec: str, kernels: list[str], rounds: int) -> dict[str, tuple]:
    """Median seconds and peak MB per kernel, kernels interleaved round by round."""
    calls = {k: runner(*build(scope, k, n), prec) for k in kernels}
    for fn in calls.values():  # warm-up (kernel selection, allocator)
        fn()
    times: dict[str, list[float]] = {k: [] for k in kernels}
    for r in range(rounds):
        for k in kernels if r % 2 == 0 else kernels[::-1]:
            t = time.perf_counter()
            calls[k]()
            times[k].append(time.perf_counter() - t)
    return {k: (statistics.median(times[k]), peak_mb(calls[k])) for k in kernels}


def crossover(ns: list[int], soft: list[float], lin: list[float]) -> str:
    """First N where linear beats softmax, interpolated in log-log between grid points."""
    if lin[0] < soft[0]:
        return f"<= {ns[0]} (faster at every size)"
    for i in range(1, len(ns)):
        if lin[i] < soft[i]:
            a0, a1 = math.log(lin[i - 1] / soft[i - 1]), math.log(lin[i] / soft[i])
            f = a0 / (a0 - a1)  # where log(lin/soft) crosses 0
            n = math.exp(math.log(ns[i - 1]) + f * (math.log(ns[i]) - math.log(ns[i - 1])))
            return f"~{n:.0f} (between {ns[i - 1]} and {ns[i]})"
    return f"> {ns[-1]} (never faster here)"


def growth(ns: list[int], ts: list[float], start: int) -> str:
    """Time ratio per doubling of N from ``start`` (or the nearest size above) to the largest."""
    pts = [(n, t) for n, t in zip(ns, ts) if n >= start]
    if len(pts) < 2:
        return "n/a"
    (n0, t0), (n1, t1) = pts[0], pts[-1]
    return f"{(t1 / t0) ** (1 / math.log2(n1 / n0)):.2f}x ({n0}->{n1})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="196,784,3136,6400,16384", help="tokens, attention layer")
    p.add_argument("--vit-sizes", default="196,784,3136,6400,16384", help="tokens, or none")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--rounds", type=int, default=5, help="timed calls per kernel and case")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--growth-from", type=int, default=3136, help="first N of the growth figure")
    args = p.parse_args()
    kernels, precs = args.kernels.split(","), args.precisions.split(",")
    bad = [k for k in kernels if k not in KERNELS] + [q for q in precs if q not in PRECISIONS]
    if bad or "softmax" not in kernels or len(kernels) < 2 or args.rounds < 1:
        p.error(
            f"--kernels from {KERNELS} incl. softmax and one linear, --precisions from "
            f"{PRECISIONS}, --rounds >= 1 (bad: {bad})"
        )
    sizes = {"attn": parse_ints(args.sizes), "vit": parse_ints(args.vit_sizes)}
    torch.set_num_threads(args.threads)

    results: dict[tuple[str, str, str], dict[int, tuple[float, float]]] = {}
    print("| scope | tokens | precision | kernel | ms | vs softmax | peak MB |")
    print("|---|---|---|---|---|---|---|")
    for scope in SCOPES:
        for n in sizes[scope]:
            for prec in precs:
                res = measure(scope, n, prec, kernels, args.rounds)
                for k, (t, mb) in res.items():
                    results.setdefault((scope, prec, k), {})[n] = (t, mb)
                    speed = res["softmax"][0] / t
                    print(
                        f"| {scope} | {n} | {prec} | {k} | {t * 1e3:.1f} | {speed:.2f}x | "
                        f"{mb:.0f} |",
                        flush=True,
                    )

    print("\nwhere linear attention becomes faster than softmax (SDPA), and time per doubling:")
    for scope in SCOPES:
        ns = sizes[scope]
        if len(ns) < 2:
            continue
        for prec in precs:
            soft = [results[(scope, prec, "softmax")][n][0] for n in ns]
            print(f"  {scope} {prec}: softmax grows {growth(ns, soft, args.growth_from)}")
            for k in [k for k in kernels if k != "softmax"]:
                lin = [results[(scope, prec, k)][n][0] for n in ns]
                print(
                    f"  {scope} {prec}: {k} faster from N {crossover(ns, soft, lin)}; "
                    f"grows {growth(ns, lin, args.growth_from)}"
                )
    print(f"\nCPU: {cpu_description()}; {args.threads} threads; torch {torch.__version__}")


if __name__ == "__main__":
    main()

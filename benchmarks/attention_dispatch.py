"""Every softmax-attention path at the layer level, and the one accel's plan picks.

    python benchmarks/attention_dispatch.py                      # ~5 min on 2 cores
    python benchmarks/attention_dispatch.py --cases swin --modes train --precisions bf16
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/attention_dispatch.py

It re-measures accel's attention rules: each rule of ``attention_plan``
(``vision_tfm/accel/cpu.py``), which ``optimize_for_inference`` and the training engine apply
by swapping their planned attention in (``vision_tfm/accel/attention.py``). Three cases, the
attention core only (q, k, v in, heads out; no projections):

- ``vit``: a ViT-S/16 layer, ``(B, 6, 197, 64)``, no bias;
- ``short``: the quick start's ViT layer (``train_cls.py --model vit``), ``(B, 4, 16, 32)``,
  no bias; its recipe trains at batch 64;
- ``swin``: Swin-T stage-1 windows, ``(B, 64, 3, 49, 32)`` with a ``(64, 3, 49, 49)`` fp32
  bias (relative position + shift mask), as the model passes them; in training the bias
  takes a gradient, as the relative-position table does.

q, k and v are strided views of one qkv tensor, as ``Attention`` makes them. ``infer`` runs
under ``inference_mode``; ``train`` is forward plus backward of a sum. Paths: ``sdpa``
(leading dims folded), ``explicit`` (accel's, scores scaled inside the GEMM),
``explicit+upcast`` (fp32 bias add and softmax; bf16 with a bias only) and ``explicit+contig``
(contiguous q, k, v; train only). They run in alternating rounds of ~0.1 s (order reversed
each round); the best round is reported, since other load only ever slows a round down;
``picked / best`` is the picked path's time over the fastest one's. With the three variables
in the last command an AVX-512 machine runs ATen's AVX2 kernels, oneDNN's AVX2 code, bf16
included (emulated), and MKL's AVX2 fp32 GEMMs (without the MKL one, fp32 matmuls stay
AVX-512), and the plan reads the CPU as AVX2 without native bf16: an approximation of an AVX2
CPU.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from vision_tfm.accel import (
    attention_plan,
    cpu_description,
    dispatch_facts,
    planned_explicit_attention,
)
from vision_tfm.layers import sdpa_attention

CASES = {
    "vit": ((6, 197, 64), None),
    "swin": ((64, 3, 49, 32), (64, 3, 49, 49)),
    "short": ((4, 16, 32), None),
}


def inputs(case: str, batch: int, dtype: torch.dtype, grad: bool):
    """q, k, v as views of one qkv tensor, and the fp32 bias (or None)."""
    (*lead, h, n, d), bias_shape = CASES[case]
    torch.manual_seed(0)
    qkv = torch.randn(batch, *lead, n, 3 * h, d, dtype=dtype, requires_grad=grad)
    q, k, v = qkv.transpose(-3, -2).chunk(3, dim=-3)  # 3 x (B, ..., h, N, d)
    # in training the bias takes a gradient, as Swin's relative-position table does
    bias = None if bias_shape is None else torch.randn(bias_shape, requires_grad=grad)
    return qkv, (q, k, v), bias


def paths(has_bias: bool, low: bool, train: bool) -> dict[str, Callable]:
    scale = 0.125
    out = {
        "sdpa": lambda q, k, v, b: sdpa_attention(q, k, v, b, None, scale),
        "explicit": lambda q, k, v, b: planned_explicit_attention(q, k, v, b, None, scale)[0],
    }
    if has_bias and low and not train:
        out["explicit+upcast"] = lambda q, k, v, b: planned_explicit_attention(
            q, k, v, b, None, scale, upcast=True
        )[0]
    if train:
        out["explicit+contig"] = lambda q, k, v, b: planned_explicit_attention(
            q, k, v, b, None, scale, contiguous=True
        )[0]
    return out


def picked(q: torch.Tensor, has_bias: bool) -> str:
    plan = attention_plan(q, has_bias, need_weights=False)
    if plan.fused:
        return "sdpa"
    return "explicit" + ("+upcast" if plan.upcast else "") + ("+contig" if plan.contiguous else "")


def step(fn: Callable, case: str, batch: int, dtype: torch.dtype, train: bool) -> Callable:
    qkv, (q, k, v), bias = inputs(case, batch, dtype, train)
    if train:

        def run() -> None:
            fn(q, k, v, bias).float().sum().backward(retain_graph=True)
            for leaf in (qkv, bias):
                if leaf is not None:
                    leaf.grad = None

        return run

    def run_infer() -> None:
        with torch.inference_mode():
            fn(q, k, v, bias)

    return run_infer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="vit,swin")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--threads", type=int, default=0, help="0: torch's default")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for case in args.cases.split(","):
        for prec in args.precisions.split(","):
            dtype = torch.bfloat16 if prec == "bf16" else torch.float32
            for mode in args.modes.split(","):
                train = mode == "train"
                for batch in map(int, args.batches.split(",")):
                    has_bias = CASES[case][1] is not None
                    fns = paths(has_bias, dtype != torch.float32, train)
                    steps = {name: step(fn, case, batch, dtype, train) for name, fn in fns.items()}
                    iters = {}
                    for n, s in steps.items():  # warm up, then size a round to ~0.1 s
                        s()
                        t = time.perf_counter()
                        s()
                        iters[n] = max(1, int(0.1 / (time.perf_counter() - t)))
                    times: dict[str, list[float]] = {n: [] for n in steps}
                    names = list(steps)
                    for r in range(args.rounds):
                        for n in names if r % 2 == 0 else names[::-1]:
                            t = time.perf_counter()
                            for _ in range(iters[n]):
                                steps[n]()
                            times[n].append((time.perf_counter() - t) / iters[n])
                    med = {n: min(v) * 1e3 for n, v in times.items()}
                    _, (q, _, _), _ = inputs(case, 1, dtype, train)
                    pick = picked(q, has_bias)
                    best = min(med, key=med.get)
                    rows.append((case, prec, mode, batch, med, pick, med[pick] / med[best]))
                    print(
                        f"{case:<5} {prec:<4} {mode:<5} b{batch:<3} "
                        + "  ".join(f"{n} {t:.2f} ms" for n, t in med.items())
                        + f"  | picked {pick}, {rows[-1][-1]:.2f}x best",
                        flush=True,
                    )
    print(
        f"\nCPU: {cpu_description()}; {dispatch_facts()}; {torch.get_num_threads()} threads; "
        f"torch {torch.__version__}"
    )
    print("\n| case | precision | mode | batch | ms per path | picked | picked / best |")
    print("|---|---|---|---|---|---|---|")
    for case, prec, mode, batch, med, pick, ratio in rows:
        ms = ", ".join(f"{n} {t:.2f}" for n, t in med.items())
        print(f"| {case} | {prec} | {mode} | {batch} | {ms} | {pick} | {ratio:.2f} |")


if __name__ == "__main__":
    main()

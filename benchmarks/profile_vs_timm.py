"""Where the time goes: torch.profiler top ops for ours and timm, same weights, same input.

    python benchmarks/profile_vs_timm.py --models vit,swin --precisions fp32,bf16
    python benchmarks/profile_vs_timm.py --models swin --modes train --batch 16 --threads 2
    python benchmarks/profile_vs_timm.py --models swin --precisions fp32 --modes infer --compile

For each case it profiles a few steps of each model (after warmup; the two take turns step
by step) and prints the top ops by self CPU time as a Markdown table, then one line per model
with the share of the step spent in GEMM kernels (``addmm``, ``mm``, ``bmm``, oneDNN linear)
and in SDPA. A model whose step is mostly GEMM at a rate near the measured matmul ceiling
(``bench_vs_timm.py``) cannot get much faster without doing fewer FLOPs; what is left is the
non-GEMM remainder shown here. ``--compile`` profiles both compiled as ``bench_vs_timm.py
--compile`` compiles them, with Inductor's generated kernels named in the profile
(``cpp_fused_...``: each is one fused loop nest of memory-bound ops).
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable

import torch
from bench_vs_timm import PAIRS, build, check_choices, make_step, model_input
from torch.profiler import ProfilerActivity, profile

GEMM = ("aten::addmm", "aten::mm", "aten::bmm", "aten::_addmm_activation", "mkldnn::", "mkl::")
SDPA = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_flash_attention")


def profile_rounds(steps: dict[str, Callable[[], None]], rounds: int) -> dict[str, dict]:
    """Per model, self CPU microseconds and call count per op, summed over ``rounds`` steps.

    The models take turns one profiled step at a time (order flipped each round), so a noisy
    spell on a shared machine hits both alike rather than one model's whole profile.
    """
    for step in steps.values():
        for _ in range(2):
            step()
    out = {k: collections.defaultdict(lambda: (0.0, 0)) for k in steps}
    names = list(steps)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                steps[k]()
            for e in prof.key_averages():
                t, n = out[k][e.key]
                out[k][e.key] = (t + e.self_cpu_time_total, n + e.count)
    return out


def share(ops: dict[str, tuple[float, int]], prefixes: tuple[str, ...]) -> float:
    total = sum(t for t, _ in ops.values())
    return 100 * sum(t for k, (t, _) in ops.items() if k.startswith(prefixes)) / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit,swin", help=f"from {', '.join(PAIRS)}")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--compile", action="store_true", help="profile both compiled")
    args = p.parse_args()
    check_choices(p, args)
    if args.compile:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True  # name each fused kernel
    torch.set_num_threads(args.threads)
    for kind in args.models.split(","):
        for prec in args.precisions.split(","):
            for mode in args.modes.split(","):
                torch._dynamo.reset()
                ours, ref, label = build(kind, prec, mode, args.compile)
                x = torch.randn(args.batch, 4 if kind == "grasp" else 3, 224, 224)
                profs = profile_rounds(
                    {
                        "ours": make_step(ours, model_input(ours, x), mode, prec),
                        label: make_step(ref, x, mode, prec),
                    },
                    args.steps,
                )
                print(
                    f"\n### {PAIRS[kind][0]} {mode} {prec} b{args.batch} t{args.threads}"
                    f"{' compiled' if args.compile else ''} (self CPU ms per step)\n"
                )
                print("| op | " + " | ".join(f"{k} ms | {k} calls" for k in profs) + " |")
                print("|---|" + "---|---|" * len(profs))
                top = []  # each model's top ops, ours' first: their kernels differ by name
                for ops in profs.values():
                    top += sorted(ops, key=lambda k: -ops[k][0])[: args.top]
                top = list(dict.fromkeys(top))
                for op in top:
                    cells = []
                    for ops in profs.values():
                        t, n = ops.get(op, (0.0, 0))
                        cells += [f"{t / 1e3 / args.steps:.1f}", f"{n // args.steps}"]
                    print(f"| {op} | " + " | ".join(cells) + " |")
                for k, ops in profs.items():
                    total = sum(t for t, _ in ops.values()) / 1e3 / args.steps
                    print(
                        f"\n{k}: {total:.0f} ms self CPU per step; GEMM {share(ops, GEMM):.0f}%, "
                        f"SDPA {share(ops, SDPA):.0f}%, everything else "
                        f"{100 - share(ops, GEMM) - share(ops, SDPA):.0f}%"
                    )


if __name__ == "__main__":
    main()

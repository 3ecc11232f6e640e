"""Ours vs timm on this CPU: same weights, checked parity, interleaved timings.

    python benchmarks/bench_vs_timm.py                          # full grid, ~15 min on 2 cores
    python benchmarks/bench_vs_timm.py --quick                  # one round per case, ~3 min
    python benchmarks/bench_vs_timm.py --models swin --modes infer --batches 16
    python benchmarks/bench_vs_timm.py --quick --check        # exit 1 if any case < 0.95x
    python benchmarks/bench_vs_timm.py --compile --models swin --batches 16
    python benchmarks/bench_vs_timm.py --models vit --precisions bf16 --attn sdpa
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/bench_vs_timm.py --check     # an AVX2 CPU, approximately

For every case (model x precision x batch x threads x mode) both models run in alternating
rounds (ours, timm, timm, ours, ...) so machine noise hits both alike; each reports its
median time per step. "speedup" is timm time / ours time (> 1: ours is faster). GFLOP/s
counts 2 FLOPs per multiply-add (``torch.utils.flop_counter``); a training step is counted
as 3x the forward. The matmul ceiling is the best single 512², 1024² or 2048² matmul over
~2 s of each, timed in the same run at the same thread count and precision (the best, since
a busy machine only ever slows a run down); none where bf16 is emulated (a 2048² bf16 matmul
takes minutes there, and a square matmul runs far slower than the models' own layers do).

Ours runs as users run it: inference uses ``vt.optimize_for_inference`` (bf16 weights for
the bf16 case); training uses the model as the training engine sets it up, through
``vision_tfm.accel.prepare_for_training``. ``--compile`` compiles both, so compiled is
measured against compiled: ours through ``optimize_for_inference(compile=True)`` (with
freezing) in inference and the plain ``torch.compile`` that ``run.compile`` uses in
training, the reference the same way (frozen through ``FrozenCompiled`` in inference); it
reports ours' compile time, i.e. the first call's time less a steady call's.
``grasp_hybrid_s`` (``grasp``) and ``grasp_hybrid_t`` (``grasp_t``) are compared with their
own unoptimised versions (timm has no such model).
A training step is forward, backward and an AdamW update. ``--optimizer same`` (the
default) gives both models torch's AdamW as built without options, so the ratio is the
models'; ``--optimizer builders`` gives each the AdamW its library's builder makes for a
user (ours ``vision_tfm.train.engine.build_optimizer``: fused; timm ``create_optimizer_v2``),
so the ratio is the training step a user of each gets.
In bf16 inference the reference runs under ``torch.autocast`` with its fp32 weights, cast
on every call, as autocast users run it; ``--ref-weights bf16`` casts its weights to bf16
once, as ours are, for the reference a user who casts the model gets.
``--check`` exits 1, after the table, when any case runs below ``CHECK_MIN`` (0.95x) its
reference. ``--attn sdpa`` or ``--attn explicit`` overrides accel's attention plan in ours
(``auto``, the default, is what users get), to re-measure a rule of ``attention_plan``
(``vision_tfm/accel/cpu.py``) at the model level.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import timm
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2

import vision_tfm as vt
from vision_tfm.accel import (
    AttentionPlan,
    cpu_native_bf16,
    dispatch_facts,
    emulated_bf16_note,
    onednn_linear_pays,
    onednn_linear_speedup,
    prepare_for_training,
)
from vision_tfm.accel import attention as planned_attention
from vision_tfm.export.flops import count_flops, cpu_description, matmul_ceiling
from vision_tfm.optimize import FrozenCompiled
from vision_tfm.tasks.config import OptimConfig
from vision_tfm.train import build_optimizer

CHECK_MIN = 0.95  # --check: the slowest ratio against the reference that passes
PAIRS = {
    "vit": ("vit_small_patch16_224", "vit_small_patch16_224"),
    "swin": ("swin_tiny_patch4_window7_224", "swin_tiny_patch4_window7_224"),
    "grasp": ("grasp_hybrid_s", None),
    "grasp_t": ("grasp_hybrid_t", None),
}


def input_chans(kind: str) -> int:
    """Channels a kind's model takes: RGB-D for the grasp models, RGB for the classifiers."""
    return 4 if PAIRS[kind][1] is None else 3


def loss_of(out) -> torch.Tensor:
    if isinstance(out, dict):
        return sum(v.float().square().mean() for v in out.values())
    labels = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
    return F.cross_entropy(out.float(), labels)


LR = 1e-6  # training steps barely move the weights, so every round times the same model


def make_optimizer(model: torch.nn.Module, ours: bool, how: str) -> torch.optim.Optimizer:
    """AdamW for ``model``: torch's plain class (``how="same"``) or the one its library's
    builder gives a user (``"builders"``), with the default weight decay and betas."""
    if how == "same":
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    cfg = OptimConfig()
    if ours:
        return build_optimizer(model, cfg, LR)
    return create_optimizer_v2(
        model, opt=cfg.opt, lr=LR, weight_decay=cfg.weight_decay, betas=cfg.betas
    )


def make_step(
    model, x, mode: str, prec: str, ours: bool = False, optimizer: str = "same"
) -> Callable[[], None]:
    """One timed step, on ``x``'s device; in training with :func:`make_optimizer`'s AdamW."""
    ac = torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=prec == "bf16")
    if mode == "infer":

        def step() -> None:
            with torch.inference_mode(), ac:
                model(x)

        return step
    opt = make_optimizer(model, ours, optimizer)

    def train_step() -> None:
        with ac:
            loss = loss_of(model(x))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return train_step


def interleaved(
    steps: dict[str, Callable[[], None]],
    rounds: int,
    iters: int,
    sync: Callable[[], None] = lambda: None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per step for each entry, alternating the order every round, and the
    seconds its first call took (compilation, for a compiled model). ``sync`` waits for the
    queued work before a clock is read (``torch.cuda.synchronize`` on a GPU)."""
    first = {}
    for k, s in steps.items():  # warmup
        t = time.perf_counter()
        s()
        sync()
        first[k] = time.perf_counter() - t
        for _ in range(2):
            s()
    times: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for r in range(rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            sync()
            t = time.perf_counter()
            for _ in range(iters):
                steps[k]()
            sync()
            times[k].append((time.perf_counter() - t) / iters)
    return {k: statistics.median(v) for k, v in times.items()}, first


def build(
    kind: str,
    prec: str,
    mode: str,
    compile: bool = False,
    ref_bf16: bool = False,
    device: str | torch.device = "cpu",
    model_kw: dict | None = None,
):
    """(ours, reference, label of the reference), same weights, on ``device``; ``compile``
    compiles both, ``ref_bf16`` casts the reference's weights to bf16 for bf16 inference,
    ``model_kw`` changes both architectures alike (a smaller size, say)."""
    ours_name, timm_name = PAIRS[kind]
    kw = model_kw or {}
    torch.manual_seed(0)
    if timm_name is None:  # grasp: the reference is our own unoptimised model
        ref = vt.create_model(ours_name, **kw).eval()
        ours = copy.deepcopy(ref)
        label = "unfused"
    else:
        ref = timm.create_model(timm_name, pretrained=False, **kw).eval()
        ours = vt.load_pretrained(vt.create_model(ours_name, **kw), ref.state_dict()).eval()
        label = "timm"
    ours, ref = ours.to(device), ref.to(device)  # before the device-specific swaps
    if mode == "infer":
        dtype = torch.bfloat16 if prec == "bf16" else None
        ours = vt.optimize_for_inference(ours, dtype=dtype, compile=compile)
        if ref_bf16 and dtype is not None:
            ref, label = ref.to(dtype), f"{label} (bf16 weights)"
        if compile:
            ref = FrozenCompiled(ref)
    else:
        ours = prepare_for_training(ours.train())  # as the training engine sets it up
        ref.train()
        ours = torch.compile(ours, dynamic=False) if compile else ours
        ref = torch.compile(ref, dynamic=False) if compile else ref
    return ours, ref, label


def force_attention(path: str) -> None:
    """Make every planned softmax-attention call of ours take ``path`` ("sdpa", "explicit")
    instead of the plan's pick; "auto" leaves the plan alone. Ours only: timm never calls it."""
    if path == "auto":
        return
    plan = planned_attention.attention_plan

    def forced(q: torch.Tensor, has_bias: bool, need_weights: bool) -> AttentionPlan:
        if need_weights or path == "explicit":
            return plan(q, has_bias, True)  # the explicit path with its upcast/contig rules
        return AttentionPlan(fused=True)

    planned_attention.attention_plan = forced


def model_input(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` in the model's weight dtype: bf16 after ``optimize_for_inference(dtype=bf16)``."""
    return x.to(next(model.parameters()).dtype)


def parity_diff(ours, ref, x, prec: str) -> tuple[float, float]:
    """Max abs difference of the two models' outputs on ``x`` and the tolerance it must
    meet: 1e-4 in fp32, 2e-2 of the output's scale (at least 1) in bf16."""
    # inference_mode, as the timed step: a compiled model reuses the graph it compiled there
    with (
        torch.inference_mode(),
        torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=prec == "bf16"),
    ):
        a, b = ours.eval()(x), ref.eval()(x)
    if isinstance(a, dict):
        a, b = (
            torch.cat([v.flatten() for v in a.values()]),
            torch.cat([v.flatten() for v in b.values()]),
        )
    diff = (a.float() - b.float()).abs().max().item()
    return diff, 1e-4 if prec == "fp32" else 2e-2 * max(1.0, b.float().abs().max().item())


def check_parity(ours, ref, x, prec: str) -> float:
    """:func:`parity_diff`'s difference; the run stops if it is over the tolerance."""
    diff, tol = parity_diff(ours, ref, x, prec)
    if diff > tol:
        raise SystemExit(f"parity failed: max abs diff {diff:.3e} > {tol:.1e} ({prec})")
    return diff


def ceiling_share(gflops: float, ceiling: float | None) -> str:
    """``gflops`` as a percentage of the matmul ceiling; "-" where there is none."""
    return "-" if ceiling is None else f"{100 * gflops / ceiling:.0f}%"


def check_choices(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Comma lists checked up front: a typo must not surface as a KeyError minutes in."""
    for flag, allowed in (
        ("models", tuple(PAIRS)),
        ("precisions", ("fp32", "bf16")),
        ("modes", ("infer", "train")),
    ):
        bad = [v for v in getattr(args, flag).split(",") if v not in allowed]
        if bad:
            p.error(f"--{flag}: unknown {bad}; choose from {', '.join(allowed)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit,swin,grasp", help=f"from {', '.join(PAIRS)}")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--modes", default="infer,train")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--quick", action="store_true", help="2 rounds, 1 iteration each")
    p.add_argument("--compile", action="store_true", help="torch.compile ours and the reference")
    p.add_argument("--check", action="store_true", help=f"exit 1 if any case is < {CHECK_MIN}x")
    p.add_argument(
        "--attn", default="auto", choices=("auto", "sdpa", "explicit"), help="ours' attention"
    )
    p.add_argument(
        "--optimizer",
        default="same",
        choices=("same", "builders"),
        help="training: torch's AdamW for both, or each library's builder's",
    )
    p.add_argument(
        "--ref-weights",
        default="fp32",
        choices=("fp32", "bf16"),
        help="bf16 inference: the reference's weights under autocast, or cast to bf16 once",
    )
    args = p.parse_args()
    check_choices(p, args)
    force_attention(args.attn)
    rounds = 2 if args.quick else args.rounds
    rows = []
    ceilings: dict[tuple[int, str], float | None] = {}
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        for prec in args.precisions.split(","):
            dtype = torch.float32 if prec == "fp32" else torch.bfloat16
            # emulated bf16: a square mm runs far slower than the models' layers (minutes
            # for 2048²), so it is no ceiling
            emulated = prec == "bf16" and not cpu_native_bf16()
            ceilings[(threads, prec)] = (
                None if emulated else matmul_ceiling(dtype, threads, seconds=2.0) / 1e9
            )
            for kind in args.models.split(","):
                for mode in args.modes.split(","):
                    if PAIRS[kind][1] is None and mode == "train":
                        continue  # the fast path is inference-only
                    for batch in map(int, args.batches.split(",")):
                        torch._dynamo.reset()  # compiled code is specialised to thread count
                        ours, ref, label = build(
                            kind, prec, mode, args.compile, args.ref_weights == "bf16"
                        )
                        x = torch.randn(batch, input_chans(kind), 224, 224)
                        xin = model_input(ours, x)
                        compile_s = 0.0
                        if args.compile and mode == "infer":  # the user's first call compiles
                            t0 = time.perf_counter()
                            make_step(ours, xin, mode, prec)()
                            compile_s = time.perf_counter() - t0
                        diff = check_parity(ours, ref, x, prec)
                        flops = (
                            batch
                            * count_flops(getattr(ref, "_orig_mod", ref), model_input(ref, x))
                            * (3 if mode == "train" else 1)
                        )
                        if mode == "train":
                            ours.train()
                            ref.train()
                        steps = {
                            "ours": make_step(ours, xin, mode, prec, True, args.optimizer),
                            "ref": make_step(
                                ref, model_input(ref, x), mode, prec, False, args.optimizer
                            ),
                        }
                        iters = 1 if args.quick else max(1, int(4 / batch) + 1)
                        t, first = interleaved(steps, rounds, iters)
                        gf = flops / t["ours"] / 1e9
                        rows.append(
                            {
                                "model": PAIRS[kind][0],
                                "vs": label,
                                "mode": mode,
                                "prec": prec,
                                "batch": batch,
                                "threads": threads,
                                "ref_ms": t["ref"] * 1e3,
                                "ours_ms": t["ours"] * 1e3,
                                "speedup": t["ref"] / t["ours"],
                                "gflops": gf,
                                "ceiling": ceiling_share(gf, ceilings[(threads, prec)]),
                                "parity": diff,
                                # training compiles on its first step (forward + backward)
                                "compile_s": compile_s or first["ours"] - t["ours"],
                            }
                        )
                        r = rows[-1]
                        print(
                            f"{r['model']:<30} {mode:<5} {prec:<4} b{batch:<3} t{threads} "
                            f"{label} {r['ref_ms']:8.1f} ms  ours {r['ours_ms']:8.1f} ms  "
                            f"x{r['speedup']:.2f}  {gf:6.1f} GFLOP/s ({r['ceiling']})"
                            + (f"  compile {r['compile_s']:.0f} s" if args.compile else ""),
                            flush=True,
                        )
    print(
        f"\nCPU: {cpu_description()}; {dispatch_facts()}; torch {torch.__version__}, "
        f"timm {timm.__version__}"
    )
    if "fp32" in args.precisions.split(",") and "infer" in args.modes.split(","):
        print(
            f"oneDNN fp32 Linear probe: {onednn_linear_speedup():.2f}x the BLAS; fp32 inference "
            f"runs {'oneDNN' if onednn_linear_pays() else 'the BLAS'}"
        )
    measured = [f"{p} {t} thr {v:.0f} GFLOP/s" for (t, p), v in ceilings.items() if v is not None]
    if measured:
        print("matmul ceiling (best of 512^2, 1024^2, 2048^2): " + ", ".join(measured))
    note = emulated_bf16_note() if "bf16" in args.precisions.split(",") else None
    if note:
        print(note)
    print(
        "\n| model | vs | mode | precision | batch | threads | ref ms | ours ms | speedup "
        "| ours GFLOP/s | % of matmul ceiling | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['vs']} | {r['mode']} | {r['prec']} | {r['batch']} | "
            f"{r['threads']} | {r['ref_ms']:.1f} | {r['ours_ms']:.1f} | {r['speedup']:.2f} | "
            f"{r['gflops']:.1f} | {r['ceiling']} | {r['parity']:.1e} |"
        )
    slow = [r for r in rows if r["speedup"] < CHECK_MIN]
    if args.check and slow:
        for r in slow:
            print(
                f"check: {r['model']} {r['mode']} {r['prec']} b{r['batch']} t{r['threads']} "
                f"runs {r['speedup']:.2f}x {r['vs']}, below {CHECK_MIN}x"
            )
        raise SystemExit(1)


if __name__ == "__main__":
    main()

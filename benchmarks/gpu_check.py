"""One prepared check of every CUDA path, and the speed against timm on the same card.

    python benchmarks/gpu_check.py                       # a GPU: under 6 min on one H100
    python benchmarks/gpu_check.py --device cpu --quick  # CI (tests/test_gpu_check.py), ~30 s
    python benchmarks/gpu_check.py --only parity,sdpa    # some sections (list: --help)
    bash benchmarks/gpu_check.sh wheels                  # here: the wheels a GPU machine lacks
    bash benchmarks/gpu_check.sh                         # there: install them, run this

It prints one line per row as the row completes, then one Markdown table; with ``--out DIR``
(default: ``$OUT`` when set) it also writes ``gpu_check.json`` and ``gpu_check.md`` there,
rewritten after every row, so a run cut off by its time limit keeps what it measured.

Correctness rows; the exit status is 1 if any fails, and a row that raises fails:
- ``parity``: ViT-S/16 and Swin-T logits against timm's on the same weights, fp32 <= 1e-4
  and bf16 autocast <= 2e-2 (of the logits' scale when above 1), as the training engine
  holds the model and as ``vt.optimize_for_inference`` runs it (bf16 weights for bf16);
- ``train``: one training step of each family (ViT-S, Swin-T, grasp_hybrid_t) through the
  engine's own pieces (``prepare_for_training``, ``build_training``'s optimiser and
  GradScaler, ``autocast``, the task's loss), in bf16 and in fp16 AMP with the GradScaler
  (``run.precision=amp``; a CPU has no fp16 AMP): a finite loss, a finite gradient for every
  parameter, weights that moved. A scaler that skips a step on an overflow (as it may while
  it finds its scale) gets up to three more;
- ``sdpa``: the attention kernels ours and timm ran in a bf16 training step, read from
  torch.profiler's op and kernel names (flash, efficient, cudnn, math; on a CPU its SDPA
  kernel or ours' explicit path); on a GPU ours must run a fused one;
- ``ckpt``: gradients with ``set_grad_checkpointing()`` equal the plain step's (fp32, within
  1e-5 of the largest), and the step's peak memory each way from
  ``torch.cuda.max_memory_allocated`` (bf16; n/a on a CPU);
- ``export``: ``vtfm export`` of ViT-S (vit_test with ``--quick``), then the ONNX file under
  onnxruntime's CUDA provider where the installed onnxruntime has one (else its CPU one),
  against PyTorch on real images;
- ``grasp``: the training engine for one epoch of grasp_hybrid_t on the Cornell views in
  tests/fixtures (fp16 AMP on a GPU), then ``predict_grasps`` on one raw view from its
  ``best.pt``: 1-3 grasps inside the view's centre crop.

Speed rows, ours against timm with the same weights on the same inputs, in alternating rounds
(``bench_vs_timm.py``'s helpers); ratio = timm's time / ours (above 1: ours faster):
- ``peak``: the bf16 matmul peak (the best 4096² or 8192² matmul) that MFU is taken against;
- ``train``: training img/s at batch 128, 224², bf16 autocast, AdamW, eager (``speed``) and
  ``torch.compile``d (``compile``), with model FLOP utilisation (3x the forward's FLOPs);
- ``infer``: inference img/s at batch 256, bf16 (ours with bf16 weights through
  ``optimize_for_inference``, timm under autocast);
- ``latency``: batch-1 latency of ViT-S, Swin-T, grasp_hybrid_t and _s in fp32 and bf16
  (the grasp models against their own unfused selves), eager; grasp_hybrid_s also compiled.
The issue's targets stand in the target column (met or missed, on a GPU only); they do not
change the exit status. ``--quick`` runs every section at toy sizes, eager only, and the
speed cases for fewer models: it proves the code runs, not the speed. ``--budget``: seconds
from the start; a speed case that would not finish in what is left is skipped, and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from bench_vs_timm import (
    PAIRS,
    build,
    input_chans,
    interleaved,
    loss_of,
    make_step,
    model_input,
    parity_diff,
)
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import vision_tfm as vt
from vision_tfm.accel import cpu_native_bf16, prepare_for_training
from vision_tfm.cli import main as vtfm
from vision_tfm.config import apply_overrides, config_to_dict
from vision_tfm.constants import IMAGENET_MEAN, IMAGENET_STD, MAP_KEYS
from vision_tfm.data.grasp import crop_box
from vision_tfm.export.flops import count_flops, cpu_description, matmul_ceiling
from vision_tfm.io import atomic_save, atomic_write_text
from vision_tfm.models.registry import get_model_entry
from vision_tfm.tasks import ClassificationTask, ClsConfig, build_cls_model
from vision_tfm.tasks.grasp import GraspConfig, GraspTask, predict_grasps
from vision_tfm.train import Trainer
from vision_tfm.train.device import autocast
from vision_tfm.train.optim import build_training

ROOT = Path(__file__).resolve().parents[1]
VIEW = ROOT / "tests" / "fixtures" / "cornell" / "01"
SECTIONS = ("parity", "train", "sdpa", "ckpt", "export", "grasp")
SPEED = ("peak", "speed", "latency", "compile", "infer")
FUSED = {"flash", "efficient", "cudnn"}  # the GPU's fused SDPA kernels
# aten's SDPA ops, forward and backward, and the kernel each names
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "cpu-flash",
    "aten::_scaled_dot_product_attention_math": "math",
}
SDPA_OPS.update({f"{k}_backward": v for k, v in list(SDPA_OPS.items())})
ATTENTION_KERNEL_WORDS = ("flash", "fmha", "attention", "sdpa")


@dataclass(frozen=True)
class Sizes:
    """How big each check runs: the issue's sizes on a GPU, toy ones with ``--quick``."""

    img: int  # ViT / Swin input side
    grasp_img: int  # grasp input side, and the grasp run's data.output_size
    batch: int  # parity, train-step and profiled batches
    train_batch: int  # training speed
    infer_batch: int  # inference speed
    mem_batch: int  # checkpointing's peak memory
    rounds: int  # alternating rounds per speed case
    iters: int  # steps per round (throughput)
    latency_iters: int  # calls per round (batch 1)
    export_model: str
    model_kw: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> create kwargs

    def kw(self, kind: str) -> dict[str, Any]:
        return self.model_kw.get(kind, {})

    def side(self, kind: str) -> int:
        return self.grasp_img if PAIRS[kind][1] is None else self.img


FULL = Sizes(
    img=224,
    grasp_img=224,
    batch=8,
    train_batch=128,
    infer_batch=256,
    mem_batch=64,
    rounds=6,
    iters=10,
    latency_iters=20,
    export_model="vit_small_patch16_224",
)
# the same families at toy sizes (timm builds the same shapes): ViT-S widths two blocks deep;
# Swin's four stages at 64² with 2x2 windows (the last stage is one unshifted window, as at 224)
QUICK = Sizes(
    img=64,
    grasp_img=64,
    batch=2,
    train_batch=2,
    infer_batch=2,
    mem_batch=2,
    rounds=2,
    iters=1,
    latency_iters=1,
    export_model="vit_test",
    model_kw={
        "vit": dict(img_size=64, depth=2),
        "swin": dict(
            img_size=64, window_size=2, embed_dim=32, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8)
        ),
    },
)


@dataclass
class Row:
    """One line of the table."""

    check: str
    model: str
    status: str  # "ok", "FAIL" or "skip"
    result: str
    detail: str = ""
    target: str = ""  # the bar and whether it is met; "" where it sets none
    data: dict[str, Any] = field(default_factory=dict)  # the figures, for the JSON


def toy_sizes(sizes: dict[str, Any]) -> str:
    """What ``--quick`` shrinks, for the table's header."""
    kw = "; ".join(
        f"{PAIRS[k][0]}: " + ", ".join(f"{n}={v}" for n, v in d.items())
        for k, d in sizes["model_kw"].items()
    )
    return f"{kw}; others at {sizes['grasp_img']}², batch {sizes['batch']}"


class Report:
    """Rows as they come: printed, and the JSON and Markdown rewritten under ``out``."""

    def __init__(self, out: Path | None, header: dict[str, Any]) -> None:
        self.out, self.header, self.rows = out, header, []
        self.t0 = time.perf_counter()
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        t = time.perf_counter() - self.t0
        print(
            f"[{t:6.1f}s] {row.check:<8} {row.model:<34} {row.status:<4} {row.result}"
            + (f" | {row.detail}" if row.detail else "")
            + (f" | target {row.target}" if row.target else ""),
            flush=True,
        )
        self.write()
        return row

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == "FAIL"]

    def markdown(self) -> str:
        h = self.header
        lines = [
            f"gpu_check on {h['device']}: torch {h['torch']}, timm {h['timm']}, "
            f"onnxruntime {h['onnxruntime']}",
            "",
        ]
        if h["quick"]:
            lines += [f"`--quick`: toy sizes, eager only ({toy_sizes(h['sizes'])})", ""]
        lines += ["| check | model | status | result | target | detail |", "|---" * 6 + "|"]
        for r in self.rows:
            lines.append(
                f"| {r.check} | {r.model} | {r.status} | {r.result} | {r.target or '-'} "
                f"| {r.detail} |"
            )
        return "\n".join(lines) + "\n"

    def write(self, complete: bool = False) -> None:
        if self.out is None:
            return
        doc = {
            **self.header,
            "elapsed_s": round(time.perf_counter() - self.t0, 1),
            "complete": complete,
            "failed": len(self.failed),
            "rows": [asdict(r) for r in self.rows],
        }
        text = json.dumps(doc, indent=2, default=str) + "\n"
        atomic_write_text(text, self.out / "gpu_check.json")
        atomic_write_text(self.markdown(), self.out / "gpu_check.md")


@dataclass
class Context:
    """What every check reads: the device, the sizes, the clock and the peak once measured."""

    device: torch.device
    sizes: Sizes
    deadline: float
    quick: bool
    peak: float | None = None  # bf16 matmul FLOP/s
    sdpa_differs: dict[str, bool] = field(default_factory=dict)  # kind -> ours' kernel != timm's

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def label(self, kind: str) -> str:
        """The model's name; "(toy)" with ``--quick``, whose sizes the header lists."""
        return PAIRS[kind][0] + " (toy)" * self.quick


def release(ctx: Context) -> None:
    """Let go of the last case's models and compiled graphs before the next one."""
    gc.collect()
    if ctx.gpu:
        torch.cuda.empty_cache()


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """fp32 without TF32 (cuDNN's convolutions take it by default), for 1e-4 parity."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def inputs(ctx: Context, kind: str, batch: int) -> torch.Tensor:
    side = ctx.sizes.side(kind)
    return torch.randn(batch, input_chans(kind), side, side, device=ctx.device)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# --- correctness -------------------------------------------------------------------------------


def check_logits(ctx: Context, kind: str, prec: str) -> Row:
    torch.manual_seed(0)
    x = inputs(ctx, kind, ctx.sizes.batch)
    with full_fp32():
        ours, ref, _ = build(kind, prec, "train", device=ctx.device, model_kw=ctx.sizes.kw(kind))
        held, tol = parity_diff(ours, ref, x, prec)  # as the engine holds it, evaluating
        fast = vt.optimize_for_inference(ours, dtype=torch.bfloat16 if prec == "bf16" else None)
        optimized, _ = parity_diff(fast, ref, x, prec)
    ok = max(held, optimized) <= tol
    return Row(
        "parity",
        ctx.label(kind),
        "ok" if ok else "FAIL",
        f"{prec} max abs diff {held:.1e} (engine), {optimized:.1e} (optimize_for_inference)",
        f"tolerance {tol:.1e}, batch {len(x)}",
        data={"precision": prec, "engine": held, "optimized": optimized, "tolerance": tol},
    )


def fake_batch(ctx: Context, kind: str, model: torch.nn.Module) -> tuple:
    """A batch as the kind's task loader gives one: images and labels, or RGB-D and maps."""
    x = inputs(ctx, kind, ctx.sizes.batch).cpu()
    if PAIRS[kind][1] is not None:
        return x, torch.randint(0, model.num_classes, (len(x),))
    shape = (len(x), 1, *x.shape[-2:])
    maps = {k: torch.rand(shape) * 2 - 1 for k in MAP_KEYS}
    maps["quality"] = (torch.rand(shape) > 0.9).float()
    maps["width"] = torch.rand(shape)
    return x, maps, None


def check_train_step(ctx: Context, kind: str, precision: str) -> Row:
    label = ctx.label(kind)
    if precision == "amp" and not ctx.gpu:
        return Row("train", label, "skip", "fp16 AMP + GradScaler", "no CUDA (amp is bf16 here)")
    name = PAIRS[kind][0]
    over = {"model.name": name, "run.precision": precision}
    cfg = apply_overrides(GraspConfig() if PAIRS[kind][1] is None else ClsConfig(), over)
    task = GraspTask(cfg) if PAIRS[kind][1] is None else ClassificationTask(cfg)
    torch.manual_seed(0)
    model = prepare_for_training(vt.create_model(name, **ctx.sizes.kw(kind)).to(ctx.device))
    model.train()
    scaled = precision == "amp" and ctx.gpu
    _, opt, _, scaler, _ = build_training(model, cfg, ctx.sizes.batch, 1, scaled)
    batch = fake_batch(ctx, kind, model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    before = [p.detach().clone() for _, p in named]
    losses, missing, bad = [], [], []
    for _ in range(4):  # the scaler skips a step whose gradients overflowed; it halves its scale
        with autocast(precision, ctx.device):
            loss, _ = task.loss(model, batch, ctx.device)
        losses.append(loss.item())
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        missing = [n for n, p in named if p.grad is None]
        bad = [n for n, p in named if p.grad is not None and not torch.isfinite(p.grad).all()]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if not bad:
            break
    moved = sum(not torch.equal(a, p) for a, (_, p) in zip(before, named))
    finite = all(math.isfinite(v) for v in losses)
    ok = finite and not missing and not bad and moved > 0
    what = "fp16 AMP + GradScaler" if scaled else f"{precision} autocast"
    problems = [f"no grad: {missing[:3]}"] * bool(missing)
    problems += [f"non-finite grad: {bad[:3]}"] * bool(bad)
    return Row(
        "train",
        label,
        "ok" if ok else "FAIL",
        f"{what}: loss {losses[-1]:.4f}, {moved}/{len(named)} tensors updated",
        "; ".join(problems)
        or f"{len(losses) - 1} step(s) skipped by the scaler" * (len(losses) > 1),
        data={"precision": what, "losses": losses, "updated": moved, "params": len(named)},
    )


def attention_kernels(ctx: Context, model: torch.nn.Module, x: torch.Tensor) -> tuple[list, list]:
    """(backends, GPU kernel names) of one profiled bf16 training step of ``model``."""
    step = make_step(model, x, "train", "bf16")
    step()  # lazy initialisation and kernel choice out of the profile
    ctx.sync()
    acts = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * ctx.gpu
    with profile(activities=acts) as prof:
        step()
        ctx.sync()
    events = prof.events()
    names = {e.name for e in events}
    backends = sorted({SDPA_OPS[n] for n in names if n in SDPA_OPS})
    if not backends:  # no SDPA op: the explicit path's softmax, or no attention seen at all
        backends = ["explicit"] if names & {"aten::_softmax", "aten::softmax"} else ["none"]
    kernels = sorted(
        {
            e.name
            for e in events
            if e.device_type == DeviceType.CUDA
            and any(w in e.name.lower() for w in ATTENTION_KERNEL_WORDS)
        }
    )
    return backends, kernels


def check_sdpa(ctx: Context, kind: str) -> Row:
    ours, ref, _ = build(kind, "bf16", "train", device=ctx.device, model_kw=ctx.sizes.kw(kind))
    x = inputs(ctx, kind, ctx.sizes.batch)
    mine, kernels = attention_kernels(ctx, ours, x)
    theirs, _ = attention_kernels(ctx, ref, x)
    ctx.sdpa_differs[kind] = mine != theirs
    # the aten op is SDPA's own choice; the kernels are what ran of it
    ok = set(mine) <= FUSED if ctx.gpu else "none" not in mine
    short = ", ".join(k[:60] for k in kernels[:3]) or "none named flash/fmha/attention/sdpa"
    return Row(
        "sdpa",
        ctx.label(kind),
        "ok" if ok else "FAIL",
        f"bf16 training step: ours {'+'.join(mine)}, timm {'+'.join(theirs)}",
        f"GPU kernels: {short}" if ctx.gpu else "CPU: no GPU kernels to read",
        data={"ours": mine, "timm": theirs, "kernels": kernels},
    )


def check_checkpointing(ctx: Context, kind: str) -> Row:
    torch.manual_seed(0)
    model = vt.create_model(PAIRS[kind][0], **ctx.sizes.kw(kind))
    model = prepare_for_training(model.to(ctx.device)).train()
    x = inputs(ctx, kind, ctx.sizes.batch)
    grads = {}
    with full_fp32():
        for ckpt in (False, True):
            model.set_grad_checkpointing(ckpt)
            model.zero_grad(set_to_none=True)
            loss_of(model(x)).backward()
            grads[ckpt] = [p.grad.clone() for p in model.parameters()]
    scale = max(g.abs().max().item() for g in grads[False])
    diff = max((a - b).abs().max().item() for a, b in zip(grads[False], grads[True]))
    ok = diff <= 1e-5 * scale
    data: dict[str, Any] = {"grad_max_abs_diff": diff, "grad_scale": scale}
    memory = "peak memory n/a on a CPU"
    if ctx.gpu:
        xb = inputs(ctx, kind, ctx.sizes.mem_batch)
        for p in model.parameters():  # gradients held before: not part of the step's peak
            p.grad = torch.zeros_like(p)
        peaks = {}
        for ckpt in (False, True):
            model.set_grad_checkpointing(ckpt)
            for _ in range(2):  # the first allocates the allocator's pools; the second is read
                ctx.sync()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                with autocast("bf16", ctx.device):
                    loss = loss_of(model(xb))
                loss.backward()
                ctx.sync()
                peaks[ckpt] = (torch.cuda.max_memory_allocated() - base) / 2**20
        data.update(peak_mib_plain=peaks[False], peak_mib_ckpt=peaks[True])
        memory = (
            f"bf16 batch {ctx.sizes.mem_batch} step peak {peaks[False]:.0f} MiB plain, "
            f"{peaks[True]:.0f} MiB checkpointed ({1 - peaks[True] / peaks[False]:.0%} less)"
        )
    return Row(
        "ckpt",
        ctx.label(kind),
        "ok" if ok else "FAIL",
        f"fp32 grads max abs diff {diff:.1e} (largest grad {scale:.1e})",
        memory,
        data=data,
    )


def cls_checkpoint(folder: Path, name: str, size: int) -> Path:
    """An untrained RGB classifier saved as a training checkpoint over the embedded digits
    (turned to RGB, resized to ``size``): export's parity needs real images, not training."""
    over = {"model.name": name, "data.img_size": size, "data.in_chans": 3}
    cfg = apply_overrides(ClsConfig(), over)
    torch.manual_seed(0)
    model = build_cls_model(cfg.model, 10, 3, size)
    meta = {
        "task": "cls",
        "model_name": name,
        "num_classes": 10,
        "in_chans": 3,
        "img_size": size,
        "class_names": [str(i) for i in range(10)],
        "mean": list(IMAGENET_MEAN),
        "std": list(IMAGENET_STD),
    }
    path = folder / f"{name}.pt"
    atomic_save({"model": model.state_dict(), "config": config_to_dict(cfg), "meta": meta}, path)
    return path


def device_session(path: Path, ctx: Context) -> tuple[Any, str]:
    """An onnxruntime session on the GPU where this onnxruntime has the CUDA provider (no
    TF32, for fp32 parity), else the CPU session ``vtfm export`` checks with."""
    import onnxruntime as ort

    from vision_tfm.export.onnx import ort_session

    if ctx.gpu and "CUDAExecutionProvider" in ort.get_available_providers():
        cuda = ("CUDAExecutionProvider", {"use_tf32": "0"})
        session = ort.InferenceSession(str(path), providers=[cuda, "CPUExecutionProvider"])
        return session, session.get_providers()[0]
    return ort_session(path), "CPUExecutionProvider"


def check_export(ctx: Context) -> Row:
    import onnxruntime as ort

    from vision_tfm.export import check_parity, load_source
    from vision_tfm.export.onnx import parity_inputs

    name = ctx.sizes.export_model
    size = get_model_entry(name).cfg.img_size
    images = 2 if ctx.quick else 8
    with tempfile.TemporaryDirectory() as d:
        ckpt = cls_checkpoint(Path(d), name, size)
        onnx_path = Path(d) / "model.onnx"
        t0 = time.perf_counter()
        args = ["export", "--checkpoint", ckpt, "--out", onnx_path, "--parity-images", images]
        try:
            vtfm([str(a) for a in args])
        except SystemExit as e:  # the CLI's one-line error is on stderr above
            if e.code:
                raise RuntimeError(f"vtfm export exited {e.code}") from None
        export_s = time.perf_counter() - t0
        source = load_source(ckpt)
        xs = parity_inputs(source, source.img_size, frozenset({"batch"}), images)
        session, provider = device_session(onnx_path, ctx)
        report = check_parity(session, source.torch_runner(), xs, 1e-4)
    worst = max(c.max_abs_diff for c in report.checks)
    note = ""
    if ctx.gpu and provider != "CUDAExecutionProvider":
        listed = "CUDAExecutionProvider" in ort.get_available_providers()
        note = (
            " (the CUDA provider is listed but the session fell back to the CPU)"
            if listed
            else " (this onnxruntime has no CUDA provider: onnxruntime-gpu is not installed)"
        )
    return Row(
        "export",
        f"{name} ({size}²)",
        "ok" if report.ok else "FAIL",
        f"vtfm export in {export_s:.0f} s; {provider} max abs diff {worst:.1e}",
        report.summary() + note,
        data={
            "provider": provider,
            "available": ort.get_available_providers(),
            "max_abs_diff": worst,
            "export_s": export_s,
        },
    )


def check_grasp(ctx: Context) -> Row:
    size = ctx.sizes.grasp_img
    precision = "amp" if ctx.gpu else "bf16"
    with tempfile.TemporaryDirectory() as d:
        over = {
            "model.name": "grasp_hybrid_t",
            "data.root": str(VIEW.parent),
            "data.output_size": size,
            "data.train_frac": 0.67,
            "data.batch_size": 2,
            "sched.epochs": 1,
            "run.tensorboard": False,
            "run.plots": False,
            "run.out_dir": d,
            "run.device": ctx.device.type,
            "run.precision": precision,
        }
        cfg = apply_overrides(GraspConfig(), over)
        trainer = Trainer(cfg, GraspTask(cfg))
        trainer.fit()
        loss = trainer.history[-1]["train_loss"]
        rgb, depth = VIEW / "pcd0100r.png", VIEW / "pcd0100d.tiff"
        t0 = time.perf_counter()
        grasps, image = predict_grasps(trainer.run_dir / "best.pt", rgb, depth, 3)
        predict_ms = (time.perf_counter() - t0) * 1e3
    H, W = image.shape[:2]
    x0, y0, side = crop_box((H, W), min(cfg.data.crop_size, H, W))
    inside = all(x0 - 1 <= g.x <= x0 + side and y0 - 1 <= g.y <= y0 + side for g in grasps)
    ok = math.isfinite(loss) and 1 <= len(grasps) <= 3 and inside
    top = grasps[0] if grasps else None
    where = "in the centre crop" if inside else "NOT all in the centre crop"
    return Row(
        "grasp",
        f"grasp_hybrid_t ({size}²)",
        "ok" if ok else "FAIL",
        f"1 epoch {precision} on {ctx.device.type}: loss {loss:.3f}; predict_grasps: "
        f"{len(grasps)} grasps {where}",
        (f"top at ({top.x:.0f}, {top.y:.0f}) px, q {top.quality:.2f}; " if top else "")
        + f"predict_grasps (CPU, checkpoint load included) {predict_ms:.0f} ms",
        data={"loss": loss, "grasps": len(grasps), "inside": inside, "predict_ms": predict_ms},
    )


# --- speed -------------------------------------------------------------------------------------


def check_peak(ctx: Context) -> Row:
    if not ctx.gpu and not cpu_native_bf16():
        return Row("peak", "bf16 matmul", "skip", "bf16 is emulated on this CPU: no peak")
    sizes, seconds = ((256, 512), 0.2) if ctx.quick else ((4096, 8192), 1.0)
    ctx.peak = matmul_ceiling(torch.bfloat16, sizes=sizes, seconds=seconds, device=ctx.device)
    return Row(
        "peak",
        "bf16 matmul",
        "ok",
        f"{ctx.peak / 1e12:.1f} TFLOP/s",
        f"best of {' and '.join(f'{n}²' for n in sizes)}, {seconds:g} s each",
        data={"flops": ctx.peak, "sizes": list(sizes)},
    )


def mfu(ctx: Context, flops_per_s: float) -> str:
    return "-" if ctx.peak is None else f"{flops_per_s / ctx.peak:.0%}"


def check_train_speed(ctx: Context, kind: str, compile: bool) -> Row:
    s = ctx.sizes
    ours, ref, _ = build(kind, "bf16", "train", compile, device=ctx.device, model_kw=s.kw(kind))
    x = inputs(ctx, kind, s.train_batch)
    per_image = 3 * count_flops(getattr(ref, "_orig_mod", ref), x[:2])  # forward + backward
    steps = {k: make_step(m, x, "train", "bf16") for k, m in (("ours", ours), ("timm", ref))}
    t, first = interleaved(steps, s.rounds, s.iters, ctx.sync)
    del steps, ours, ref
    if compile:
        torch._dynamo.reset()
    release(ctx)
    ratio = t["timm"] / t["ours"]
    rate = {k: len(x) / v for k, v in t.items()}
    util = {k: mfu(ctx, per_image * r) for k, r in rate.items()}
    bar = 1.2 if ctx.sdpa_differs.get(kind) else 1.0
    targets = [(ratio >= bar, f">= {bar:.1f}x timm")]
    if compile and kind == "vit" and ctx.peak is not None:
        targets.append((per_image * rate["ours"] / ctx.peak >= 0.45, ">= 45% MFU"))
    compiled = f"; first step (compiling): ours {first['ours']:.0f} s, timm {first['timm']:.0f} s"
    return Row(
        "compile" if compile else "speed",
        ctx.label(kind),
        "ok",
        f"train b{len(x)} bf16{' compiled' * compile}: ours {rate['ours']:.0f} img/s "
        f"({util['ours']} MFU), timm {rate['timm']:.0f} img/s ({util['timm']}), "
        f"x{ratio:.2f}",
        f"AdamW, {s.rounds} rounds x {s.iters} steps" + compiled * compile,
        target=verdict(ctx, targets),
        data={
            "img_per_s": rate,
            "ratio": ratio,
            "flops_per_image": per_image,
            "first_call_s": first,
            "compiled": compile,
        },
    )


def verdict(ctx: Context, targets: list[tuple[bool, str]]) -> str:
    """The issue's bars, with whether each is met; toy sizes and CPUs meet none of them."""
    if ctx.quick or not ctx.gpu:
        return ", ".join(bar for _, bar in targets) + " (GPU, full run)"
    return ", ".join(f"{bar}: {'met' if ok else 'MISSED'}" for ok, bar in targets)


def check_infer_speed(ctx: Context, kind: str) -> Row:
    s = ctx.sizes
    ours, ref, label = build(kind, "bf16", "infer", device=ctx.device, model_kw=s.kw(kind))
    diff, tol = parity_diff(ours, ref, inputs(ctx, kind, s.batch), "bf16")
    x = inputs(ctx, kind, s.infer_batch)
    steps = {
        "ours": make_step(ours, model_input(ours, x), "infer", "bf16"),
        label: make_step(ref, x, "infer", "bf16"),
    }
    t, _ = interleaved(steps, s.rounds, s.iters, ctx.sync)
    del steps, ours, ref
    release(ctx)
    rate = {k: len(x) / v for k, v in t.items()}
    return Row(
        "infer",
        ctx.label(kind),
        "ok" if diff <= tol else "FAIL",
        f"b{len(x)} bf16: ours {rate['ours']:.0f} img/s, {label} {rate[label]:.0f} img/s, "
        f"x{t[label] / t['ours']:.2f}",
        f"ours bf16 weights (optimize_for_inference), {label} autocast; max abs diff {diff:.1e}",
        data={"img_per_s": rate, "ratio": t[label] / t["ours"], "max_abs_diff": diff},
    )


def check_latency(ctx: Context, kind: str, prec: str, compile: bool = False) -> Row:
    s = ctx.sizes
    ours, ref, label = build(kind, prec, "infer", compile, device=ctx.device, model_kw=s.kw(kind))
    x = inputs(ctx, kind, 1)
    plain = {
        "ours": make_step(ours, model_input(ours, x), "infer", prec),
        label: make_step(ref, model_input(ref, x), "infer", prec),
    }

    def waited(step: Callable[[], None]) -> Callable[[], None]:
        return lambda: (step(), ctx.sync())  # latency: every call waited for

    steps = {k: waited(v) for k, v in plain.items()}
    t, first = interleaved(steps, s.rounds, s.latency_iters)
    del steps, plain, ours, ref
    if compile:
        torch._dynamo.reset()
    release(ctx)
    ms = {k: v * 1e3 for k, v in t.items()}
    targets = [(ms["ours"] <= 5.0, "<= 5 ms")] if kind == "grasp" else []
    return Row(
        "compile" if compile else "latency",
        ctx.label(kind),
        "ok",
        f"b1 {prec}{' compiled' * compile}: ours {ms['ours']:.2f} ms, {label} {ms[label]:.2f} ms",
        f"median of {s.rounds} rounds x {s.latency_iters} calls"
        + f"; first call (compiling): ours {first['ours']:.0f} s" * compile,
        target=verdict(ctx, targets) if targets else "",
        data={"ms": ms, "precision": prec, "compiled": compile},
    )


# --- the run -----------------------------------------------------------------------------------


Case = tuple[str, str, float, Callable[[], Row]]  # section, model label, seconds, the check


def plan(ctx: Context) -> list[Case]:
    """The cases in the order they run: correctness first, then the speed cases the issue's
    targets name, the costly compiles late. The seconds are a rough guess of a case's time on
    an H100 (a row's JSON has the real one), so a case the budget cannot fit is skipped."""
    cases: list[Case] = []

    def add(section: str, kind: str | None, fn: Callable[[], Row], seconds: float = 0) -> None:
        cases.append((section, ctx.label(kind) if kind else "", seconds, fn))

    for kind in ("vit", "swin"):
        for prec in ("fp32", "bf16"):
            add("parity", kind, lambda k=kind, p=prec: check_logits(ctx, k, p))
    for kind in ("vit", "swin", "grasp_t"):
        for precision in ("bf16", "amp"):
            add("train", kind, lambda k=kind, p=precision: check_train_step(ctx, k, p))
    for kind in ("vit", "swin"):
        add("sdpa", kind, lambda k=kind: check_sdpa(ctx, k))
        add("ckpt", kind, lambda k=kind: check_checkpointing(ctx, k))
    add("export", None, lambda: check_export(ctx))
    add("grasp", "grasp_t", lambda: check_grasp(ctx))
    add("peak", None, lambda: check_peak(ctx), 10)
    # --quick: one model per speed case (the code is the same for every model)
    for kind in ("vit",) if ctx.quick else ("vit", "swin"):
        add("speed", kind, lambda k=kind: check_train_speed(ctx, k, False), 20)
    latency = [(k, p) for k in ("vit", "swin", "grasp_t", "grasp") for p in ("fp32", "bf16")]
    for kind, prec in [("grasp_t", "bf16")] if ctx.quick else latency:
        add("latency", kind, lambda k=kind, p=prec: check_latency(ctx, k, p), 5)
    if not ctx.quick:  # compiling takes minutes on a CPU: the GPU run covers it
        for kind, seconds in (("vit", 100), ("swin", 150)):
            add("compile", kind, lambda k=kind: check_train_speed(ctx, k, True), seconds)
    for kind in ("vit",) if ctx.quick else ("vit", "swin"):
        add("infer", kind, lambda k=kind: check_infer_speed(ctx, k), 15)
    if not ctx.quick:
        add("compile", "grasp", lambda: check_latency(ctx, "grasp", "bf16", True), 60)
    return cases


def header(ctx: Context) -> dict[str, Any]:
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "not installed"
    if ctx.gpu:
        props = torch.cuda.get_device_properties(ctx.device)
        device = f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    else:
        device = f"CPU: {cpu_description()}, torch threads {torch.get_num_threads()}"
    return {
        "device": device,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "onnxruntime": ort_version,
        "numpy": np.__version__,
        "quick": ctx.quick,
        "sizes": asdict(ctx.sizes),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="toy sizes, eager only (CI)")
    p.add_argument("--only", help=f"comma list from {', '.join(SECTIONS + SPEED)}")
    p.add_argument("--out", help="folder for gpu_check.json and .md (default: $OUT if set)")
    p.add_argument("--budget", type=float, default=330.0, help="seconds the speed cases may use")
    args = p.parse_args()
    only = set(args.only.split(",")) if args.only else set(SECTIONS + SPEED)
    if only - set(SECTIONS + SPEED):
        p.error(f"--only: unknown {sorted(only - set(SECTIONS + SPEED))}")
    want = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    if want == "auto":
        want = "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible")
    if args.quick:  # toy sizes gain nothing from threads, which would spin on CI's shared cores
        torch.set_num_threads(1)
    ctx = Context(
        torch.device(want),
        QUICK if args.quick else FULL,
        time.perf_counter() + args.budget,
        args.quick,
    )
    out = args.out or os.environ.get("OUT")
    report = Report(Path(out) if out else None, header(ctx))
    print(f"gpu_check on {report.header['device']}", flush=True)
    for section, model, seconds, fn in plan(ctx):
        if section not in only:
            continue
        if section in SPEED and not ctx.quick and ctx.left() < seconds:
            report.add(Row(section, model, "skip", f"time budget: {ctx.left():.0f} s left"))
            continue
        t0 = time.perf_counter()
        try:
            row = fn()
        except Exception as e:  # a dead path is a finding: record it, go on to the next
            traceback.print_exc()
            row = Row(section, model, "FAIL", first_line(e))
            release(ctx)
        row.data["seconds"] = round(time.perf_counter() - t0, 2)  # sizes the next run's budget
        report.add(row)
    report.write(complete=True)
    print("\n" + report.markdown())
    if report.failed:
        print(f"{len(report.failed)} row(s) failed", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""What this CPU can do, and the attention plan built on it.

The capability facts are read once per process (:func:`cpu_capability`,
:func:`cpu_native_bf16`, :func:`cpu_amx`) and are constants to ``torch.compile`` and
``torch.export``, so a compiled or exported graph takes the branch eager takes on the same
machine. Where bf16 is emulated, :func:`warn_if_bf16_emulated` tells the user (training,
``vtfm benchmark`` and ``optimize_for_inference`` call it) with the slow-down a tiny matmul
probe measures. ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``
makes an AVX-512 machine answer, and compute, as an AVX2 one (ATen's kernels, oneDNN, and MKL,
which runs the fp32 matmuls).

:func:`attention_plan` picks, per softmax-attention call, SDPA or the explicit path
(:mod:`.attention` applies it). Its rules are re-measured by

- ``benchmarks/attention_dispatch.py``: every path at the layer level (a ViT-S layer and
  Swin-T windows), interleaved, with the one the plan picks;
- ``benchmarks/bench_vs_timm.py --attn sdpa`` / ``--attn explicit``: the whole model against
  timm, one path forced.

The figures, per CPU kind, are in docs/results/speed.md.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import time
from typing import NamedTuple

import torch

from ..layers.attention import softmax_in_fp32

log = logging.getLogger("vision_tfm")


@functools.cache
def _cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


@torch.compiler.assume_constant_result
def cpu_capability() -> str:
    """ATen's vector ISA for this CPU: ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``, ``"SVE256"``..."""
    return _cpu_capability()


@functools.cache
def _cpu_native_bf16() -> bool:
    if platform.machine().lower() in ("x86_64", "amd64", "i386", "i686"):
        bf16_units = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        # ATen's own kernels (softmax, casts) must be the AVX-512 ones too
        hardware = bf16_units and _cpu_capability().startswith("AVX512")
    else:  # Arm: oneDNN's check below is the BF16 extension itself
        hardware = True
    # oneDNN's own check honours ONEDNN_MAX_CPU_ISA, so a capped ISA reads as emulated bf16
    return bool(hardware and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@torch.compiler.assume_constant_result
def cpu_native_bf16() -> bool:
    """bf16 matmuls in hardware (AVX512_BF16 or AMX on x86), not emulated in fp32 units."""
    return _cpu_native_bf16()


@functools.cache
def _cpu_amx() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and torch.cpu._is_amx_tile_supported()


@torch.compiler.assume_constant_result
def cpu_amx() -> bool:
    """AMX tiles (Intel Xeon since Sapphire Rapids): oneDNN's bf16 SDPA and GEMM kernels
    run on them; CPUs with AVX512_BF16 alone (AMD Zen 4 and 5) have dot-product units only."""
    return _cpu_amx()


@functools.cache
def onednn_bf16_runs() -> bool:
    """oneDNN's bf16 kernels (packed Linear, ``_linear_pointwise``) run on this CPU: the check
    torch makes before calling them (``mkldnn_bf16_device_check``, which honours
    ``ONEDNN_MAX_CPU_ISA``). It is a guard on a kernel call, not a speed fact: the plan's facts
    above may be replaced (tests fake other CPU kinds), this one never is, so no path calls a
    kernel the real CPU lacks."""
    mkldnn = torch.backends.mkldnn.is_available()
    return bool(mkldnn and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_dot_units_only() -> bool:
    """Native bf16 from AVX512_BF16 dot products without AMX: SDPA's bf16 kernel is slow there."""
    return cpu_native_bf16() and not cpu_amx() and cpu_capability().startswith("AVX512")


@functools.cache
def bf16_matmul_slowdown(n: int = 256) -> float:
    """How many times longer a bf16 ``n x n`` matmul takes than an fp32 one on this CPU (best
    of 3 each, after a warm-up); kept small, as the bf16 one is slow where it is emulated."""
    best = {}
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            torch.mm(a, b)
            runs = []
            for _ in range(3):
                t = time.perf_counter()
                torch.mm(a, b)
                runs.append(time.perf_counter() - t)
            best[dtype] = min(runs)
    return best[torch.bfloat16] / best[torch.float32]


def dispatch_facts() -> str:
    """The CPU facts the plan reads, as benchmark footers print them."""
    return f"ATen capability {cpu_capability()}, native bf16 {cpu_native_bf16()}, AMX {cpu_amx()}"


def emulated_bf16_note() -> str | None:
    """One line saying bf16 is emulated on this CPU, with the probe's factor; None if native."""
    if cpu_native_bf16():
        return None
    return (
        f"bf16 is emulated on this CPU ({cpu_capability()}, no AVX512_BF16 or AMX): a bf16 "
        f"matmul ran {bf16_matmul_slowdown():.1f}x slower than fp32 here"
    )


def warn_if_bf16_emulated(instead: str) -> str | None:
    """Log one warning line where bf16 is emulated, ending with ``instead`` (the fp32 setting
    to use); returns the note (None where bf16 is native)."""
    note = emulated_bf16_note()
    if note is not None:
        log.warning("warning: %s; %s", note, instead)
    return note


# the ISA extensions that decide fp32 / bf16 / int8 kernel speed, in the order they appeared
MATRIX_ISA = ("avx2", "avx512f", "avx_vnni", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_description(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """CPU model and its matrix ISA extensions (:data:`MATRIX_ISA`), logged with every speed
    table: ratios between formats move with the CPU (docs/results/export.md)."""
    name, flags = "", set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass  # not Linux: platform's answer is all there is
    name = name or platform.processor() or "unknown CPU model"  # callers add the machine
    isa = [f for f in MATRIX_ISA if f in flags]
    return f"{name} [{' '.join(isa)}]" if isa else name


class AttentionPlan(NamedTuple):
    """How one softmax-attention call runs."""

    fused: bool  # SDPA; else the explicit path
    upcast: bool = False  # explicit path: add the bias and take the softmax in fp32
    contiguous: bool = False  # explicit path: q, k, v as contiguous blocks, not views of qkv


def attention_plan(q: torch.Tensor, has_bias: bool, need_weights: bool) -> AttentionPlan:
    """SDPA unless the weights are wanted or the explicit path measured faster: in training,
    bf16 on a CPU with native bf16, and Swin windows; in inference, bf16 on a CPU whose bf16
    is AVX512_BF16 without AMX. Re-measured by ``benchmarks/attention_dispatch.py`` (layer
    level) and ``benchmarks/bench_vs_timm.py --attn sdpa|explicit`` (whole model).

    Args:
        q: Queries ``(..., h, N, d)``; more than 4 dims means Swin windows.
        has_bias: An additive bias (relative position, shift mask) comes with the call.
        need_weights: The caller wants the softmax weights, which SDPA never forms.
    """
    training = q.requires_grad
    if not need_weights:
        if q.device.type != "cpu":
            return AttentionPlan(fused=True)  # CUDA and others: no measurement says otherwise
        bf16 = q.dtype == torch.bfloat16
        # inference (bench_vs_timm.py --attn, ViT-S and Swin-T, and attention_dispatch.py):
        # SDPA leads in fp32 on every CPU kind, and in bf16 with AMX or where bf16 is
        # emulated; with AVX512_BF16 and no AMX (AMD Zen 5) two bf16 matmuls around a
        # softmax beat SDPA's bf16 kernel on both models
        if not training and not (bf16 and bf16_dot_units_only()):
            return AttentionPlan(fused=True)
        # training (attention_dispatch.py), on each CPU kind:
        # - bf16 emulated (AVX2): SDPA's kernels beat emulated bf16 matmuls, windows included;
        # - bf16 native (AVX512_BF16, AMX): two bf16 matmuls around a softmax beat SDPA's
        #   bf16 backward;
        # - windows: SDPA's backward runs on the folded, materialised bias, slower than the
        #   explicit path broadcasting it.
        if bf16 and not cpu_native_bf16():
            return AttentionPlan(fused=True)
        if not (bf16 or q.dim() > 4):
            return AttentionPlan(fused=True)
    upcast = softmax_in_fp32(q, has_bias)
    # bench_vs_timm.py (Swin-T, whole model): contiguous q, k, v speed up the eager training
    # step's matmuls; in inference the strided views are faster, and graphs (compile, export)
    # need neither.
    contiguous = training and not torch.compiler.is_compiling()
    return AttentionPlan(fused=False, upcast=upcast, contiguous=contiguous)

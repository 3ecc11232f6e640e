"""Which softmax-attention kernel runs, decided by what the device can do.

Two paths compute the same thing: ``F.scaled_dot_product_attention`` (SDPA, the fused kernel)
and the explicit one, ``softmax(q kᵀ · scale + bias) v`` as two matmuls around a softmax.
:func:`attention_plan` picks one per call from the tensor (device, dtype, autograd, extra
leading dims) and the CPU's capability. Each rule names the benchmark that justifies it;
the figures, per CPU kind, are in the README's speed section:

- ``benchmarks/attention_dispatch.py`` times every path at the layer level (a ViT-S layer and
  Swin-T windows), interleaved, and prints which one the plan picks;
- ``benchmarks/bench_vs_timm.py`` checks the whole model against timm.

The CPU's capability is read once per process (:func:`cpu_capability`,
:func:`cpu_native_bf16`) and is a constant to ``torch.compile`` and ``torch.export``, so a
compiled or exported graph takes the branch eager takes on the same machine. Where bf16 is
emulated, :func:`warn_if_bf16_emulated` tells the user (training, ``vtfm benchmark`` and
``optimize_for_inference`` call it) with the slow-down a tiny matmul probe measures.
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` makes an
AVX-512 machine answer, and compute, as an AVX2 one (ATen's kernels, oneDNN, and MKL, which
runs the fp32 matmuls).
"""

from __future__ import annotations

import functools
import logging
import platform
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..errors import InputError
from .cache import tracing

log = logging.getLogger("vision_tfm")

LOW_PRECISION = (torch.bfloat16, torch.float16)


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


def bf16_dot_units_only() -> bool:
    """Native bf16 from AVX512_BF16 dot products without AMX: SDPA's bf16 kernel is slow there."""
    return cpu_native_bf16() and not cpu_amx() and cpu_capability().startswith("AVX512")


@functools.cache
def bf16_matmul_slowdown(n: int = 256) -> float:
    """How many times longer a bf16 ``n x n`` matmul takes than an fp32 one on this CPU (best
    of 3 each, after a warm-up): tens of milliseconds where bf16 is emulated."""
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
    """The CPU facts the dispatch reads, as benchmark footers print them."""
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


class AttentionPlan(NamedTuple):
    """How one softmax-attention call runs."""

    fused: bool  # SDPA; else the explicit path
    upcast: bool = False  # explicit path: add the bias and take the softmax in fp32
    contiguous: bool = False  # explicit path: q, k, v as contiguous blocks, not views of qkv


def attention_plan(q: torch.Tensor, has_bias: bool, need_weights: bool) -> AttentionPlan:
    """SDPA unless the weights are wanted or the explicit path measured faster: in training,
    bf16 on a CPU with native bf16, and Swin windows; in inference, bf16 on a CPU whose bf16
    is AVX512_BF16 without AMX.

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
        # inference: benchmarks/bench_vs_timm.py --attn sdpa / explicit (ViT-S and Swin-T,
        # whole model) and benchmarks/attention_dispatch.py (layer level) put SDPA ahead in
        # fp32 on every CPU kind, and in bf16 with AMX or where bf16 is emulated; with
        # AVX512_BF16 and no AMX (AMD Zen 5) SDPA's bf16 kernel lost to two bf16 matmuls
        # around a softmax on both models
        if not training and not (bf16 and bf16_dot_units_only()):
            return AttentionPlan(fused=True)
        # benchmarks/attention_dispatch.py, training, on each CPU kind:
        # - bf16 emulated (AVX2): SDPA's kernels beat emulated bf16 matmuls, windows included;
        # - bf16 native (AVX512_BF16, AMX): two bf16 matmuls around a softmax beat SDPA's
        #   bf16 backward;
        # - windows: SDPA's backward runs on the folded, materialised bias, slower than the
        #   explicit path broadcasting it.
        if bf16 and not cpu_native_bf16():
            return AttentionPlan(fused=True)
        if not (bf16 or q.dim() > 4):
            return AttentionPlan(fused=True)
    # inference: bias and softmax in fp32 hand back unrounded weights, and on the bf16 path
    # above keep Swin's bias + mask exact; under autograd the fp32 backward costs more
    # (bench_vs_timm.py).
    upcast = has_bias and q.dtype in LOW_PRECISION and not training
    # benchmarks/bench_vs_timm.py (Swin-T, whole model): contiguous q, k, v speed up the eager
    # training step's matmuls; in inference the strided views are faster, and graphs
    # (compile, export) need neither.
    contiguous = training and not torch.compiler.is_compiling()
    return AttentionPlan(fused=False, upcast=upcast, contiguous=contiguous)


def merge_bias_and_mask(
    bias: torch.Tensor | None, mask: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """Fold a boolean keep-mask into one additive float bias (``-inf`` where masked)."""
    if mask is None:
        return None if bias is None else bias.to(dtype)
    if mask.dtype != torch.bool:
        raise InputError(f"attention mask must be bool (True = attend), got {mask.dtype}")
    neg = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )
    return neg if bias is None else bias.to(dtype) + neg


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """SDPA on ``(..., h, N, d)``, leading dims folded into one batch dim.

    SDPA's fused kernels (CPU flash, CUDA flash and memory-efficient) take ``(B, h, N, d)``
    only; with more leading dims it falls back to its slow math path. The bias (and mask,
    merged into it) is expanded to the folded shape.
    """
    bias = merge_bias_and_mask(bias, mask, q.dtype)
    lead = q.shape[:-3]
    if len(lead) > 1:
        if bias is not None:
            full = (*q.shape[:-1], k.shape[-2])  # (..., h, N, N)
            bias = bias.expand(full).reshape(-1, *full[-3:])
        q, k, v = q.flatten(0, -4), k.flatten(0, -4), v.flatten(0, -4)  # (B', h, N, d)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return out.unflatten(0, lead) if len(lead) > 1 else out  # (..., h, N, d)


def scaled_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``q kᵀ · scale``, ``(..., h, N, M)``. In eager mode the scale is the GEMM's ``alpha``
    (``baddbmm``, the input ignored at ``beta=0``), which saves a pass over ``q``; a captured
    graph (compile, export) gets the plain product, which its compiler fuses or exports, and
    so does a ``q`` that autocast would cast (it would cast the ignored input in full too)."""
    device = q.device.type
    if (
        tracing()
        or q.shape[:-2] != k.shape[:-2]
        or (torch.is_autocast_enabled(device) and q.dtype != torch.get_autocast_dtype(device))
    ):
        return (q * scale) @ k.transpose(-2, -1)
    q3, k3 = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:])  # (B', N, d), (B', M, d)
    ignored = q3.new_empty(()).expand(q3.shape[0], q3.shape[1], k3.shape[1])
    out = torch.baddbmm(ignored, q3, k3.transpose(1, 2), beta=0.0, alpha=scale)
    return out.view(*q.shape[:-1], k.shape[-2])


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    upcast: bool = False,
    contiguous: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ · scale + bias) v`` and the weights; a query with no allowed key gets
    zeros, as in SDPA, not NaN. ``upcast`` and ``contiguous`` as in :class:`AttentionPlan`."""
    attn_bias = merge_bias_and_mask(bias, mask, torch.float32 if upcast else q.dtype)
    if contiguous:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    logits = scaled_scores(q, k, scale)  # (..., h, N, N)
    if attn_bias is not None:
        logits = logits + attn_bias  # promotes to fp32 when upcast
    attn = logits.softmax(dim=-1).to(v.dtype)
    if mask is not None:
        attn = attn.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    dropped = F.dropout(attn, dropout_p) if dropout_p else attn
    return dropped @ v, attn  # (..., h, N, d)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(q kᵀ · scale + bias) v`` on the path :func:`attention_plan` picks, ``(..., h,
    N, d)``, and the weights when the explicit path ran (always when ``need_weights``)."""
    plan = attention_plan(q, bias is not None, need_weights)
    if plan.fused:
        return sdpa_attention(q, k, v, bias, mask, scale, dropout_p), None
    return explicit_attention(q, k, v, bias, mask, scale, dropout_p, plan.upcast, plan.contiguous)

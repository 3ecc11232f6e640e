"""Every branch of the attention plan computes attention: numerics against a float64
reference, with the CPU's capability faked, on layers given the planned core. Which path is
fastest is benchmarks' business (benchmarks/attention_dispatch.py), not these tests'."""

from __future__ import annotations

import pytest
import torch

from vision_tfm.accel import cpu as dispatch
from vision_tfm.accel import use_planned_attention
from vision_tfm.accel.cpu import AttentionPlan, attention_plan
from vision_tfm.layers import Attention


def planned(dim: int, heads: int) -> Attention:
    """An attention layer with the planned core, as training and inference give it."""
    attn = Attention(dim, heads)
    assert use_planned_attention(attn) == 1
    return attn


AVX512_AMX = ("AVX512", True, True)  # native bf16 with AMX tiles (Intel Xeon)
AVX512_BF16 = ("AVX512", True, False)  # native bf16, dot-product units only (AMD Zen 4/5)
AVX2 = ("AVX2", False, False)  # bf16 emulated in fp32 units


def reference(attn: Attention, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The layer written out in float64: softmax(q kᵀ / sqrt(d) + bias) v, then proj."""
    *lead, n, c = x.shape
    h, d = attn.num_heads, attn.head_dim
    qkv = x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    q, k, v = qkv.unflatten(-1, (3, h, d)).movedim(-3, 0).transpose(-3, -2)  # (..., h, N, d)
    logits = q @ k.transpose(-2, -1) * d**-0.5
    if bias is not None:
        logits = logits + bias.double()
    out = (logits.softmax(-1) @ v).transpose(-3, -2).reshape(*lead, n, c)
    return out @ attn.proj.weight.double().T + attn.proj.bias.double()


# (cpu, dtype, training, windows, the plan the dispatch makes of it)
F32, B16 = torch.float32, torch.bfloat16
SDPA, EXPLICIT = AttentionPlan(True), AttentionPlan(False)
CONTIG, UPCAST = AttentionPlan(False, contiguous=True), AttentionPlan(False, upcast=True)
BRANCHES = {
    "fp32-infer-sdpa-folded": (AVX512_AMX, F32, False, True, SDPA),
    "fp32-windows-train-explicit": (AVX512_AMX, F32, True, True, CONTIG),
    "bf16-native-infer-sdpa": (AVX512_AMX, B16, False, False, SDPA),
    "bf16-native-windows-infer-sdpa": (AVX512_AMX, B16, False, True, SDPA),
    "bf16-native-train-explicit": (AVX512_AMX, B16, True, False, CONTIG),
    "bf16-dot-only-infer-explicit": (AVX512_BF16, B16, False, False, EXPLICIT),
    "bf16-dot-only-windows-infer-explicit-upcast": (AVX512_BF16, B16, False, True, UPCAST),
    "bf16-dot-only-train-explicit": (AVX512_BF16, B16, True, False, CONTIG),
    "fp32-dot-only-infer-sdpa": (AVX512_BF16, F32, False, False, SDPA),
    "bf16-emulated-infer-sdpa": (AVX2, B16, False, True, SDPA),
    "bf16-emulated-train-sdpa": (AVX2, B16, True, False, SDPA),
    "bf16-emulated-windows-train-sdpa": (AVX2, B16, True, True, SDPA),
}


@pytest.mark.parametrize("branch", list(BRANCHES))
def test_each_dispatch_branch_matches_float64_attention(fake_cpu, branch):
    cpu, dtype, training, windows, plan = BRANCHES[branch]
    fake_cpu(*cpu)
    torch.manual_seed(0)
    attn = planned(32, 4)
    # Swin-like windows (B, nW, N, C) with a per-window bias, or ViT-like tokens (B, N, C)
    x = torch.randn(2, 3, 16, 32) if windows else torch.randn(2, 16, 32)
    bias = torch.randn(3, 4, 16, 16) if windows else None
    x.requires_grad_(training)
    low = dtype != torch.float32
    with torch.set_grad_enabled(training), torch.autocast("cpu", torch.bfloat16, enabled=low):
        q = attn.qkv(x).unflatten(-1, (12, 8)).transpose(-3, -2)
        assert attention_plan(q, bias is not None, need_weights=False) == plan
        out = attn(x, bias=bias)
    assert out.dtype == dtype
    ref = reference(attn, x.detach(), bias)
    tol = 3e-2 if low else 1e-5
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    if training:
        (grad,) = torch.autograd.grad(out.float().square().sum(), x)
        x64 = x.detach().double().requires_grad_()
        (ref_grad,) = torch.autograd.grad(reference(attn, x64, bias).square().sum(), x64)
        scale = ref_grad.abs().max().item()
        torch.testing.assert_close(grad.double(), ref_grad, atol=tol * scale, rtol=tol * 2)


def test_need_weights_takes_the_explicit_path_on_every_cpu(fake_cpu):
    torch.manual_seed(0)
    attn = planned(32, 4).eval()
    x, bias = torch.randn(2, 3, 16, 32), torch.randn(3, 4, 16, 16)
    for cpu in (AVX512_AMX, AVX512_BF16, AVX2):
        fake_cpu(*cpu)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out, weights = attn(x, bias=bias, return_attn=True)
        torch.testing.assert_close(out.double(), reference(attn, x, bias), atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(
            weights.float().sum(-1), torch.ones(2, 3, 4, 16), atol=1e-2, rtol=0
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_takes_sdpa_and_matches_float64():
    torch.manual_seed(0)
    attn = planned(32, 4).cuda()
    x = torch.randn(2, 3, 16, 32, device="cuda", requires_grad=True)
    bias = torch.randn(3, 4, 16, 16, device="cuda")
    q = attn.qkv(x).unflatten(-1, (12, 8)).transpose(-3, -2)
    assert attention_plan(q, True, need_weights=False).fused
    torch.testing.assert_close(
        attn(x, bias=bias).double(), reference(attn, x, bias), atol=1e-4, rtol=1e-4
    )


def test_capability_is_a_constant_under_compile():
    """The branch is decided while tracing, not traced: reading the CPU breaks no graph."""

    def pick(q: torch.Tensor) -> torch.Tensor:
        return q * 2 if attention_plan(q, True, need_weights=False).fused else q * 3

    compiled = torch.compile(pick, fullgraph=True, backend="eager")
    for dtype in (torch.float32, torch.bfloat16):  # bf16 reads native bf16 and AMX too
        q = torch.randn(2, 3, 4, 16, 8, dtype=dtype)
        torch.testing.assert_close(compiled(q), pick(q))
    assert dispatch.cpu_capability() == torch.backends.cpu.get_cpu_capability()
    assert dispatch.cpu_amx() == torch.cpu._is_amx_tile_supported()


def test_emulated_bf16_warns_once_with_the_measured_factor(fake_cpu, caplog):
    fake_cpu("AVX512", True)
    assert dispatch.warn_if_bf16_emulated("use fp32") is None and not caplog.records
    fake_cpu("AVX2", False)
    note = dispatch.warn_if_bf16_emulated("use fp32")
    (record,) = caplog.records
    factor = dispatch.bf16_matmul_slowdown()
    assert record.levelname == "WARNING" and "\n" not in record.getMessage()
    assert "AVX2" in note and f"{factor:.1f}x" in note and record.getMessage().endswith("use fp32")
    assert factor > 0


def test_optimize_for_inference_in_bf16_warns_where_bf16_is_emulated(fake_cpu, caplog):
    import vision_tfm as vt

    fake_cpu("AVX2", False)
    vt.optimize_for_inference(Attention(8, 2), dtype="fp32")
    assert not caplog.records
    vt.optimize_for_inference(Attention(8, 2), dtype="bf16")
    assert len(caplog.records) == 1 and "emulated" in caplog.text and "dtype" in caplog.text

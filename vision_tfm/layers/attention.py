"""Multi-head self-attention shared by ViT, Swin and the grasp hybrid.

One fused ``qkv`` projection feeds either ``F.scaled_dot_product_attention`` (default: the
fastest kernel PyTorch has for the device) or an explicit softmax path. The explicit path is
there to return attention weights (rollout maps), to export where the fused op does not, and
for the cases where it is measured faster (bf16 on CPU, Swin windows under autograd); both
take the same additive bias and boolean mask, so they are interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .norm import LayerNorm
from .pos_embed import apply_rope

__all__ = ["Attention", "fused_attn", "merge_bias_and_mask", "set_fused_attn"]


def merge_bias_and_mask(
    bias: torch.Tensor | None, mask: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """Fold a boolean keep-mask into one additive float bias (``-inf`` where masked)."""
    if mask is None:
        return None if bias is None else bias.to(dtype)
    if mask.dtype != torch.bool:
        raise ValueError(f"attention mask must be bool (True = attend), got {mask.dtype}")
    neg = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )
    return neg if bias is None else bias.to(dtype) + neg


class Attention(nn.Module):
    """Multi-head attention over the second-to-last dim of ``(..., N, C)`` tokens.

    Leading dims are kept, so Swin can pass ``(B, nW, N, C)`` windows with a ``(nW, nH, N, N)``
    bias and let broadcasting do the rest instead of materialising a per-sample bias.

    Args:
        dim: Token width C.
        num_heads: Heads; ``dim`` must divide evenly.
        qkv_bias: Bias on the fused qkv projection.
        qk_norm: Normalise q and k per head (stabilises large-lr training).
        attn_drop: Dropout on attention weights.
        proj_drop: Dropout after the output projection.
        norm_layer: Norm used for q/k normalisation.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] = LayerNorm,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.fused = True
        self.store_attn = False  # keep the last softmax weights in `last_attn` (rollout maps)
        self.last_attn: torch.Tensor | None = None
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        num_prefix_tokens: int = 0,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend.

        Args:
            x: Tokens ``(..., N, C)``.
            bias: Additive logits bias broadcastable to ``(..., heads, N, N)``.
            mask: Boolean, True where attention is allowed; same broadcasting as ``bias``.
            rope: ``(sin, cos)`` of shape ``(N - num_prefix_tokens, head_dim)``.
            num_prefix_tokens: Leading tokens (class/register) that RoPE leaves alone.
            return_attn: Also return the softmax weights; forces the explicit path.
        """
        *lead, N, C = x.shape
        # One transpose and one split (3 views): exports as 3 ONNX nodes instead of 8.
        qkv = self.qkv(x).unflatten(-1, (3 * self.num_heads, self.head_dim))  # (..., N, 3h, d)
        q, k, v = qkv.transpose(-3, -2).chunk(3, dim=-3)  # 3 x (..., h, N, d)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q = apply_rope(q, rope, num_prefix_tokens)
            k = apply_rope(k, rope, num_prefix_tokens)
        fused = self._fused_wins(q, return_attn)
        # bf16/fp16 inference on the explicit path adds the bias in fp32 (the logits promote)
        # and takes an fp32 softmax: on CPU 1.5x faster than the bf16 kernel on Swin windows.
        # Under autograd the fp32 backward costs more than that saves (10-13% slower steps).
        up = (
            bias is not None
            and not fused
            and not q.requires_grad
            and q.dtype in (torch.bfloat16, torch.float16)
        )
        attn_bias = merge_bias_and_mask(bias, mask, torch.float32 if up else q.dtype)

        if fused:
            drop = self.attn_drop.p if self.training else 0.0
            folded = q.dim() > 4
            if folded:
                # CPU SDPA kernels take (B, h, N, d); more leading dims fall back to the slow
                # math path (2x slower on Swin windows). Fold them, expanding the bias to match.
                lead_shape = q.shape[:-3]
                if attn_bias is not None:
                    full = (*q.shape[:-1], k.shape[-2])  # (..., h, N, N)
                    attn_bias = attn_bias.expand(full).reshape(-1, *full[-3:])
                q, k, v = q.flatten(0, -4), k.flatten(0, -4), v.flatten(0, -4)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=drop)
            out = out.unflatten(0, lead_shape) if folded else out  # (..., h, N, d)
            attn = None
        else:
            if q.requires_grad and not torch.compiler.is_compiling():
                # Eager training: q, k, v as contiguous blocks rather than strided views of qkv
                # made Swin-T fp32 training steps ~5% faster (bf16 ~1%); in inference the strided
                # views measured 4-7% faster, and graphs (compile, export) need neither.
                q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            logits = (q * self.scale) @ k.transpose(-2, -1)  # (..., h, N, N)
            if attn_bias is not None:
                logits = logits + attn_bias
            attn = logits.softmax(dim=-1).to(v.dtype)
            if mask is not None:  # a query with no allowed key gets zeros, as in SDPA, not NaN
                attn = attn.masked_fill(~mask.any(-1, keepdim=True), 0.0)
            out = self.attn_drop(attn) @ v  # (..., h, N, d)
            if self.store_attn:
                self.last_attn = attn.detach()

        out = out.transpose(-3, -2).reshape(*lead, N, C)  # (..., N, C)
        out = self.proj_drop(self.proj(out))
        return (out, attn) if return_attn else out

    def _fused_wins(self, q: torch.Tensor, return_attn: bool) -> bool:
        """SDPA unless the weights are wanted or the explicit path measured faster, which is:

        - windows (extra leading dims) under autograd: SDPA's backward would run on the folded,
          materialised bias through its math path; broadcasting the bias explicitly makes a
          Swin-T training step 1.1-1.3x faster (without autograd the folded SDPA is as fast);
        - bf16 on CPU: SDPA's kernels lose to two bf16 matmuls around a softmax (ViT-S layer at
          batch 16: 1.7x faster forward, 2.3x forward+backward; Swin-T windows 1.7x / 9x).
        """
        if not self.fused or return_attn or self.store_attn:
            return False
        windowed_grad = q.dim() > 4 and q.requires_grad
        cpu_bf16 = q.dtype == torch.bfloat16 and q.device.type == "cpu"
        return not (windowed_grad or cpu_bf16)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, fused={self.fused}"


def set_fused_attn(module: nn.Module, enabled: bool) -> nn.Module:
    """Switch every attention layer in ``module`` between SDPA and the explicit path."""
    for m in module.modules():
        if isinstance(m, Attention):
            m.fused = enabled
    return module


@contextmanager
def fused_attn(module: nn.Module, enabled: bool) -> Iterator[nn.Module]:
    """Temporarily switch attention paths (e.g. explicit for export or rollout), then restore."""
    prev = [(m, m.fused) for m in module.modules() if isinstance(m, Attention)]
    set_fused_attn(module, enabled)
    try:
        yield module
    finally:
        for m, flag in prev:
            m.fused = flag

"""Multi-head self-attention shared by ViT, Swin and the grasp hybrid.

One fused ``qkv`` projection feeds ``softmax(q kᵀ · scale + bias) v``, computed one of two
ways: ``F.scaled_dot_product_attention`` (SDPA, the default) or the explicit path, two
matmuls around a softmax, which also returns the weights (rollout maps, ``return_attn``,
``store_attn``) and exports where the fused op does not. Both take the same additive bias and
boolean mask, so they are interchangeable; ``Attention.fused`` (:func:`set_fused_attn`,
:func:`fused_attn`) picks one. Kernel choices for a device (which path runs faster where)
are not made here: :mod:`vision_tfm.accel` swaps in an ``Attention`` that makes them.

``attn_type="linear"`` swaps the softmax for a feature map (:mod:`.linear_attention`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from .linear_attention import FeatureMap, linear_attention
from .norm import LayerNorm
from .pos_embed import Rope, apply_rope

ATTN_TYPES = ("softmax", "linear")
LOW_PRECISION = (torch.bfloat16, torch.float16)


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

    SDPA's fused kernels take ``(B, h, N, d)`` only; with more leading dims (Swin windows) it
    falls back to its slow math path. The bias (and mask, merged into it) is expanded to the
    folded shape.
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


def softmax_in_fp32(q: torch.Tensor, has_bias: bool) -> bool:
    """Whether the explicit path adds the bias and takes the softmax in fp32: in bf16 / fp16
    inference with a bias, so that the weights come back unrounded and a bias plus mask (Swin's
    shifted windows) stays exact. Not under autograd, where an fp32 backward costs more."""
    return has_bias and q.dtype in LOW_PRECISION and not q.requires_grad


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    upcast: bool = False,
    logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ · scale + bias) v`` written out on ``(..., h, N, d)`` heads, and the
    weights (undropped). ``mask`` (bool, True = attend) is merged into the bias; a query with
    no allowed key gets zeros, as in SDPA, not NaN. ``upcast``: add the bias and take the
    softmax in fp32 (:func:`softmax_in_fp32`). ``logits``: ``q kᵀ · scale`` where the caller
    computed it with a kernel of its own."""
    attn_bias = merge_bias_and_mask(bias, mask, torch.float32 if upcast else q.dtype)
    if logits is None:
        logits = (q * scale) @ k.transpose(-2, -1)  # (..., h, N, M)
    if attn_bias is not None:
        logits = logits + attn_bias  # promotes to fp32 when upcast
    empty = None if mask is None else ~mask.any(-1, keepdim=True)  # rows with no allowed key
    if empty is not None:  # a finite softmax there, else its backward turns NaN
        logits = logits.masked_fill(empty, 0.0)
    attn = logits.softmax(dim=-1).to(v.dtype)
    if empty is not None:
        attn = attn.masked_fill(empty, 0.0)
    dropped = F.dropout(attn, dropout_p) if dropout_p else attn
    return dropped @ v, attn  # (..., h, N, d)


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
        attn_type: ``softmax`` or ``linear`` (a feature map instead of the softmax; cost
            linear in the token count; no additive bias, key-padding masks only, and no
            dropout on weights it never forms).
        feature_map: For ``linear``: ``elu1``, ``relu`` or ``favor`` (see :class:`FeatureMap`).
        num_features: ``favor`` random features per head; 0 = ``d ln d``.
        favor_seed: Seed of the ``favor`` projection; None draws from torch's global generator.
        eps: Added to the linear attention's denominator.
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
        attn_type: str = "softmax",
        feature_map: str = "elu1",
        num_features: int = 0,
        favor_seed: int | None = None,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"attention dim {dim} is not divisible by num_heads {num_heads}")
        if attn_type not in ATTN_TYPES:
            raise ConfigError(f"attn_type must be one of {ATTN_TYPES}, got {attn_type!r}")
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
        self.attn_type = attn_type
        self.eps = eps
        self.feature_map = (
            FeatureMap(feature_map, self.head_dim, num_features, favor_seed)
            if attn_type == "linear"
            else None
        )

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        rope: Rope | None = None,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend.

        Args:
            x: Tokens ``(..., N, C)``.
            bias: Additive logits bias broadcastable to ``(..., heads, N, N)``.
            mask: Boolean, True where attention is allowed; same broadcasting as ``bias``.
            rope: Rotary tables of the token grid (prefix tokens are not rotated).
            return_attn: Also return the attention weights; forces the explicit path (linear
                attention then forms its ``(N, N)`` weights too, for rollout maps).
        """
        # One transpose and one split (3 views): exports as 3 ONNX nodes instead of 8.
        qkv = self.qkv(x).unflatten(-1, (3 * self.num_heads, self.head_dim))  # (..., N, 3h, d)
        q, k, v = qkv.transpose(-3, -2).chunk(3, dim=-3)  # 3 x (..., h, N, d)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        out, attn = attention_core(self, q, k, v, bias, mask, return_attn or self.store_attn)
        if self.store_attn and attn is not None:
            self.last_attn = attn.detach()
        out = out.transpose(-3, -2).flatten(-2)  # (..., N, C)
        out = self.proj_drop(self.proj(out))
        return (out, attn) if return_attn else out

    def core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention on ``(..., h, N, d)`` heads, and its weights where it formed them.

        Softmax attention runs SDPA, or the explicit path when the weights are wanted or
        ``fused`` is off; linear attention runs :meth:`_linear`.
        """
        if self.feature_map is not None:
            return self._linear(q, k, v, bias, mask, need_weights)
        dropout_p = self.attn_drop.p if self.training else 0.0
        if self.fused and not need_weights:
            return sdpa_attention(q, k, v, bias, mask, self.scale, dropout_p), None
        upcast = softmax_in_fp32(q, bias is not None)
        return explicit_attention(q, k, v, bias, mask, self.scale, dropout_p, upcast)

    def _linear(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
        mask: torch.Tensor | None,
        want_attn: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Linear attention ``(..., h, N, d)``; its implied weights only when asked for.

        In bf16/fp16 the features, the key-value sums and the denominator are computed in
        fp32: sums over thousands of tokens overflow fp16 and lose digits in bf16.
        """
        if bias is not None:
            raise InputError("linear attention takes no additive bias (it never forms logits)")
        key_mask = None
        if mask is not None:
            if mask.shape[-2] != 1:
                raise InputError(
                    f"linear attention takes key-padding masks (..., 1, N), got {tuple(mask.shape)}"
                )
            key_mask = mask.squeeze(-2)  # (..., h or 1, N)
        dtype = v.dtype
        low = dtype in LOW_PRECISION
        with torch.autocast(q.device.type, enabled=False) if low else nullcontext():
            if low:
                q, k, v = q.float(), k.float(), v.float()
            phi_q = self.feature_map(q, query=True)  # (..., h, N, m)
            phi_k = self.feature_map(k, query=False, key_mask=key_mask)  # (..., h, N, m)
            out = linear_attention(phi_q, phi_k, v, key_mask, eps=self.eps)  # (..., h, N, d)
            attn = None
            if want_attn:
                if key_mask is not None:
                    phi_k = phi_k.masked_fill(~key_mask.unsqueeze(-1), 0.0)
                scores = phi_q @ phi_k.transpose(-2, -1)  # (..., h, N, N)
                attn = (scores / (scores.sum(-1, keepdim=True) + self.eps)).to(dtype)
        return out.to(dtype), attn

    def extra_repr(self) -> str:
        if self.feature_map is not None:
            return f"heads={self.num_heads}, head_dim={self.head_dim}, attn_type=linear"
        return f"heads={self.num_heads}, head_dim={self.head_dim}, fused={self.fused}"


def attention_core(
    attn: Attention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``attn.core(...)``, as an fx leaf function (``torch.fx.wrap``): the core reads the
    rank of ``q`` (leading dims to fold) and the subclass ``vision_tfm.accel`` swaps in reads
    its dtype, device and autograd state, which ``torch.fx.symbolic_trace`` does not know; a
    traced graph calls it, and it picks its path at run time."""
    return attn.core(q, k, v, bias, mask, need_weights)


torch.fx.wrap("attention_core")


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

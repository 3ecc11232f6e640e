"""Multi-head self-attention shared by ViT, Swin and the grasp hybrid.

One fused ``qkv`` projection feeds ``softmax(q kᵀ · scale + bias) v``, computed one of two
ways: ``F.scaled_dot_product_attention`` (SDPA, the default) or the explicit path, two
matmuls around a softmax, which also returns the weights (rollout maps, ``return_attn``,
``store_attn``) and exports where the fused op does not. Both take the same additive bias and
boolean mask, so they are interchangeable; ``Attention.fused`` (:func:`set_fused_attn`,
:func:`fused_attn`) picks one. Kernel choices for a device (which path runs faster where)
are not made here: :mod:`vision_tfm.accel` swaps in an ``Attention`` that makes them.

``attn_type="linear"`` swaps the softmax for a feature map φ (Katharopoulos et al. 2020,
*Transformers are RNNs*; Choromanski et al. 2020, *Performers*): ``y_i = Σ_j φ(q_i)·φ(k_j) v_j /
Σ_j φ(q_i)·φ(k_j)``, computed as ``φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ)`` at a cost linear in the token
count. :func:`fast_weight_attention` computes the same thing as a fast-weight memory
(Schlag et al. 2021): ``W = Σ_j v_j φ(k_j)ᵀ`` and ``z = Σ_j φ(k_j)`` built explicitly, then read
by each query; it is the test oracle, and with ``causal=True`` it updates ``W`` one token at a
time, the RNN form. RoPE, when given, rotates q and k before φ: with ``favor`` that estimates
RoPE softmax attention; with ``elu1``/``relu`` the score is then no longer a function of the
relative offset alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, InputError
from .norm import LayerNorm
from .pos_embed import Rope, apply_rope

ATTN_TYPES = ("softmax", "linear")
FEATURE_MAPS = ("elu1", "relu", "favor")
LOW_PRECISION = (torch.bfloat16, torch.float16)


def orthogonal_gaussian(
    num_rows: int, dim: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Performer's orthogonal random features, ``(num_rows, dim)``.

    Rows come in blocks of ``dim`` exactly orthogonal directions (Haar-random), each rescaled to
    the length of an independent Gaussian vector: every row is still ``N(0, I)``, but rows in a
    block do not overlap, which lowers the kernel estimate's variance (Choromanski et al. 2020).
    """
    g = torch.randn(math.ceil(num_rows / dim), dim, dim, generator=generator)
    q, r = torch.linalg.qr(g)  # batched: one call for every block
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar, not QR-biased
    rows = q.transpose(-2, -1).reshape(-1, dim)[:num_rows]  # each block's columns as rows
    return rows * torch.randn(num_rows, dim, generator=generator).norm(dim=1, keepdim=True)


def default_favor_features(head_dim: int) -> int:
    """``d ln d`` random features per head, the Performer paper's choice."""
    return max(1, int(head_dim * math.log(head_dim)))


class FeatureMap(nn.Module):
    """The feature map φ of linear attention, applied per head to ``(..., N, head_dim)``.

    - ``elu1``: ``elu(x) + 1`` (Katharopoulos et al. 2020), positive, same width as the head;
    - ``relu``: ``max(x, 0)`` (EfficientViT's choice), same width;
    - ``favor``: Performer FAVOR+ positive random features,
      ``exp(w_r·x' - |x'|²/2) / sqrt(m)`` with ``x' = x / d**0.25``, so that
      ``E[φ(q)·φ(k)] = exp(q·k / sqrt(d))``, the softmax kernel at the usual scale. The
      projection ``w`` is a buffer (checkpoints and exports carry it); :meth:`redraw` draws a
      new one, from ``seed`` when given, else from torch's global generator.

    ``favor`` subtracts a stabiliser from its exponents: per query its own maximum, for keys one
    maximum over all allowed keys of a sequence (per head). Each is a common factor of a ratio's
    numerator and denominator, so it cancels, and it keeps ``exp`` at or below 1.
    """

    def __init__(
        self,
        kind: str,
        head_dim: int,
        num_features: int = 0,
        seed: int | None = None,
        orthogonal: bool = True,
    ) -> None:
        super().__init__()
        if kind not in FEATURE_MAPS:
            raise ConfigError(f"feature map must be one of {FEATURE_MAPS}, got {kind!r}")
        self.kind = kind
        self.head_dim = head_dim
        self.orthogonal = orthogonal
        self.num_features = head_dim
        if kind == "favor":
            self.num_features = num_features or default_favor_features(head_dim)
            self.register_buffer("proj", torch.empty(self.num_features, head_dim))
            self.redraw(seed)

    @torch.no_grad()
    def redraw(self, seed: int | None = None) -> None:
        """Draw a new FAVOR+ projection in place (Performer redraws it now and then in training)."""
        g = None if seed is None else torch.Generator().manual_seed(seed)
        m, d = self.proj.shape
        w = orthogonal_gaussian(m, d, g) if self.orthogonal else torch.randn(m, d, generator=g)
        self.proj.copy_(w)

    def favor_exponents(self, x: torch.Tensor) -> torch.Tensor:
        """Unstabilised exponents ``w_r·x' - |x'|²/2``, ``(..., N, m)``: ``Σ_r exp(a_r + b_r) / m``
        over a query's and a key's is the unbiased estimate of their softmax kernel."""
        x = x * self.head_dim**-0.25
        return F.linear(x, self.proj.to(x.dtype)) - 0.5 * (x * x).sum(-1, keepdim=True)

    def forward(
        self, x: torch.Tensor, query: bool, key_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``(..., N, head_dim)`` -> ``(..., N, num_features)``, all entries >= 0.

        Args:
            x: Queries or keys.
            query: Queries get a per-token stabiliser, keys one per sequence (favor only).
            key_mask: Bool ``(..., N)``, True = attend; masked keys do not set the stabiliser.
        """
        if self.kind == "elu1":
            return F.elu(x) + 1
        if self.kind == "relu":
            return F.relu(x)
        logits = self.favor_exponents(x)  # (..., N, m)
        if query:
            stab = logits.amax(-1, keepdim=True)  # (..., N, 1)
        else:
            allowed = logits
            if key_mask is not None:
                allowed = logits.masked_fill(~key_mask[..., None], float("-inf"))
            # clamped: a sequence with every key masked must not give exp(+inf)
            stab = allowed.amax((-2, -1), keepdim=True).clamp_min(-1e4)  # (..., 1, 1)
        return torch.exp(logits - stab) * self.num_features**-0.5

    def extra_repr(self) -> str:
        return f"{self.kind}, num_features={self.num_features}"


def linear_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Kernelised attention from features, in parallel: ``φ(q) (φ(k)ᵀ v) / (φ(q)·Σφ(k) + eps)``.

    Args:
        phi_q: Query features ``(..., N, m)``.
        phi_k: Key features ``(..., M, m)``.
        v: Values ``(..., M, d)``.
        key_mask: Bool ``(..., M)``, True = attend (padding masks).
        causal: Query i sees keys <= i; computed as a masked ``(N, N)`` score matrix, the
            parallel counterpart of the recurrent form in :func:`fast_weight_attention`.
        eps: Keeps a query that sees no key (or whose features vanish, as relu's can) at 0.

    Returns:
        ``(..., N, d)``.
    """
    if key_mask is not None:  # masked_fill, not a product: a masked key's feature may be inf
        phi_k = phi_k.masked_fill(~key_mask.unsqueeze(-1), 0.0)
    if causal:
        scores = (phi_q @ phi_k.transpose(-2, -1)).tril()  # (..., N, M)
        return (scores @ v) / (scores.sum(-1, keepdim=True) + eps)
    kv = phi_k.transpose(-2, -1) @ v  # (..., m, d): the fast weights, transposed
    z = phi_k.sum(-2).unsqueeze(-1)  # (..., m, 1)
    return (phi_q @ kv) / (phi_q @ z + eps)  # (..., N, d) / (..., N, 1)


def fast_weight_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: FeatureMap | str,
    key_mask: torch.Tensor | None = None,
    causal: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Linear attention as a fast-weight memory: write ``W = Σ_j v_j φ(k_j)ᵀ``, ``z = Σ_j φ(k_j)``,
    read ``y_i = W φ(q_i) / (z·φ(q_i) + eps)`` (Schlag et al. 2021).

    The readable oracle for :func:`linear_attention`; not the fast path. With ``causal=True``
    the memory is updated one token at a time and read after each write, the RNN form.

    Args:
        q, k, v: ``(..., N, d)`` per head.
        feature_map: A :class:`FeatureMap` or its name (``favor`` by name draws a projection).
        key_mask: Bool ``(..., N)``, True = attend.
        causal: Recurrent, token by token.
        eps: As in :func:`linear_attention`.
    """
    if isinstance(feature_map, str):
        feature_map = FeatureMap(feature_map, q.shape[-1]).to(q.device)
    phi_q = feature_map(q, query=True)  # (..., N, m)
    phi_k = feature_map(k, query=False, key_mask=key_mask)  # (..., N, m)
    if key_mask is not None:
        phi_k = phi_k.masked_fill(~key_mask.unsqueeze(-1), 0.0)
    if not causal:
        W = torch.einsum("...jd,...jm->...dm", v, phi_k)  # Σ_j v_j φ(k_j)ᵀ  (..., d, m)
        z = phi_k.sum(-2)  # (..., m)
        num = torch.einsum("...dm,...im->...id", W, phi_q)  # W φ(q_i)  (..., N, d)
        return num / ((phi_q * z.unsqueeze(-2)).sum(-1, keepdim=True) + eps)
    W = v.new_zeros((*v.shape[:-2], v.shape[-1], phi_k.shape[-1]))  # (..., d, m)
    z = phi_k.new_zeros((*phi_k.shape[:-2], phi_k.shape[-1]))  # (..., m)
    out = []
    for i in range(q.shape[-2]):
        W = W + v[..., i, :, None] * phi_k[..., i, None, :]  # write: outer product
        z = z + phi_k[..., i, :]
        read = (W @ phi_q[..., i, :, None]).squeeze(-1)  # (..., d)
        out.append(read / ((z * phi_q[..., i, :]).sum(-1, keepdim=True) + eps))
    return torch.stack(out, dim=-2)  # (..., N, d)


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

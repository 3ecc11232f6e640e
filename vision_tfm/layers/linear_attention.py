"""Linear attention: kernel feature maps, the parallel form, and the fast-weight oracle.

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

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

FEATURE_MAPS = ("elu1", "relu", "favor")


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

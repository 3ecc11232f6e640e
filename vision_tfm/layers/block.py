"""The Transformer block, with norm placement as a parameter.

``pre`` (default, timm/GPT-2):   x = x + f(norm(x))
``post`` (Vaswani et al. 2017):  x = norm(x + f(x))
``residual`` (ResiDual, Xie et al. 2023): a post-norm stream plus a second stream that sums
the raw sublayer outputs; the model adds ``norm(dual)`` at the end (see ``forward_dual``).
Subclasses change only *where* attention looks by overriding :meth:`Block.attend`
(Swin attends within shifted windows), so norm placement and residual logic live here once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import Attention
from .drop import DropPath, LayerScale
from .mlp import Mlp
from .norm import LayerNorm

__all__ = ["NORM_PLACEMENTS", "Block", "block_stack", "checkpointed", "run_blocks"]

NORM_PLACEMENTS = ("pre", "post", "residual")


class Block(nn.Module):
    """Attention + feed-forward sublayers with residuals (key names match timm).

    Args:
        dim: Token width.
        num_heads: Attention heads.
        mlp_ratio: Feed-forward hidden width / dim.
        qkv_bias: Bias on qkv.
        qk_norm: Per-head q/k normalisation.
        proj_drop: Dropout after attention and MLP projections.
        attn_drop: Dropout on attention weights.
        drop_path: Stochastic depth probability of both residual branches.
        init_values: LayerScale init; None disables LayerScale.
        norm_layer: Norm class, called as ``norm_layer(dim)``.
        act_layer: MLP activation.
        mlp_layer: Feed-forward class (``Mlp`` or ``SwiGLU``).
        norm_place: ``pre``, ``post`` or ``residual``.
        attn_layer: Attention class (Swin passes its window attention).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float | None = None,
        norm_layer: type[nn.Module] = LayerNorm,
        act_layer: type[nn.Module] = nn.GELU,
        mlp_layer: type[nn.Module] = Mlp,
        norm_place: str = "pre",
        attn_layer: Callable[..., Attention] = Attention,
    ) -> None:
        super().__init__()
        if norm_place not in NORM_PLACEMENTS:
            raise ValueError(f"norm_place must be one of {NORM_PLACEMENTS}, got {norm_place!r}")
        self.norm_place = norm_place
        self.norm1 = norm_layer(dim)
        self.attn = attn_layer(
            dim,
            num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
        )
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = mlp_layer(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def attend(self, x: torch.Tensor, **attn_kw: Any) -> torch.Tensor:
        """Token mixing; subclasses override to reshape tokens (e.g. into windows)."""
        return self.attn(x, **attn_kw)

    def _branch1(self, x: torch.Tensor, **attn_kw: Any) -> torch.Tensor:
        return self.drop_path1(self.ls1(self.attend(x, **attn_kw)))

    def _branch2(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop_path2(self.ls2(self.mlp(x)))

    def forward(self, x: torch.Tensor, **attn_kw: Any) -> torch.Tensor:
        if self.norm_place == "pre":
            x = x + self._branch1(self.norm1(x), **attn_kw)
            return x + self._branch2(self.norm2(x))
        if self.norm_place == "post":
            x = self.norm1(x + self._branch1(x, **attn_kw))
            return self.norm2(x + self._branch2(x))
        raise RuntimeError("a 'residual' block carries two streams: call forward_dual")

    def forward_dual(
        self, x: torch.Tensor, dual: torch.Tensor, **attn_kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ResiDual step: post-norm stream ``x`` and un-normalised sum ``dual``."""
        a = self._branch1(x, **attn_kw)
        x, dual = self.norm1(x + a), dual + a
        m = self._branch2(x)
        return self.norm2(x + m), dual + m


def block_stack(depth: int, drop_path_rate: float = 0.0, **block_kw: Any) -> nn.ModuleList:
    """``depth`` Blocks with stochastic depth rising linearly from 0 to ``drop_path_rate``."""
    dpr = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # also under meta
    return nn.ModuleList(Block(drop_path=dpr[i], **block_kw) for i in range(depth))


def checkpointed(fn: Callable[..., Any], enabled: bool, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, recomputed in backward when ``enabled`` and grads are on.

    Non-reentrant checkpointing: gradients equal the plain run's, and keyword arguments
    (RoPE tables, biases) pass through. Skipped while fx traces (it would record its internals).
    """
    if enabled and torch.is_grad_enabled() and not torch.fx._symbolic_trace.is_fx_tracing():
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return fn(*args, **kwargs)


def run_blocks(
    blocks: nn.ModuleList,
    x: torch.Tensor,
    final_dual_norm: nn.Module | None = None,
    grad_ckpt: bool = False,
    **kw: Any,
) -> torch.Tensor:
    """Run a stack of blocks, handling the ResiDual second stream when the blocks use it.

    ``grad_ckpt`` recomputes each block's activations in backward instead of storing them.
    """
    if blocks and blocks[0].norm_place == "residual":
        dual = torch.zeros_like(x)
        for blk in blocks:
            x, dual = checkpointed(blk.forward_dual, grad_ckpt, x, dual, **kw)
        return x + (final_dual_norm(dual) if final_dual_norm is not None else dual)
    for blk in blocks:
        x = checkpointed(blk, grad_ckpt, x, **kw)
    return x

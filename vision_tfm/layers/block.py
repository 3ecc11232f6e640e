"""The Transformer block, with norm placement as a strategy chosen once.

Subclasses change only *where* attention looks by overriding :meth:`Block.attend` (Swin
attends within shifted windows); *where the norms sit* is a :class:`NormPlacement`, picked
by name in :class:`Block` and nowhere else, so models never branch on it:

``pre`` (default, timm/GPT-2):   x = x + f(norm(x))
``post`` (Vaswani et al. 2017):  x = norm(x + f(x))
``residual`` (ResiDual, Xie et al. 2023): a post-norm stream plus a second stream that sums
the raw sublayer outputs, merged as ``x + norm(dual)`` at the end of the stack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from timm.layers import DropPath, LayerScale
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import Attention
from .mlp import Mlp
from .norm import LayerNorm
from .pos_embed import Rope

Stream = Any
"""What passes from block to block: the tokens, or ResiDual's ``(tokens, dual)`` pair."""


class NormPlacement:
    """Where a block normalises, and how a stack of such blocks starts and ends.

    Stateless: every method is a staticmethod taking the block, so one placement serves
    every block class (ViT's, Swin's windowed one, the hybrid's).
    """

    norm_is_merge = False
    """True where the final norm is part of the stack's output rather than an optional norm
    after it, so pruning and ``normed=False`` must keep it."""

    @staticmethod
    def wants_final_norm(pooled_norm: bool) -> bool:
        """Whether the model needs a final norm module (``pooled_norm``: it norms after
        pooling instead, timm's ``fc_norm``)."""
        raise NotImplementedError

    @staticmethod
    def step(blk: Block, x: Stream, rope: Rope | None) -> Stream:
        raise NotImplementedError

    @staticmethod
    def begin(x: torch.Tensor) -> Stream:
        return x

    @staticmethod
    def tokens(stream: Stream) -> torch.Tensor:
        """The token stream after a block, for intermediate features."""
        return stream

    @staticmethod
    def end(stream: Stream, norm: nn.Module | None, normed: bool) -> torch.Tensor:
        """The stack's output; ``normed`` asks for the final norm where it is optional."""
        return norm(stream) if normed and norm is not None else stream


class PreNorm(NormPlacement):
    """``x = x + f(norm(x))``: stable at depth; the stack ends in the model's final norm."""

    @staticmethod
    def wants_final_norm(pooled_norm: bool) -> bool:
        return not pooled_norm

    @staticmethod
    def step(blk: Block, x: Stream, rope: Rope | None) -> Stream:
        x = x + blk.branch1(blk.norm1(x), rope)
        return x + blk.branch2(blk.norm2(x))


class PostNorm(NormPlacement):
    """``x = norm(x + f(x))``: every block ends in a norm, so the model needs no final one."""

    @staticmethod
    def wants_final_norm(pooled_norm: bool) -> bool:
        return False

    @staticmethod
    def step(blk: Block, x: Stream, rope: Rope | None) -> Stream:
        x = blk.norm1(x + blk.branch1(x, rope))
        return blk.norm2(x + blk.branch2(x))


class ResiDual(NormPlacement):
    """ResiDual (Xie et al. 2023): a post-norm stream ``x`` and a ``dual`` stream that adds
    every sublayer output, un-normalised, to the stack's input (pre-norm's residual, which
    keeps its gradient path); the output is ``x + norm(dual)``. Both streams start at the
    input, as in the paper's equations and the authors' code."""

    norm_is_merge = True

    @staticmethod
    def wants_final_norm(pooled_norm: bool) -> bool:
        return True  # the merge norm of the dual stream

    @staticmethod
    def begin(x: torch.Tensor) -> Stream:
        return x, x

    @staticmethod
    def step(blk: Block, stream: Stream, rope: Rope | None) -> Stream:
        x, dual = stream
        a = blk.branch1(x, rope)
        x, dual = blk.norm1(x + a), dual + a
        m = blk.branch2(x)
        return blk.norm2(x + m), dual + m

    @staticmethod
    def tokens(stream: Stream) -> torch.Tensor:
        return stream[0]

    @staticmethod
    def end(stream: Stream, norm: nn.Module | None, normed: bool) -> torch.Tensor:
        x, dual = stream  # the merge is the model's output, never optional
        return x + (norm(dual) if norm is not None else dual)


NORM_PLACEMENTS: dict[str, type[NormPlacement]] = {
    "pre": PreNorm,
    "post": PostNorm,
    "residual": ResiDual,
}


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
        norm_place: A key of :data:`NORM_PLACEMENTS` (validated by the model's config).
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
        self.place = NORM_PLACEMENTS[norm_place]
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

    def attend(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """Token mixing; subclasses override to reshape tokens (e.g. into windows)."""
        return self.attn(x, rope=rope)

    def branch1(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        """The attention sublayer's residual branch, before any norm placement."""
        return self.drop_path1(self.ls1(self.attend(x, rope)))

    def branch2(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward sublayer's residual branch."""
        return self.drop_path2(self.ls2(self.mlp(x)))

    def forward(self, x: Stream, rope: Rope | None = None) -> Stream:
        """One block on the stream (tokens ``(..., N, C)``; ResiDual: ``(tokens, dual)``)."""
        return self.place.step(self, x, rope)

    def extra_repr(self) -> str:
        return f"norm_place={self.place.__name__}"


def block_stack(depth: int, drop_path_rate: float = 0.0, **block_kw: Any) -> nn.ModuleList:
    """``depth`` Blocks with stochastic depth rising linearly from 0 to ``drop_path_rate``."""
    dpr = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # also under meta
    return nn.ModuleList(Block(drop_path=dpr[i], **block_kw) for i in range(depth))


def _fx_symbolic_tracing() -> bool:
    """Whether ``torch.fx.symbolic_trace`` is tracing. ``is_fx_tracing`` also answers yes
    under ``torch.export`` and warns that it does; torch versions before that split have only
    ``is_fx_tracing``, which then means symbolic tracing alone."""
    fx_trace = torch.fx._symbolic_trace
    return getattr(fx_trace, "is_fx_symbolic_tracing", fx_trace.is_fx_tracing)()


def checkpointed(fn: Callable[..., Any], enabled: bool, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, recomputed in backward when ``enabled`` and grads are on.

    Non-reentrant checkpointing: gradients equal the plain run's, and keyword arguments
    (RoPE tables, biases) pass through. Skipped while fx traces (it would record its internals).
    """
    if enabled and torch.is_grad_enabled() and not _fx_symbolic_tracing():
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return fn(*args, **kwargs)


def run_blocks(
    blocks: nn.ModuleList,
    x: torch.Tensor,
    norm: nn.Module | None = None,
    grad_ckpt: bool = False,
    rope: Rope | None = None,
    normed: bool | None = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run a stack of blocks and end it as their norm placement says.

    ``norm`` is the model's final norm (None for none); ``normed=False`` skips it where the
    placement allows (intermediate features); ``normed=None`` returns both ends, without
    and with it, from one pass (intermediates and the final features together).
    ``grad_ckpt`` recomputes each block's activations in backward instead of storing them.
    """
    place = blocks[0].place  # one placement per stack (block_stack builds them alike)
    stream = place.begin(x)
    for blk in blocks:
        stream = checkpointed(blk, grad_ckpt, stream, rope)
    if normed is None:
        return place.end(stream, norm, False), place.end(stream, norm, True)
    return place.end(stream, norm, normed)

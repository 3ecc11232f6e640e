"""Position encodings: learned absolute (resampled to any grid), fixed 2D sin-cos,
Swin's relative position bias (table + index), and 2D axial RoPE.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..errors import ConfigError, InputError
from .cache import TensorCache
from .sizes import symbolic

_TABLES = TensorCache(max_entries=32)
"""Fixed tables per (kind, grid, width, dtype, device): rebuilding one in float64 on the CPU
and copying it over every forward pass is what a model at a fixed size should not pay. A
dynamic-shape export (sizes symbolic) is tracing, so it builds them inside the graph."""


def resample_abs_pos_embed(
    pos_embed: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
) -> torch.Tensor:
    """Bicubically resample a learned ``(1, P + H*W, D)`` table to a new ``(H', W')`` grid.

    Prefix tokens (class/register) have no position on the grid and are passed through. An
    unchanged grid returns the input object itself, so running at the training size is exact.
    """
    n = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = round(n**0.5)
        if side * side != n:
            raise InputError(f"cannot infer a square grid from {n} position embeddings")
        old_size = (side, side)
    if old_size[0] * old_size[1] != n:
        raise InputError(f"grid {old_size} does not hold the {n} position embeddings given")
    if not symbolic(*new_size) and tuple(new_size) == tuple(old_size):
        return pos_embed  # (symbolic sizes always resample: exact at the same grid too)
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dtype = grid.dtype
    grid = grid.reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2).float()  # (1,D,H,W)
    grid = F.interpolate(grid, size=tuple(new_size), mode="bicubic", antialias=True)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_size[0] * new_size[1], -1).to(dtype)
    return torch.cat([prefix, grid], dim=1)


def _sincos_1d(pos: torch.Tensor, dim: int, temperature: float) -> torch.Tensor:
    omega = torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0)
    omega = 1.0 / temperature**omega  # (dim/2,)
    out = pos.reshape(-1, 1).double() * omega  # (N, dim/2)
    return torch.cat([out.sin(), out.cos()], dim=1)  # (N, dim)


def sincos_2d(
    grid_h: int,
    grid_w: int,
    dim: int,
    temperature: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Fixed 2D sin-cos position encoding, ``(grid_h * grid_w, dim)`` in row-major token order.

    Follows MAE (He et al. 2022, ``get_2d_sincos_pos_embed``): channels are
    ``[sin x, cos x, sin y, cos y]``, each block ``dim/4`` wide, with frequencies
    ``1 / temperature ** (i / (dim/4))`` for ``i = 0 .. dim/4 - 1``; x is the column index.
    (big_vision divides by ``dim/4 - 1`` and timm orders ``[sin y, sin x, cos y, cos x]``.)
    Computed in float64, then cast to ``dtype`` on ``device``; cached per all of these
    (bounded), so the result is shared and read-only.
    """
    if dim % 4:
        raise ConfigError(f"2D sin-cos encoding needs dim divisible by 4, got {dim}")

    def build() -> torch.Tensor:
        ys, xs = torch.meshgrid(
            torch.arange(grid_h, dtype=torch.float64),
            torch.arange(grid_w, dtype=torch.float64),
            indexing="ij",
        )
        emb = torch.cat(
            [_sincos_1d(xs, dim // 2, temperature), _sincos_1d(ys, dim // 2, temperature)], dim=1
        )
        return emb.to(device, dtype)

    key = (grid_h, grid_w, "sincos", dim, temperature, dtype, torch.device(device or "cpu"))
    return _TABLES.get(key, build)  # built inside the graph while tracing


def relative_position_index(window: tuple[int, int]) -> torch.Tensor:
    """Index into Swin's ``(2Wh-1)(2Ww-1)`` bias table for every (query, key) pair of a window.

    ``idx = (dh + Wh - 1) * (2Ww - 1) + (dw + Ww - 1)`` with ``(dh, dw)`` the query-minus-key
    offset; for a 7x7 window ``idx[0, 0] == 84`` and the range is 0..168.
    """
    wh, ww = window
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")).flatten(
        1
    )  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, N, N)
    return (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)  # (N, N)


def relative_position_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gather a ``((2Wh-1)(2Ww-1), heads)`` table into a ``(heads, N, N)`` logits bias."""
    n = index.shape[0]
    return table[index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)  # (heads, N, N)


def rope_2d(
    grid_h: int,
    grid_w: int,
    head_dim: int,
    theta: float = 100.0,
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Axial 2D rotary embedding: half the rotated pairs turn with x, half with y.

    Returns ``(sin, cos)``, each ``(grid_h * grid_w, head_dim)`` float32 on ``device``, to
    pair with :func:`apply_rope`. The rotation of pair ``(i, i + head_dim/2)`` is linear in
    position, so ``q . k`` depends only on the offset between the two tokens. Cached like
    :func:`sincos_2d`.
    """
    if head_dim % 4:
        raise ConfigError(f"2D RoPE needs head_dim divisible by 4, got {head_dim}")

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        quarter = head_dim // 4
        freqs = theta ** (-torch.arange(quarter, dtype=torch.float64) / quarter)  # (d/4,)
        ys, xs = torch.meshgrid(
            torch.arange(grid_h, dtype=torch.float64),
            torch.arange(grid_w, dtype=torch.float64),
            indexing="ij",
        )
        ang = torch.cat([xs.reshape(-1, 1) * freqs, ys.reshape(-1, 1) * freqs], dim=1)  # (N, d/2)
        ang = torch.cat([ang, ang], dim=1)  # (N, d)
        return ang.sin().to(device, torch.float32), ang.cos().to(device, torch.float32)

    key = (grid_h, grid_w, "rope", head_dim, theta, torch.device(device or "cpu"))
    return _TABLES.get(key, build)  # built inside the graph while tracing


class Rope(NamedTuple):
    """The rotary input of a token grid: :func:`rope_2d`'s tables plus the count of leading
    (class / register) tokens, which have no grid position and are not rotated."""

    sin: torch.Tensor  # (N_grid, head_dim)
    cos: torch.Tensor  # (N_grid, head_dim)
    num_prefix_tokens: int = 0


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate ``(..., N, head_dim)`` queries or keys; the prefix tokens stay put."""
    sin, cos, n = rope.sin.to(x.dtype), rope.cos.to(x.dtype), rope.num_prefix_tokens
    if n:
        prefix, x = x[..., :n, :], x[..., n:, :]
        return torch.cat([prefix, x * cos + _rotate_half(x) * sin], dim=-2)
    return x * cos + _rotate_half(x) * sin

"""Swin's windows: partition and reverse, the cyclic shift, and the shifted-window mask.

Unlike the official repo, the mask is built for the actual (padded) feature size at run time
and kept in a bounded cache, so any resolution works.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch
from torch import nn

from ..layers import TensorCache, pad_to_multiple, symbolic

MASK_VALUE = -100.0  # the official repo's value for cross-region logits


def window_partition(x: torch.Tensor, ws: int) -> torch.Tensor:
    """``(B, H, W, C)`` -> ``(B, nW, ws*ws, C)``; H and W must be multiples of ``ws``."""
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)  # (B, nh, ws, nw, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(B, (H // ws) * (W // ws), ws * ws, C)


def window_reverse(windows: torch.Tensor, ws: int, H: int, W: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`: ``(B, nW, ws*ws, C)`` -> ``(B, H, W, C)``."""
    B, _, _, C = windows.shape
    x = windows.view(B, H // ws, W // ws, ws, ws, C)  # (B, nh, nw, ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)


_MASKS = TensorCache(max_entries=32)
"""Shifted-window masks, shared by every block (of every model): a mask depends only on the
padded size, window, shift and device, so the blocks of a stage all read one copy."""
BIAS_SIZES_CACHED = 4
"""Input sizes whose frozen bias + mask each shifted block keeps (inference fast path)."""


def shifted_window_mask(
    H: int, W: int, ws: int, shift: tuple[int, int], device: torch.device | None = None
) -> torch.Tensor:
    """``(nW, 1, N, N)`` additive mask keeping attention inside each pre-shift region.

    Regions come from comparisons rather than slicing, so sizes and shifts may be symbolic
    (a dynamic-shape export builds the mask inside the graph). With shift 0 the only region
    boundary falls between windows, so the mask is all zero.
    """

    def regions(n: int, s: int) -> torch.Tensor:  # 0, 1, 2: before, inside, past the shift
        i = torch.arange(n, device=device)
        return (i >= n - ws).long() + (i >= n - s).long()

    ids = regions(H, shift[0])[:, None] * 3 + regions(W, shift[1])[None, :]  # (H, W)
    ids = window_partition(ids[None, :, :, None], ws)[0, :, :, 0]  # (nW, N)
    diff = ids[:, None, :] != ids[:, :, None]  # (nW, N, N)
    return torch.where(diff, MASK_VALUE, 0.0).unsqueeze(1)  # (nW, 1, N, N)


def gather_roll(
    x: torch.Tensor, shift: tuple[int, int], sign: int, size: tuple[int, int]
) -> torch.Tensor:
    """Roll ``(B, H, W, C)`` by ``sign * shift`` over H and W and keep the first ``size``.

    One index gather per axis does roll and crop at once; unlike ``torch.roll`` and slicing,
    it exports with symbolic sizes and shifts and leaves no strided view behind.
    """
    for dim, s, keep in ((1, shift[0], size[0]), (2, shift[1], size[1])):
        n = x.shape[dim]
        idx = torch.arange(keep, device=x.device) - sign * s  # out[i] = x[(i - sign*s) mod n]
        idx = torch.where(idx < 0, idx + n, torch.where(idx >= n, idx - n, idx))
        x = x.index_select(dim, idx)
    return x


def shift_windows(
    x: torch.Tensor, ws: int, shift_size: int
) -> tuple[torch.Tensor, tuple[int, int]]:
    """Pad ``(B, H, W, C)`` to whole ``ws`` windows, then roll it up/left by Swin's shift.

    Returns the map and the shift per side: a window that covers a whole (padded) side needs
    no shift there. Symbolic sizes (dynamic-H/W export) pad and roll unconditionally, the shift
    chosen inside the graph, so one graph serves every input size (``sym_ite`` on plain ints
    breaks ``torch.compile``).
    """
    symbolic_size = symbolic(x.shape[1], x.shape[2])
    x = pad_to_multiple(x, ws, channels_last=True)
    Hp, Wp = x.shape[1], x.shape[2]
    if symbolic_size:
        shift = tuple(torch.sym_ite(ws < n, shift_size, 0) for n in (Hp, Wp))
        return gather_roll(x, shift, -1, (Hp, Wp)), shift
    shift = (shift_size if ws < Hp else 0, shift_size if ws < Wp else 0)
    return (torch.roll(x, (-shift[0], -shift[1]), (1, 2)) if any(shift) else x), shift


def unshift_windows(x: torch.Tensor, shift: tuple[int, int], size: tuple[int, int]) -> torch.Tensor:
    """Undo :func:`shift_windows`: roll ``(B, Hp, Wp, C)`` back and crop it to ``size``."""
    if symbolic(*size):
        return gather_roll(x, shift, 1, size)
    x = torch.roll(x, shifts=shift, dims=(1, 2)) if any(shift) else x
    return x if (x.shape[1], x.shape[2]) == tuple(size) else x[:, : size[0], : size[1], :]


def add_shift_mask(
    bias: torch.Tensor, Hp: int, Wp: int, ws: int, shift: tuple[int, int]
) -> torch.Tensor:
    """``bias`` plus the shifted-window mask of a ``(Hp, Wp)`` map; the mask is shared per size."""
    if symbolic(Hp, Wp):
        mask = shifted_window_mask(Hp, Wp, ws, shift, bias.device)
    else:
        key = (Hp, Wp, ws, shift, bias.device)
        mask = _MASKS.get(key, lambda: shifted_window_mask(Hp, Wp, ws, shift, bias.device))
    return bias + mask.to(bias.dtype)


_CONSTANT_BIASES: dict[int, Callable[..., torch.Tensor]] = {}
"""Per shifted block, :func:`add_shift_mask` marked for Dynamo to run at trace time."""
_BLOCK_IDS = itertools.count()


def new_block_id(block: nn.Module) -> int:
    """A process-unique id for ``block``, and its :func:`add_shift_mask` for compiled graphs.

    The function runs at trace time and its result becomes a graph constant (frozen bias
    only). Built inside the graph instead, the mask's roll and comparisons land in the
    softmax kernel of every shifted block, and freezing does not fold them (they start from
    constructors, not from constants). One function per block, made eagerly: Dynamo names
    the constant after the function's code (two constants of one name break AOTAutograd),
    and it must find a plain function, not one made while it traces.
    """
    block_id = next(_BLOCK_IDS)

    def constant(*args: object) -> torch.Tensor:
        return add_shift_mask(*args)

    name = f"swin_shift_bias_{block_id}"
    constant.__name__ = constant.__qualname__ = name
    constant.__code__ = constant.__code__.replace(co_name=name)  # what Dynamo reads
    _CONSTANT_BIASES[block_id] = torch.compiler.assume_constant_result(constant)
    weakref.finalize(block, _CONSTANT_BIASES.pop, block_id, None)  # gone with the block
    return block_id


def window_bias(block: nn.Module, Hp: int, Wp: int, shift: tuple[int, int]) -> torch.Tensor:
    """A ``SwinBlock``'s relative position bias, plus the shifted-window mask when shifted.

    ``(heads, N, N)`` or ``(nW, heads, N, N)``. With a frozen bias (inference fast path) the
    sum is cached per input size, and under ``torch.compile`` it is a graph constant.
    """
    bias, ws = block.attn.rel_bias(), block.window_size
    if symbolic(Hp, Wp):
        return add_shift_mask(bias, Hp, Wp, ws, shift)
    if not any(shift):
        return bias
    if block.attn.frozen_bias is None:
        return add_shift_mask(bias, Hp, Wp, ws, shift)
    if torch.compiler.is_compiling():
        return _CONSTANT_BIASES[block.block_id](bias, Hp, Wp, ws, shift)
    key = (Hp, Wp, shift, bias.device, bias.dtype)
    return block._bias_cache.get(key, lambda: add_shift_mask(bias, Hp, Wp, ws, shift))

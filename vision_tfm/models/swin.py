"""Swin Transformer (Liu et al. 2021): shifted-window attention in a 4-stage hierarchy.

Read top to bottom: window helpers -> WindowAttention -> SwinBlock -> PatchMerging ->
SwinStage -> SwinTransformer -> registered sizes. State-dict keys match timm's
``SwinTransformer``; torchvision and official-repo checkpoints convert in ``convert.py``.

Unlike the official repo, the shifted-window mask is built for the actual (padded) feature
size at run time and cached per size, so any resolution works. Inputs whose feature map is
not a multiple of the window are zero-padded after ``norm1`` and the padding is cropped off
afterwards, as torchvision does; a window that covers the whole (padded) map is not shifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ..layers import (
    Attention,
    Block,
    LayerNorm,
    PatchEmbed,
    check_image,
    relative_position_bias,
    relative_position_index,
    symbolic,
)
from ._common import block_kwargs, check_config, init_weights, select_indices
from .registry import register_model

__all__ = ["SwinConfig", "SwinTransformer", "window_partition", "window_reverse"]

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


class WindowAttention(Attention):
    """Attention inside windows, plus Swin's learned relative position bias."""

    def __init__(self, dim: int, num_heads: int, window_size: int, **kw) -> None:
        super().__init__(dim, num_heads, **kw)
        self.window_size = window_size
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size - 1) ** 2, num_heads)
        )
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.register_buffer(
            "relative_position_index",
            relative_position_index((window_size, window_size)),
            persistent=False,
        )
        # set by optimize_for_inference; a buffer so that model.to(device) moves it too
        self.register_buffer("frozen_bias", None, persistent=False)

    def rel_bias(self) -> torch.Tensor:
        """``(heads, N, N)`` bias gathered from the table (or the frozen copy)."""
        if self.frozen_bias is not None:
            return self.frozen_bias
        return relative_position_bias(
            self.relative_position_bias_table, self.relative_position_index
        )

    def freeze_bias(self) -> None:
        """Gather the bias once for inference; the table must not change afterwards."""
        self.frozen_bias = self.rel_bias().detach()


class SwinBlock(Block):
    """A Transformer block whose attention runs in (optionally shifted) windows.

    Only :meth:`attend` differs from the shared :class:`Block`; norms, residuals, MLP and
    stochastic depth are inherited, so norm placement works here too.
    """

    def __init__(self, dim: int, num_heads: int, window_size: int, shift: bool, **kw) -> None:
        super().__init__(
            dim, num_heads, attn_layer=partial(WindowAttention, window_size=window_size), **kw
        )
        self.window_size = window_size
        self.shift_size = window_size // 2 if shift else 0
        self._mask_cache: dict[tuple, torch.Tensor] = {}

    def _mask(self, Hp: int, Wp: int, shift: tuple[int, int], device: torch.device) -> torch.Tensor:
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            # never cache tensors made while tracing (they may be fake or symbolic)
            return shifted_window_mask(Hp, Wp, self.window_size, shift, device)
        key = (Hp, Wp, shift, device)
        if key not in self._mask_cache:
            self._mask_cache[key] = shifted_window_mask(Hp, Wp, self.window_size, shift, device)
        return self._mask_cache[key]

    def _bias(self, Hp: int, Wp: int, shift: tuple[int, int], device: torch.device) -> torch.Tensor:
        """Relative position bias, plus the shifted-window mask when shifted.

        With a frozen bias (inference fast path) the sum is cached per input size.
        """
        bias = self.attn.rel_bias()
        if not symbolic(Hp, Wp) and not any(shift):
            return bias
        frozen = self.attn.frozen_bias is not None
        if frozen and not (torch.compiler.is_compiling() or torch.jit.is_tracing()):
            key = ("bias", Hp, Wp, shift, device, bias.dtype)
            if key not in self._mask_cache:
                self._mask_cache[key] = bias + self._mask(Hp, Wp, shift, device).to(bias.dtype)
            return self._mask_cache[key]
        return bias + self._mask(Hp, Wp, shift, device).to(bias.dtype)

    def attend(self, x: torch.Tensor, **attn_kw) -> torch.Tensor:
        _, H, W, _ = x.shape
        ws = self.window_size
        Hp, Wp = (H + ws - 1) // ws * ws, (W + ws - 1) // ws * ws  # padded to whole windows
        # a window covering the whole (padded) dim needs no shift. Symbolic sizes (dynamic-H/W
        # export): pad, roll and mask unconditionally, the shift chosen inside the graph, so
        # one graph serves every input size. (sym_ite on plain ints breaks torch.compile.)
        traced = symbolic(H, W)
        if traced:
            shift = tuple(torch.sym_ite(ws < n, self.shift_size, 0) for n in (Hp, Wp))
            x = gather_roll(F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H)), shift, -1, (Hp, Wp))
        else:
            shift = tuple(self.shift_size if ws < n else 0 for n in (Hp, Wp))
            padded = (Hp, Wp) != (H, W)
            x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H)) if padded else x
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2)) if any(shift) else x
        bias = self._bias(Hp, Wp, shift, x.device)  # (heads, N, N) or (nW, heads, N, N)
        windows = window_partition(x, ws)  # (B, nW, N, C)
        windows = self.attn(windows, bias=bias)  # (B, nW, N, C)
        x = window_reverse(windows, ws, Hp, Wp)  # (B, Hp, Wp, C)
        if traced:
            return gather_roll(x, shift, 1, (H, W))
        x = torch.roll(x, shifts=shift, dims=(1, 2)) if any(shift) else x
        return x[:, :H, :W, :] if padded else x

    def extra_repr(self) -> str:
        return f"window_size={self.window_size}, shift_size={self.shift_size}"


class PatchMerging(nn.Module):
    """Halve resolution, double width: concat each 2x2 neighbourhood, norm, project."""

    def __init__(self, dim: int, out_dim: int | None = None, norm_layer=LayerNorm) -> None:
        super().__init__()
        self.norm = norm_layer(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim or 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        h, w = (H + 1) // 2, (W + 1) // 2
        if symbolic(H, W) or (2 * h, 2 * w) != (H, W):  # pad odd sides
            x = F.pad(x, (0, 0, 0, 2 * w - W, 0, 2 * h - H))
        # order (0,0), (1,0), (0,1), (1,1) as the official repo, so checkpoints agree
        x = x.reshape(B, h, 2, w, 2, C).permute(0, 1, 3, 4, 2, 5)  # (B,h,w,2w,2h,C)
        return self.reduction(self.norm(x.flatten(3)))  # (B, H/2, W/2, 2C)


class SwinStage(nn.Module):
    """Optional patch merging, then blocks alternating regular and shifted windows."""

    def __init__(
        self,
        dim: int,
        out_dim: int,
        depth: int,
        num_heads: int,
        window_size: int,
        downsample: bool,
        drop_path: Sequence[float],
        norm_layer=LayerNorm,
        **block_kw,
    ) -> None:
        super().__init__()
        self.downsample = PatchMerging(dim, out_dim, norm_layer) if downsample else nn.Identity()
        self.blocks = nn.ModuleList(
            SwinBlock(
                out_dim,
                num_heads,
                window_size,
                shift=i % 2 == 1,
                drop_path=drop_path[i],
                norm_layer=norm_layer,
                **block_kw,
            )
            for i in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)  # (B, H, W, C)
        for blk in self.blocks:
            x = blk(x)
        return x


@dataclass(frozen=True)
class SwinConfig:
    """Architecture of a Swin Transformer."""

    img_size: int = 224  # nominal only: the model runs at any size
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_place: str = "pre"
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0


class SwinTransformer(nn.Module):
    """Hierarchical backbone: stage i has stride ``patch * 2**i`` and ``embed * 2**i`` channels."""

    def __init__(self, cfg: SwinConfig) -> None:
        super().__init__()
        check_config(cfg, type(self).__name__)
        if cfg.norm_place not in ("pre", "post"):  # "residual" needs one token stream
            raise ValueError(
                f"{type(self).__name__} config: norm_place must be 'pre' or 'post', "
                f"got {cfg.norm_place!r} ('residual' is for ViT and the hybrid)"
            )
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.in_chans = cfg.in_chans
        self.patch_size = cfg.patch_size
        self.min_size = cfg.patch_size * cfg.window_size
        norm = partial(LayerNorm, eps=1e-5)
        dims = [cfg.embed_dim * 2**i for i in range(len(cfg.depths))]
        self.num_features = dims[-1]

        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, cfg.embed_dim, norm_layer=norm)
        dpr = torch.linspace(0, cfg.drop_path_rate, sum(cfg.depths), device="cpu").split(
            list(cfg.depths)
        )
        self.layers = nn.Sequential(
            *(
                SwinStage(
                    dims[max(i - 1, 0)],
                    dims[i],
                    cfg.depths[i],
                    cfg.num_heads[i],
                    cfg.window_size,
                    downsample=i > 0,
                    drop_path=dpr[i].tolist(),
                    norm_layer=norm,
                    **block_kwargs(cfg),
                )
                for i in range(len(cfg.depths))
            )
        )
        self.norm = norm(self.num_features)
        self.head = ClassifierHead(self.num_features, cfg.num_classes, cfg.drop_rate)
        self.feature_info = [
            {"module": f"layers.{i}", "num_chs": d, "reduction": cfg.patch_size * 2**i}
            for i, d in enumerate(dims)
        ]
        self.apply(init_weights)

    def _check(self, x: torch.Tensor) -> None:
        dtype = self.patch_embed.proj.weight.dtype
        check_image(x, self.in_chans, self.min_size, type(self).__name__, dtype)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image ``(B, C, H, W)`` -> normed last-stage map ``(B, H/32, W/32, C)`` (NHWC)."""
        self._check(x)
        x = self.patch_embed(x)  # (B, H/4, W/4, C)
        return self.norm(self.layers(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Average-pool the NHWC map and classify."""
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self, x: torch.Tensor, indices: int | Sequence[int] | None = None, norm: bool = False
    ) -> list[torch.Tensor]:
        """Per-stage NCHW maps (strides 4, 8, 16, 32 for patch 4).

        ``norm`` applies the final norm to the last stage's map, as the classifier sees it.
        """
        take = select_indices(indices, len(self.layers), "stage")
        self._check(x)
        x = self.patch_embed(x)
        outs = []
        for i, stage in enumerate(self.layers[: take[-1] + 1]):
            x = stage(x)  # (B, H_i, W_i, C_i)
            if i in take:
                y = self.norm(x) if norm and i == len(self.layers) - 1 else x
                outs.append(y.permute(0, 3, 1, 2).contiguous())  # (B, C_i, H_i, W_i)
        return outs

    def no_weight_decay(self) -> set[str]:
        """The relative position tables are biases, not weights to shrink."""
        return {n for n, _ in self.named_parameters() if "relative_position_bias_table" in n}

    def reset_classifier(self, num_classes: int) -> None:
        """Swap the head for fine-tuning on another label set."""
        self.num_classes = num_classes
        self.head = ClassifierHead(self.num_features, num_classes, self.cfg.drop_rate)


class ClassifierHead(nn.Module):
    """Global average pool over an NHWC map, dropout, linear (``head.fc`` as in timm)."""

    def __init__(self, dim: int, num_classes: int, drop: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(x.mean(dim=(1, 2)))  # (B, C)
        return x if pre_logits else self.fc(x)


# --- registered sizes -------------------------------------------------------------------

_SIZES = {
    "swin_tiny_patch4_window7_224": dict(
        embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)
    ),
    "swin_small_patch4_window7_224": dict(
        embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)
    ),
    "swin_base_patch4_window7_224": dict(
        embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)
    ),
    "swin_test": dict(
        img_size=32,
        patch_size=2,
        embed_dim=16,
        depths=(2, 2, 2, 2),
        num_heads=(1, 2, 2, 4),
        window_size=2,
    ),
    # the embedded-MNIST recipe (configs/cls/swin_mnist.yaml): digits resized to 32, 8x8 tokens
    # in four shifted 4x4 windows, then patch merging to one 4x4 window
    "swin_mnist": dict(
        img_size=32,
        patch_size=4,
        in_chans=1,
        num_classes=10,
        embed_dim=64,
        depths=(2, 4),
        num_heads=(2, 4),
        window_size=4,
        mlp_ratio=2.0,
    ),
}
for _name, _kw in _SIZES.items():
    register_model(_name, SwinTransformer, SwinConfig(**_kw))

"""Swin Transformer (Liu et al. 2021): shifted-window attention in a 4-stage hierarchy.

Read top to bottom: WindowAttention -> SwinBlock -> PatchMerging -> SwinStage ->
SwinTransformer -> registered sizes (the window helpers: ``swin_windows.py``). State-dict
keys match timm's ``SwinTransformer``; torchvision and official-repo checkpoints convert in
``convert.py``.

Unlike the official repo, the shifted-window mask is built for the actual (padded) feature
size at run time and kept in a bounded cache, so any resolution works. Inputs whose feature
map is not a multiple of the window are zero-padded after ``norm1`` and the padding is
cropped off afterwards, as torchvision does; a window that covers the whole (padded) map is
not shifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from ..config import AT_LEAST_ONE, ConfigError, Range
from ..layers import (
    Attention,
    Block,
    LayerNorm,
    PatchEmbed,
    Rope,
    TensorCache,
    check_image,
    checkpointed,
    get_norm_layer,
    pad_to_multiple,
    relative_position_bias,
    relative_position_index,
)
from ._common import (
    NORM_LAYERS,
    block_kwargs,
    check_model_config,
    init_weights,
    select_indices,
)
from .base import VisionModel, check_output_fmt
from .registry import register_model
from .swin_windows import (
    BIAS_SIZES_CACHED,
    new_block_id,
    shift_windows,
    unshift_windows,
    window_bias,
    window_partition,
    window_reverse,
)

# fx leaf functions: they branch on the input size, which torch.fx.symbolic_trace does not know
for _fn in ("pad_to_multiple", "shift_windows", "unshift_windows", "window_bias"):
    torch.fx.wrap(_fn)


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
        """Gather the bias once for inference; the table must not change afterwards.

        Stored contiguous: the gathered view runs heads fastest, and a compiled softmax
        that read it strided along the keys could not vectorise its max and exp.
        """
        self.frozen_bias = self.rel_bias().detach().contiguous()


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
        self._bias_cache = TensorCache(BIAS_SIZES_CACHED)  # bias + mask, frozen path only
        # names a shifted block's bias + mask constant in compiled graphs
        self.block_id = new_block_id(self) if shift else None

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if self.shift_size:  # a copy or unpickled block is another graph constant
            self.block_id = new_block_id(self)

    def attend(self, x: torch.Tensor, rope: Rope | None = None) -> torch.Tensor:
        H, W, ws = x.shape[1], x.shape[2], self.window_size
        x, shift = shift_windows(x, ws, self.shift_size)  # (B, Hp, Wp, C)
        Hp, Wp = x.shape[1], x.shape[2]
        bias = window_bias(self, Hp, Wp, shift)  # (heads, N, N) or (nW, heads, N, N)
        windows = self.attn(window_partition(x, ws), bias=bias)  # (B, nW, N, C)
        return unshift_windows(window_reverse(windows, ws, Hp, Wp), shift, (H, W))

    def extra_repr(self) -> str:
        return f"window_size={self.window_size}, shift_size={self.shift_size}"


class PatchMerging(nn.Module):
    """Halve resolution, double width: concat each 2x2 neighbourhood, norm, project."""

    def __init__(self, dim: int, out_dim: int | None = None, norm_layer=LayerNorm) -> None:
        super().__init__()
        self.norm = norm_layer(4 * dim)
        self.reduction = nn.Linear(4 * dim, out_dim or 2 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_to_multiple(x, 2, channels_last=True)  # odd sides
        B, H, W, C = x.shape
        # order (0,0), (1,0), (0,1), (1,1) as the official repo, so checkpoints agree
        x = x.reshape(B, H // 2, 2, W // 2, 2, C).permute(0, 1, 3, 4, 2, 5)  # (B,h,w,2w,2h,C)
        return self.reduction(self.norm(x.flatten(3)))  # (B, H/2, W/2, 2C)


class SwinStage(nn.Module):
    """Optional patch merging, then blocks alternating regular and shifted windows."""

    grad_checkpointing = False

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
            x = checkpointed(blk, self.grad_checkpointing, x)
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
    norm_layer: str = "layernorm"  # "layernorm" | "rmsnorm": every norm, patch merging's too
    global_pool: str = "avg"  # "avg" or "" (forward returns the NHWC map)
    drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    RANGES: ClassVar[dict[str, Range]] = {"depths": AT_LEAST_ONE, "window_size": AT_LEAST_ONE}
    # "residual" needs one token stream: it is for ViT and the hybrid
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "norm_place": ("pre", "post"),
        "norm_layer": NORM_LAYERS,
    }

    def __post_init__(self) -> None:
        check_model_config(self)
        if not self.depths or len(self.depths) != len(self.num_heads):
            raise ConfigError(
                f"num_heads must have one entry per stage of depths {list(self.depths)} "
                f"(at least one), got {list(self.num_heads)}"
            )
        for i, h in enumerate(self.num_heads):  # per-stage heads divide the stage's width
            if (self.embed_dim * 2**i) % h:
                raise ConfigError(
                    f"num_heads[{i}] must divide stage {i}'s width {self.embed_dim * 2**i}, got {h}"
                )


class SwinTransformer(VisionModel):
    """Hierarchical backbone: stage i has stride ``patch * 2**i`` and ``embed * 2**i`` channels."""

    checkpoint_family = "swin"
    backbone_kind = "stages"
    classifier = "head.fc"
    output_fmt = "NHWC"

    def __init__(self, cfg: SwinConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.in_chans = cfg.in_chans
        self.patch_size = cfg.patch_size
        self.min_size = cfg.patch_size * cfg.window_size
        norm = partial(get_norm_layer(cfg.norm_layer), eps=1e-5)
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
        self._check_pool(cfg.global_pool)
        self.head = ClassifierHead(
            self.num_features, cfg.num_classes, cfg.drop_rate, cfg.global_pool
        )
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
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list | tuple[torch.Tensor, list]:
        """Per-stage maps (strides 4, 8, 16, 32 for patch 4; timm's API: see VisionModel).

        ``norm`` applies to the last stage's map only, as the classifier sees it; ``output_fmt``
        is ``"NCHW"`` or the stages' own ``"NHWC"`` (the final features are NHWC).
        """
        check_output_fmt(output_fmt, ("NCHW", "NHWC"), type(self).__name__)
        take = select_indices(indices, len(self.layers), "stage")
        self._check(x)
        x = self.patch_embed(x)
        last = take[-1] + 1 if stop_early or intermediates_only else len(self.layers)
        outs = []
        for i, stage in enumerate(self.layers[:last]):
            x = stage(x)  # (B, H_i, W_i, C_i)
            if i in take:
                y = self.norm(x) if norm and i == len(self.layers) - 1 else x
                outs.append(y.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else y)
        return outs if intermediates_only else (self.norm(x), outs)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stages after the last index (and the norm / head); returns the indices."""
        take = select_indices(indices, len(self.layers), "stage")
        self.layers = self.layers[: take[-1] + 1]
        self.feature_info = self.feature_info[: take[-1] + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups: by stage (coarse), else by block, merges with their stage."""
        return {
            "stem": r"^patch_embed",
            "blocks": r"^layers\.(\d+)"
            if coarse
            else [
                (r"^layers\.(\d+).downsample", (0,)),
                (r"^layers\.(\d+)\.\w+\.(\d+)", None),
                (r"^norm", (99999,)),
            ],
        }

    def no_weight_decay(self) -> set[str]:
        """The relative position tables are biases, not weights to shrink."""
        return {n for n, _ in self.named_parameters() if "relative_position_bias_table" in n}

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Swap the head for fine-tuning on another label set (and the pooling, if given)."""
        if global_pool is not None:
            self._check_pool(global_pool)
        pool = self.head.global_pool if global_pool is None else global_pool
        self.num_classes = num_classes
        self.head = ClassifierHead(self.num_features, num_classes, self.cfg.drop_rate, pool)


class ClassifierHead(nn.Module):
    """Global average pool over an NHWC map, dropout, linear (``head.fc`` as in timm).

    ``global_pool=""`` keeps the map: the linear then acts per position, as in timm.
    """

    def __init__(
        self, dim: int, num_classes: int, drop: float = 0.0, global_pool: str = "avg"
    ) -> None:
        super().__init__()
        self.global_pool = global_pool
        self.drop = nn.Dropout(drop)
        self.fc = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def forward(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x.mean(dim=(1, 2))  # (B, C)
        x = self.drop(x)
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

"""Lightweight CNN+Transformer hybrid: classification and dense grasp maps on one trunk.

A conv stem (one full-resolution conv, then stride-2 stages with depthwise-residual blocks)
shortens the token sequence cheaply, a few shared :class:`~vision_tfm.layers.Block` layers
add global context on the coarse grid, and a head reads the result: average pooling for
:class:`HybridClassifier`, a U-Net style conv decoder for :class:`GraspHybrid`. Both hold the
same :class:`HybridTrunk` as ``trunk``, so trunk weights move between them as they are.

Read top to bottom: conv blocks -> HybridTrunk -> the two models -> registered sizes.
Position encodings are computed for the actual grid (2D sin-cos or RoPE), so any input size
runs; the stem's stride-2 convs give ``ceil(H / 2**i)`` maps, with no padding needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..config import AT_LEAST_ONE, NON_NEGATIVE, ConfigError, Range
from ..constants import MAP_KEYS
from ..layers import (
    NORM_PLACEMENTS,
    Rope,
    block_stack,
    check_image,
    checkpointed,
    get_norm_layer,
    pad_to_multiple,
    rope_2d,
    run_blocks,
    sincos_2d,
)
from ._common import (
    ATTENTION_CHOICES,
    NORM_LAYERS,
    block_kwargs,
    check_model_config,
    init_weights,
    select_indices,
)
from .base import LinearHeadModel, VisionModel, check_output_fmt
from .convs import UpStage, conv_stage
from .registry import register_model

POS_EMBEDS = ("sincos", "rope", "none")
# fx leaf functions: they branch on the input size, which torch.fx.symbolic_trace does not know
for _fn in ("pad_to_multiple", "rope_2d", "sincos_2d"):
    torch.fx.wrap(_fn)


# --- the shared trunk ------------------------------------------------------------------------


@dataclass(frozen=True)
class HybridTrunkConfig:
    """Architecture of the trunk; the model configs add their head's fields to these."""

    img_size: int = 224  # nominal only: the model runs at any size >= one token
    in_chans: int = 3
    stem_chs: tuple[int, ...] = (8, 16, 32, 64)  # stage 0 at full res, then stride 2 each
    stem_depths: tuple[int, ...] = (0, 1, 1, 1)  # depthwise-residual blocks per stem stage
    embed_dim: int = 128
    depth: int = 2
    num_heads: int = 4
    mlp_ratio: float = 2.0
    qkv_bias: bool = True
    pos_embed: str = "sincos"  # "sincos" | "rope" | "none"
    rope_theta: float = 100.0
    attn_type: str = "softmax"  # "softmax" | "linear" (cost linear in the token count)
    feature_map: str = "elu1"  # linear only: "elu1" | "relu" | "favor"
    favor_features: int = 0  # favor only: random features per head; 0 = head_dim * ln(head_dim)
    norm_place: str = "pre"  # "pre" | "post" | "residual"
    norm_layer: str = "layernorm"  # "layernorm" | "rmsnorm": the Transformer's norms
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    RANGES: ClassVar[dict[str, Range]] = {"stem_chs": AT_LEAST_ONE, "stem_depths": NON_NEGATIVE}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        **ATTENTION_CHOICES,
        "pos_embed": POS_EMBEDS,
        "norm_place": NORM_PLACEMENTS,
        "norm_layer": NORM_LAYERS,
    }

    def __post_init__(self) -> None:
        check_model_config(self)
        if not self.stem_chs or len(self.stem_chs) != len(self.stem_depths):
            raise ConfigError(
                f"stem_chs {list(self.stem_chs)} and stem_depths {list(self.stem_depths)} "
                "must be non-empty and of the same length"
            )


class HybridTrunk(nn.Module):
    """Conv stem to a ``1 / 2**(S-1)`` grid for S stem stages, then Transformer blocks on it.

    ``forward`` returns the normed token map ``(B, D, h, w)`` and every stem stage's map
    (strides 1, 2, 4, ...), which dense heads use as skip connections.
    """

    grad_checkpointing = False

    def __init__(self, cfg: HybridTrunkConfig) -> None:
        super().__init__()
        self.pos_embed = cfg.pos_embed
        self.rope_theta = cfg.rope_theta
        chs, D = cfg.stem_chs, cfg.embed_dim
        norm = get_norm_layer(cfg.norm_layer)
        self.reduction = 2 ** (len(chs) - 1)
        self.stem = nn.ModuleList(
            conv_stage(cfg.in_chans if i == 0 else chs[i - 1], c, 1 if i == 0 else 2, d)
            for i, (c, d) in enumerate(zip(chs, cfg.stem_depths))
        )
        self.proj = nn.Conv2d(chs[-1], D, 1)  # stem width -> token width
        self.blocks = block_stack(
            cfg.depth,
            cfg.drop_path_rate,
            dim=D,
            num_heads=cfg.num_heads,
            norm_layer=norm,
            **block_kwargs(cfg),
        )
        final_norm = self.blocks[0].place.wants_final_norm(False)
        self.norm = norm(D) if final_norm else nn.Identity()
        self.feature_info = [
            {"module": f"stem.{i}", "num_chs": c, "reduction": 2**i} for i, c in enumerate(chs)
        ] + [{"module": "norm", "num_chs": D, "reduction": self.reduction}]

    def transform(
        self, x: torch.Tensor, norm: bool | None = True
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Last stem map ``(B, C, h, w)`` -> tokens with global context, ``(B, D, h, w)``;
        ``norm=None``: both the map without and with the final norm (see ``run_blocks``)."""
        x = self.proj(x)
        B, D, h, w = x.shape
        x = x.flatten(2).transpose(1, 2)  # (B, N, D); a view when x is channels_last
        rope = None
        if self.pos_embed == "sincos":
            x = x + sincos_2d(h, w, D, dtype=x.dtype, device=x.device)  # (N, D), MAE order
        elif self.pos_embed == "rope":
            heads = self.blocks[0].attn.num_heads
            sin, cos = rope_2d(h, w, D // heads, self.rope_theta, device=x.device)
            rope = Rope(sin, cos)
        x = run_blocks(self.blocks, x, self.norm, self.grad_checkpointing, rope, normed=norm)
        if norm is None:
            return tuple(t.transpose(1, 2).reshape(B, D, h, w) for t in x)
        return x.transpose(1, 2).reshape(B, D, h, w)  # (B, D, h, w), channels_last strides

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Image -> (normed token map ``(B, D, H/r, W/r)``, stem maps at strides 1, 2, ...)."""
        *feats, tokens = self.forward_intermediates(x, norm=True)
        return tokens, feats

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        final: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Stem stage maps then the Transformer output, all NCHW (see ``feature_info``);
        ``final``: also the normed token map, ``(tokens, maps)``, from the same pass."""
        n = len(self.feature_info)
        take = select_indices(indices, n, "stage")
        stop = n - 1 if final else take[-1]
        # channels_last: faster CPU (oneDNN) and AMP convs, and the token flatten is a view
        x = x.contiguous(memory_format=torch.channels_last)
        outs = []
        for i, stage in enumerate(self.stem[: stop + 1]):
            x = checkpointed(stage, self.grad_checkpointing, x)
            if i in take:
                outs.append(x)
        if stop < n - 1:
            return outs
        if not final:
            return [*outs, self.transform(x, norm=norm)]
        raw, tokens = self.transform(x, norm=None)
        if take[-1] == n - 1:
            outs.append(tokens if norm else raw)
        return tokens, outs

    def extra_repr(self) -> str:
        return f"reduction={self.reduction}, pos_embed={self.pos_embed}"


class _HybridModel(VisionModel):
    """What both heads share: the trunk, input checks, features and intermediates."""

    first_conv = "trunk.stem.0.0.conv"

    def __init__(self, cfg: HybridTrunkConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.in_chans = cfg.in_chans
        self.num_features = self.embed_dim = cfg.embed_dim
        self.trunk = HybridTrunk(cfg)
        self.feature_info = [
            {**info, "module": f"trunk.{info['module']}"} for info in self.trunk.feature_info
        ]

    def _init_weights(self) -> None:
        """timm init; conv weights channels_last like the activations, so no per-call reorder."""
        self.apply(init_weights)
        self.to(memory_format=torch.channels_last)

    def _check(self, x: torch.Tensor) -> None:
        # the first stem conv: folding BatchNorm swaps the module, pruning may drop `proj`
        w = next(self.trunk.stem.parameters())
        check_image(x, self.in_chans, self.trunk.reduction, type(self).__name__, w.dtype)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image ``(B, C, H, W)`` -> normed token map ``(B, D, H/r, W/r)`` (NCHW)."""
        self._check(x)
        return self.trunk(x)[0]

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list | tuple[torch.Tensor, list]:
        """Stem stages (strides 1, 2, 4, ...) then the token map, NCHW (see VisionModel); the
        trunk runs once, to the last index taken (to the end when the features are returned
        too), so ``stop_early`` changes nothing."""
        check_output_fmt(output_fmt, ("NCHW",), type(self).__name__)
        self._check(x)
        if intermediates_only:
            return self.trunk.forward_intermediates(x, indices, norm)
        return self.trunk.forward_intermediates(x, indices, norm, final=True)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the stem stages after the last index (the blocks too, unless it is the token
        map), and the head; returns the indices."""
        n = len(self.feature_info)
        take = select_indices(indices, n, "stage")
        if take[-1] < n - 1:
            self.trunk.stem = self.trunk.stem[: take[-1] + 1]
            self.trunk.proj = self.trunk.blocks = nn.Identity()
            self.trunk.norm = nn.Identity()
        elif prune_norm and not self.trunk.blocks[0].place.norm_is_merge:
            self.trunk.norm = nn.Identity()
        if prune_head and hasattr(self, "reset_classifier"):
            self.reset_classifier(0, "")
        return take

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups: the conv stem, each Transformer block, the final norm."""
        return {
            "stem": r"^trunk\.(?:stem|proj)",
            "blocks": [(r"^trunk\.blocks\.(\d+)", None), (r"^trunk\.norm", (99999,))],
        }


# --- classification ----------------------------------------------------------------------


@dataclass(frozen=True)
class HybridConfig(HybridTrunkConfig):
    """Trunk plus an average-pool classifier head."""

    num_classes: int = 1000
    global_pool: str = "avg"  # "avg" or "" (forward returns the NCHW token map)
    drop_rate: float = 0.0  # before the head


class HybridClassifier(_HybridModel, LinearHeadModel):
    """Trunk, global average pool, linear head."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__(cfg)
        self._check_pool(cfg.global_pool)
        self.global_pool = cfg.global_pool
        self.num_classes = cfg.num_classes
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self._init_weights()

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Average-pool the NCHW token map and classify; ``pre_logits`` returns the pooled."""
        if self.global_pool == "avg":
            x = x.mean(dim=(2, 3))  # (B, D)
        else:  # unpooled: the linear acts per position, as in timm
            x = x.permute(0, 2, 3, 1)  # (B, h, w, D)
        x = self.head_drop(x)
        x = x if pre_logits else self.head(x)
        return x if self.global_pool == "avg" else x.permute(0, 3, 1, 2)  # (B, D|K, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


# --- dense grasp maps ----------------------------------------------------------------------


@dataclass(frozen=True)
class GraspHybridConfig(HybridTrunkConfig):
    """Trunk plus a U-Net decoder to the four grasp maps; 4 input channels = RGB-D."""

    in_chans: int = 4
    dec_depth: int = 1  # depthwise-residual blocks per decoder level

    RANGES: ClassVar[dict[str, Range]] = {**HybridTrunkConfig.RANGES, "dec_depth": NON_NEGATIVE}


class GraspHybrid(_HybridModel):
    """Trunk plus a U-Net decoder: ``forward`` returns full-resolution grasp maps.

    Output dict of logits, each map ``(B, 1, H, W)`` at the input size: ``quality``, ``cos``,
    ``sin``, ``width``. :func:`vision_tfm.grasp.activate_grasp_maps` turns them into the maps
    (quality probability, ``cos 2θ``, ``sin 2θ``, ``opening / WIDTH_SCALE``); the loss takes
    the quality logits as they are (BCE with logits), so no clamped probability enters it.

    Inputs whose sides are not a multiple of the trunk's reduction are zero-padded at the
    bottom/right and the maps are cropped back, so every level upsamples by exactly 2.
    """

    output_maps = MAP_KEYS

    def __init__(self, cfg: GraspHybridConfig) -> None:
        super().__init__(cfg)
        chs = cfg.stem_chs
        widths = [cfg.embed_dim, *chs[-2::-1]]  # coarse -> fine: tokens, then stem skips
        self.decoder = nn.ModuleList(
            UpStage(widths[i], widths[i + 1], cfg.dec_depth) for i in range(len(chs) - 1)
        )
        self.head = nn.Conv2d(chs[0], len(MAP_KEYS), 1)
        self._init_weights()

    def norm_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """RGB as ImageNet, depth already centred and clipped (``vision_tfm.data.grasp``)."""
        if self.in_chans == 1:
            return (0.0,), (1.0,)
        return super().norm_stats()

    def decode(self, x: torch.Tensor, skips: Sequence[torch.Tensor]) -> torch.Tensor:
        """Token map and stem maps (fine -> coarse) -> raw ``(B, 4, H, W)`` map logits."""
        for stage, skip in zip(self.decoder, reversed(skips)):
            x = stage(x, skip)
        return self.head(x)

    def forward_maps(self, x: torch.Tensor) -> torch.Tensor:
        """Image -> the four logit maps stacked, ``(B, 4, H, W)`` in ``MAP_KEYS`` order.

        What export reads (:class:`vision_tfm.tasks.grasp.GraspMaps`): one map tensor activates
        and leaves the graph in one piece, where four one-channel maps cost a runtime a
        layout pass each."""
        self._check(x)
        H, W = x.shape[-2:]
        tokens, feats = self.trunk(pad_to_multiple(x, self.trunk.reduction))
        return self.decode(tokens, feats[:-1])[..., :H, :W]  # (B, 4, H, W)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        maps = self.forward_maps(x).split(1, dim=1)  # indexed, not iterated: fx Proxies don't
        return {k: maps[i] for i, k in enumerate(MAP_KEYS)}  # 4 x (B, 1, H, W) logits


# --- registered sizes -------------------------------------------------------------------

_CLASSIFIERS = {
    "hybrid_test": dict(
        img_size=32, stem_chs=(8, 16, 16), stem_depths=(0, 1, 1), embed_dim=32, num_heads=2
    ),
    # 28 -> 14 -> 7: 49 tokens; more conv blocks beat a wider Transformer here (the recipe
    # and its result: configs/cls/hybrid_mnist.yaml)
    "hybrid_mnist": dict(
        img_size=28,
        in_chans=1,
        num_classes=10,
        stem_chs=(16, 32, 64),
        stem_depths=(1, 2, 2),
        embed_dim=96,
        depth=2,
        num_heads=3,
        drop_path_rate=0.1,
    ),
    # 224 -> 14x14 tokens, ~5 M parameters
    "hybrid_small": dict(
        stem_chs=(16, 32, 64, 96, 160),
        stem_depths=(0, 1, 2, 2, 2),
        embed_dim=256,
        depth=6,
        num_heads=8,
        mlp_ratio=3.0,
        drop_path_rate=0.1,
    ),
}
_GRASP = {
    "grasp_hybrid_t": dict(
        stem_chs=(8, 16, 32, 48), stem_depths=(0, 1, 1, 1), embed_dim=64, num_heads=2
    ),
    "grasp_hybrid_s": dict(
        stem_chs=(12, 24, 48, 96), stem_depths=(0, 1, 2, 2), embed_dim=128, depth=4
    ),
}
for _name, _kw in _CLASSIFIERS.items():
    register_model(_name, HybridClassifier, HybridConfig(**_kw))
for _name, _kw in _GRASP.items():
    register_model(_name, GraspHybrid, GraspHybridConfig(**_kw))

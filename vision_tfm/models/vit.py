"""Vision Transformer (Dosovitskiy et al. 2021), read top to bottom: config -> model -> sizes.

State-dict keys match timm's ``VisionTransformer``, so timm checkpoints load as they are.
Any input resolution works at run time: the learned position table is resampled to the
token grid of the input (non-square included); sin-cos and RoPE are computed for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from ..config import NON_NEGATIVE, ConfigError, Range
from ..layers import (
    NORM_PLACEMENTS,
    PatchEmbed,
    Rope,
    block_stack,
    check_image,
    checkpointed,
    get_mlp_layer,
    get_norm_layer,
    resample_abs_pos_embed,
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
from .base import LinearHeadModel, check_output_fmt
from .registry import register_model

# fx leaf functions: they branch on the token grid, which torch.fx.symbolic_trace does not know
for _fn in ("resample_abs_pos_embed", "rope_2d", "sincos_2d"):
    torch.fx.wrap(_fn)

POS_EMBEDS = ("learn", "sincos", "rope", "none")


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of a ViT. Field names follow the field's vocabulary (timm, the paper)."""

    img_size: int = 224  # training size: sets the learned position table's grid
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_norm: bool = False
    class_token: bool = True
    global_pool: str = "token"  # "token" (class token), "avg" (mean of patch tokens), "" (none)
    pos_embed: str = "learn"  # "learn" | "sincos" | "rope" | "none"
    rope_theta: float = 100.0
    attn_type: str = "softmax"  # "softmax" | "linear" (cost linear in the token count)
    feature_map: str = "elu1"  # linear only: "elu1" | "relu" | "favor"
    favor_features: int = 0  # favor only: random features per head; 0 = head_dim * ln(head_dim)
    norm_place: str = "pre"  # "pre" | "post" | "residual"
    norm_layer: str = "layernorm"
    mlp_layer: str = "mlp"  # "mlp" | "swiglu"
    init_values: float = 0.0  # LayerScale init; 0 = off
    drop_rate: float = 0.0  # before the head
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    RANGES: ClassVar[dict[str, Range]] = {"init_values": NON_NEGATIVE}  # with _common's
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        **ATTENTION_CHOICES,
        "pos_embed": POS_EMBEDS,
        "norm_place": NORM_PLACEMENTS,
        "norm_layer": NORM_LAYERS,
    }

    def __post_init__(self) -> None:
        check_model_config(self)
        if self.img_size % self.patch_size:  # also refuses an image smaller than one patch
            raise ConfigError(
                f"img_size {self.img_size} must be a multiple of patch_size {self.patch_size}: "
                "the position table covers whole patches (other input sizes are fine at run time)"
            )


class VisionTransformer(LinearHeadModel):
    """ViT with class-token or average pooling, for any input size."""

    checkpoint_family = "vit"
    backbone_kind = "simple_pyramid"
    global_pools = ("token", "avg", "")
    default_out_indices = 3  # timm's ViT: the last three blocks
    output_fmt = "NLC"

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self._check_pool(cfg.global_pool, cfg.class_token)
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.in_chans = cfg.in_chans
        self.embed_dim = self.num_features = cfg.embed_dim
        self.patch_size = cfg.patch_size
        self.global_pool = cfg.global_pool
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        self.grid = (cfg.img_size // cfg.patch_size,) * 2
        norm = partial(get_norm_layer(cfg.norm_layer), eps=1e-6)
        D = cfg.embed_dim

        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        if cfg.pos_embed == "learn":
            n_pos = self.grid[0] * self.grid[1] + self.num_prefix_tokens
            self.pos_embed = nn.Parameter(torch.randn(1, n_pos, D) * 0.02)
        else:
            self.pos_embed = None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.blocks = block_stack(
            cfg.depth,
            cfg.drop_path_rate,
            dim=D,
            num_heads=cfg.num_heads,
            qk_norm=cfg.qk_norm,
            init_values=cfg.init_values or None,
            norm_layer=norm,
            mlp_layer=get_mlp_layer(cfg.mlp_layer),
            **block_kwargs(cfg),
        )
        # timm: with average pooling the final norm moves after pooling (fc_norm)
        use_fc_norm = cfg.global_pool == "avg"
        final_norm = self.blocks[0].place.wants_final_norm(use_fc_norm)
        self.norm = norm(D) if final_norm else nn.Identity()
        self.fc_norm = norm(D) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(D, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": D, "reduction": cfg.patch_size}
            for i in range(cfg.depth)
        ]
        self.apply(init_weights)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)

    # --- pieces, in the paper's order --------------------------------------------------

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, Rope | None, tuple[int, int]]:
        """Patchify, prepend the class token, add positions. Returns tokens, RoPE, grid."""
        w = self.patch_embed.proj.weight
        check_image(x, self.in_chans, self.patch_size, type(self).__name__, w.dtype)
        x = self.patch_embed(x)  # (B, gh, gw, D)
        B, gh, gw, D = x.shape
        x = x.reshape(B, gh * gw, D)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)  # (B, 1+N, D)
        rope = None
        if self.pos_embed is not None:
            pos = resample_abs_pos_embed(
                self.pos_embed, (gh, gw), self.grid, self.num_prefix_tokens
            )
            x = x + pos
        elif self.cfg.pos_embed == "sincos":
            pos = sincos_2d(gh, gw, D, dtype=x.dtype, device=x.device)  # (N, D); not on prefix
            x = torch.cat([x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :] + pos], 1)
        elif self.cfg.pos_embed == "rope":
            head_dim = D // self.cfg.num_heads
            sin, cos = rope_2d(gh, gw, head_dim, self.cfg.rope_theta, device=x.device)
            rope = Rope(sin, cos, self.num_prefix_tokens)
        return self.pos_drop(x), rope, (gh, gw)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image ``(B, C, H, W)`` -> normed tokens ``(B, prefix + N, D)``."""
        x, rope, _ = self.embed(x)
        return run_blocks(self.blocks, x, self.norm, self.grad_checkpointing, rope)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool tokens and classify; ``pre_logits`` returns the pooled feature instead."""
        if self.global_pool == "avg":
            x = x[:, self.num_prefix_tokens :].mean(dim=1)  # (B, D)
        elif self.global_pool == "token":
            x = x[:, 0]  # class token (B, D)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list | tuple[torch.Tensor, list]:
        """Block outputs for dense heads and probes (timm's API: see :class:`VisionModel`).

        ``return_prefix_tokens`` pairs each map with its prefix (class) tokens ``(B, P, D)``;
        ``output_fmt`` is ``"NCHW"`` maps ``(B, D, H/p, W/p)`` or ``"NLC"`` tokens ``(B, N, D)``.
        """
        check_output_fmt(output_fmt, ("NCHW", "NLC"), type(self).__name__)
        take = select_indices(indices, len(self.blocks), "block")
        x, rope, (gh, gw) = self.embed(x)
        place = self.blocks[0].place
        stream = place.begin(x)
        last = take[-1] + 1 if stop_early or intermediates_only else len(self.blocks)
        outs = []
        for i, blk in enumerate(self.blocks[:last]):
            stream = checkpointed(blk, self.grad_checkpointing, stream, rope)
            if i in take:
                y = place.tokens(stream)
                y = self.norm(y) if norm else y
                prefix, y = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens :]
                if output_fmt == "NCHW":  # (B, N, D) -> (B, D, gh, gw)
                    y = y.transpose(1, 2).reshape(y.shape[0], -1, gh, gw)
                outs.append((y, prefix) if return_prefix_tokens else y)
        return outs if intermediates_only else (place.end(stream, self.norm, True), outs)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last index (and the norm / head); returns the indices."""
        take = select_indices(indices, len(self.blocks), "block")
        self.blocks = self.blocks[: take[-1] + 1]
        self.feature_info = self.feature_info[: take[-1] + 1]
        if prune_norm and not self.blocks[0].place.norm_is_merge:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups (layer decay): embeddings, each block, the final norm."""
        return {
            "stem": r"^cls_token|pos_embed|patch_embed",
            "blocks": [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        }

    def no_weight_decay(self) -> set[str]:
        """Parameters that weight decay would only shrink towards a meaningless zero."""
        return {"pos_embed", "cls_token"}

    def pool_size(self) -> None:
        return None  # forward_features gives tokens

    def _check_pool(self, global_pool: str, class_token: bool | None = None) -> None:
        super()._check_pool(global_pool)
        has_token = self.num_prefix_tokens > 0 if class_token is None else class_token
        if global_pool == "token" and not has_token:
            raise ConfigError("global_pool='token' needs class_token=True")


# --- registered sizes -------------------------------------------------------------------

_SIZES = {
    "vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
    # tiny configs for tests and the embedded 28x28 digits
    "vit_test": dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
    "vit_test_avg_rope": dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        class_token=False,
        global_pool="avg",
        pos_embed="rope",
    ),
    # the embedded-MNIST recipe (configs/cls/vit_mnist.yaml): 16 tokens, mean-pooled
    "vit_mnist": dict(
        img_size=28,
        patch_size=7,
        in_chans=1,
        num_classes=10,
        embed_dim=128,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
        class_token=False,
        global_pool="avg",
    ),
}
for _name, _kw in _SIZES.items():
    register_model(_name, VisionTransformer, ViTConfig(**_kw))

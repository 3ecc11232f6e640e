"""The shared core: every model family builds from these pieces and none redefines them.

Stochastic depth, LayerScale and the GELU MLP are timm's own (same state-dict keys); they
are re-exported here so that the families import every piece from one place.
"""

from timm.layers import DropPath, LayerScale, drop_path

from .attention import (
    ATTN_TYPES,
    Attention,
    explicit_attention,
    fused_attn,
    merge_bias_and_mask,
    sdpa_attention,
    set_fused_attn,
)
from .block import (
    NORM_PLACEMENTS,
    Block,
    NormPlacement,
    PostNorm,
    PreNorm,
    ResiDual,
    block_stack,
    checkpointed,
    run_blocks,
)
from .cache import TensorCache
from .linear_attention import FEATURE_MAPS, FeatureMap, fast_weight_attention, linear_attention
from .mlp import Mlp, SwiGLU, get_mlp_layer
from .norm import LayerNorm, LayerNorm2d, RMSNorm, get_norm_layer
from .patch_embed import PatchEmbed, check_image
from .pos_embed import (
    Rope,
    apply_rope,
    relative_position_bias,
    relative_position_index,
    resample_abs_pos_embed,
    rope_2d,
    sincos_2d,
)
from .sizes import pad_to_multiple, symbolic

__all__ = [
    "ATTN_TYPES",
    "FEATURE_MAPS",
    "NORM_PLACEMENTS",
    "Attention",
    "Block",
    "DropPath",
    "FeatureMap",
    "LayerNorm",
    "LayerNorm2d",
    "LayerScale",
    "Mlp",
    "NormPlacement",
    "PatchEmbed",
    "PostNorm",
    "PreNorm",
    "RMSNorm",
    "ResiDual",
    "Rope",
    "SwiGLU",
    "TensorCache",
    "apply_rope",
    "block_stack",
    "check_image",
    "checkpointed",
    "drop_path",
    "explicit_attention",
    "fast_weight_attention",
    "fused_attn",
    "get_mlp_layer",
    "get_norm_layer",
    "linear_attention",
    "merge_bias_and_mask",
    "pad_to_multiple",
    "relative_position_bias",
    "relative_position_index",
    "resample_abs_pos_embed",
    "rope_2d",
    "run_blocks",
    "sdpa_attention",
    "set_fused_attn",
    "sincos_2d",
    "symbolic",
]

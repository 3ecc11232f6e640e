"""Device-specific kernel choices, kept out of the shared core and applied by module swap.

The layers compute what the math says (:mod:`vision_tfm.layers`); this package decides which
kernel computes it fastest on this machine, from what the CPU can do (:mod:`.cpu`), and swaps
modules that make those choices into a built model, in place, with the same parameters and
state-dict keys:

- :func:`prepare_for_training`: the training engine's one call; attention on the path
  :func:`attention_plan` picks per call (:mod:`.attention`);
- ``vision_tfm.optimize_for_inference`` swaps the same attention in, and Linear layers for
  :class:`OneDnnLinear` where oneDNN runs faster than the BLAS (:mod:`.linear`).

Each rule names the benchmark script that re-measures it.
"""

from .attention import (
    PlannedAttention,
    planned_explicit_attention,
    prepare_for_training,
    scaled_scores,
    use_planned_attention,
)
from .cpu import (
    AttentionPlan,
    attention_plan,
    bf16_dot_units_only,
    bf16_matmul_slowdown,
    cpu_amx,
    cpu_capability,
    cpu_description,
    cpu_native_bf16,
    dispatch_facts,
    emulated_bf16_note,
    onednn_bf16_runs,
    warn_if_bf16_emulated,
)
from .linear import (
    OneDnnLinear,
    fuse_mlp_gelu,
    onednn_linear_pays,
    onednn_linear_speedup,
    use_onednn_linears,
)

__all__ = [
    "AttentionPlan",
    "OneDnnLinear",
    "PlannedAttention",
    "attention_plan",
    "bf16_dot_units_only",
    "bf16_matmul_slowdown",
    "cpu_amx",
    "cpu_capability",
    "cpu_description",
    "cpu_native_bf16",
    "dispatch_facts",
    "emulated_bf16_note",
    "fuse_mlp_gelu",
    "onednn_bf16_runs",
    "onednn_linear_pays",
    "onednn_linear_speedup",
    "planned_explicit_attention",
    "prepare_for_training",
    "scaled_scores",
    "use_onednn_linears",
    "use_planned_attention",
    "warn_if_bf16_emulated",
]

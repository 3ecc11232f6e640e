"""An inference fast path: fold what training needed apart, pre-compute what is constant.

``optimize_for_inference(model)`` returns the same model, in eval mode, with
- BatchNorm folded into the preceding conv (hybrid stems and decoders);
- LayerScale folded into the projection before it;
- Swin's relative position bias gathered once per block, and the shifted-window mask
  added to it once per input size (cached);
- attention on the path :mod:`vision_tfm.accel` plans per call for this device (fused SDPA
  unless the explicit one measured faster, see ``accel/cpu.py``);
- fp32 Linear layers on oneDNN where it measured faster than the BLAS on this CPU (see
  ``accel/linear.py``), and bf16 ones where bf16 is native; in eager inference the MLP's
  GELU then runs inside its first GEMM;
- optionally the weights cast once to ``dtype`` (bf16 inference without per-call casts);
- optionally ``torch.compile`` with freezing (weights become constants Inductor folds and
  pre-packs; :class:`FrozenCompiled`); off by default, since compiling each input shape
  pays off only in a server.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval

from .accel import (
    cpu_native_bf16,
    fuse_mlp_gelu,
    onednn_linear_pays,
    use_onednn_linears,
    use_planned_attention,
    warn_if_bf16_emulated,
)
from .errors import ConfigError, InputTypeError
from .layers import Block, LayerScale, set_fused_attn

__all__ = ["FrozenCompiled", "optimize_for_inference"]

# the names people write for a weight dtype; a torch.dtype works as well
DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


def _weight_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16``; anything but a floating dtype is a one-line error."""
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ConfigError(
        f"optimize_for_inference: dtype must be a floating torch.dtype or one of "
        f"{', '.join(DTYPES)}; got {dtype!r}"
    )


def _fold_conv_bn(module: nn.Module) -> None:
    """Replace every ``conv`` -> ``bn`` pair held by one parent with a single conv."""
    for parent in module.modules():
        names = list(parent._modules)
        for a, b in itertools.pairwise(names):
            conv, bn = parent._modules[a], parent._modules[b]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                parent._modules[a] = fuse_conv_bn_eval(conv, bn)
                parent._modules[b] = nn.Identity()


def _fold_layer_scale(module: nn.Module) -> None:
    """``ls(proj(x))`` -> ``proj'(x)`` with the per-channel scale in proj's rows (under no_grad)."""
    for blk in module.modules():
        if not isinstance(blk, Block):
            continue
        for ls_name, lin in (("ls1", blk.attn.proj), ("ls2", blk.mlp.fc2)):
            ls = getattr(blk, ls_name)
            if isinstance(ls, LayerScale):
                lin.weight.mul_(ls.gamma[:, None])
                if lin.bias is not None:
                    lin.bias.mul_(ls.gamma)
                setattr(blk, ls_name, nn.Identity())


class FrozenCompiled(nn.Module):
    """``torch.compile(model)`` run with Inductor's freezing on, under ``no_grad``.

    ``torch.compile(options={"freezing": True})`` does not freeze on its own: Dynamo decides
    whether parameters become graph constants from the global ``torch._inductor.config``
    while it traces (``torch._dynamo.utils.is_parameter_freezing``), so with the option alone
    the weights stay graph inputs, nothing is folded or pre-packed. Here every call (and so
    every trace and recompile) sees freezing on, without changing the flag for the rest of
    the process. ``_orig_mod`` is the model, as on torch's compiled wrapper.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._orig_mod = model
        # not a submodule: the model is registered once, as _orig_mod
        self.__dict__["_compiled"] = torch.compile(model, dynamic=False)

    def __getattr__(self, name: str) -> object:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_orig_mod":
                raise
            return getattr(self._orig_mod, name)  # the model's attributes (num_classes...)

    def forward(self, *args: object, **kwargs: object) -> object:
        with torch._inductor.config.patch(freezing=True), torch.no_grad():
            return self._compiled(*args, **kwargs)


@torch.no_grad()
def optimize_for_inference(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    compile: bool = False,
    pack_weights: bool = True,
) -> nn.Module:
    """Fold and freeze ``model`` for inference (in place); see the module docstring.

    The result must not be trained further: folded BatchNorm, frozen biases and the weights
    packed for a compiled graph no longer follow parameter updates. With ``compile`` the
    return value is a :class:`FrozenCompiled` wrapper around the (still folded in place)
    model; it runs without autograd.
    ``dtype`` takes a floating ``torch.dtype`` or a name such as ``"bf16"``; inputs must then
    come in that dtype (or run under autocast). ``pack_weights``: Linear layers moved to
    oneDNN keep their weight in its blocked layout too (eager and compiled CPU inference),
    which is faster and costs a second copy of those weights; ``False`` keeps one copy.
    """
    if not isinstance(model, nn.Module):
        raise InputTypeError(
            f"optimize_for_inference: model must be a torch.nn.Module, got {type(model).__name__}"
            " (build one with vision_tfm.create_model)"
        )
    if dtype is not None:
        dtype = _weight_dtype(dtype)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    _fold_conv_bn(model)
    _fold_layer_scale(model)
    set_fused_attn(model, True)
    use_planned_attention(model)
    for m in model.modules():
        if hasattr(m, "freeze_bias"):
            m.freeze_bias()
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    if dtype is not None:
        model.to(dtype)  # frozen biases are buffers: cast with the weights
        if dtype == torch.bfloat16 and on_cpu:
            warn_if_bf16_emulated("leave dtype at fp32 (None)")
    fp32_swap = on_cpu and dtype in (None, torch.float32) and onednn_linear_pays()
    bf16_swap = on_cpu and dtype == torch.bfloat16 and not compile and cpu_native_bf16()
    if fp32_swap or bf16_swap:
        # frozen_graph: Inductor packs the weights, and for the BLAS unless told otherwise
        use_onednn_linears(model, frozen_graph=compile, pack=pack_weights)
        if not compile:  # Inductor fuses the GELU itself
            fuse_mlp_gelu(model)
    if compile:
        # dynamic=False: one graph per input shape, each specialised (window masks, position
        # tables and padding become constants); a new shape recompiles.
        return FrozenCompiled(model)
    return model

"""Attention layers that run the kernels :func:`~.cpu.attention_plan` picks, swapped in.

:class:`PlannedAttention` is a :class:`~vision_tfm.layers.Attention` (any subclass of it,
Swin's window attention included) whose softmax core asks the plan, per call, for SDPA or
the explicit path, and runs the explicit path with its eager-mode kernel tweaks
(:func:`scaled_scores`, contiguous q/k/v). :func:`use_planned_attention` gives a model's
layers that core in place by changing their class only, so parameters, buffers and
state-dict keys stay as they are. ``optimize_for_inference`` and :func:`prepare_for_training`
(which the training engine calls) apply it; a model built by ``create_model`` alone runs the
plain core.
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.attention import Attention, explicit_attention, sdpa_attention
from ..layers.cache import tracing
from .cpu import attention_plan

__all__ = [
    "PlannedAttention",
    "planned_explicit_attention",
    "prepare_for_training",
    "scaled_scores",
    "use_planned_attention",
]


def scaled_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``q kᵀ · scale``, ``(..., h, N, M)``. In eager mode the scale is the GEMM's ``alpha``
    (``baddbmm``, the input ignored at ``beta=0``), which saves a pass over ``q``; a captured
    graph (compile, export) gets the plain product, which its compiler fuses or exports, and
    so does a ``q`` that autocast would cast (it would cast the ignored input in full too)."""
    device = q.device.type
    if (
        tracing()
        or q.shape[:-2] != k.shape[:-2]
        or (torch.is_autocast_enabled(device) and q.dtype != torch.get_autocast_dtype(device))
    ):
        return (q * scale) @ k.transpose(-2, -1)
    q3, k3 = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:])  # (B', N, d), (B', M, d)
    ignored = q3.new_empty(()).expand(q3.shape[0], q3.shape[1], k3.shape[1])
    out = torch.baddbmm(ignored, q3, k3.transpose(1, 2), beta=0.0, alpha=scale)
    return out.view(*q.shape[:-1], k.shape[-2])


def planned_explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
    scale: float,
    dropout_p: float = 0.0,
    upcast: bool = False,
    contiguous: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layers' explicit path (:func:`~vision_tfm.layers.attention.explicit_attention`)
    with the scores from :func:`scaled_scores`; ``upcast`` and ``contiguous`` as in
    :class:`~.cpu.AttentionPlan`."""
    if contiguous:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    logits = scaled_scores(q, k, scale)  # (..., h, N, M)
    return explicit_attention(q, k, v, bias, mask, scale, dropout_p, upcast, logits)


class PlannedAttention(Attention):
    """:class:`~vision_tfm.layers.Attention` whose softmax core runs the path
    :func:`~.cpu.attention_plan` picks per call; linear attention is unchanged. Made by
    :func:`use_planned_attention`, not built directly."""

    _plain: type[Attention] = Attention  # the class it plans; pickles and copies name it

    def core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.feature_map is not None:
            return super().core(q, k, v, bias, mask, need_weights)
        plan = attention_plan(q, bias is not None, need_weights or not self.fused)
        dropout_p = self.attn_drop.p if self.training else 0.0
        if plan.fused:
            return sdpa_attention(q, k, v, bias, mask, self.scale, dropout_p), None
        return planned_explicit_attention(
            q, k, v, bias, mask, self.scale, dropout_p, plan.upcast, plan.contiguous
        )

    def __reduce_ex__(self, protocol: int) -> tuple:
        # a planned subclass made at run time has no importable name: rebuild it from the class
        # it plans, which has one
        return _new_planned, (self._plain,), self.__getstate__()


_PLANNED: dict[type[Attention], type[PlannedAttention]] = {Attention: PlannedAttention}


def planned_class(cls: type[Attention]) -> type[PlannedAttention]:
    """The planned twin of an :class:`Attention` class (made once per class): the plan's core,
    ``cls``'s everything else (Swin's relative position bias, for one)."""
    if issubclass(cls, PlannedAttention):
        return cls
    if cls not in _PLANNED:
        body = {"_plain": cls, "__module__": __name__, "__doc__": PlannedAttention.__doc__}
        _PLANNED[cls] = type(f"Planned{cls.__name__}", (PlannedAttention, cls), body)
    return _PLANNED[cls]


def _new_planned(cls: type[Attention]) -> PlannedAttention:
    """An empty planned ``cls`` for pickle and ``copy`` to fill with the saved state."""
    planned = planned_class(cls)
    return planned.__new__(planned)


def use_planned_attention(model: nn.Module) -> int:
    """Give every softmax :class:`~vision_tfm.layers.Attention` of ``model`` the planned core
    (in place: the same modules, parameters and state-dict keys, only their class changes);
    returns how many changed."""
    swapped = 0
    for m in model.modules():
        plain = isinstance(m, Attention) and not isinstance(m, PlannedAttention)
        if plain and m.feature_map is None:  # linear attention has no softmax to plan
            m.__class__ = planned_class(type(m))
            swapped += 1
    return swapped


def prepare_for_training(model: nn.Module) -> nn.Module:
    """``model`` (in place) with this machine's training kernels: every softmax attention
    layer runs the path :func:`~.cpu.attention_plan` picks per call (the explicit one for bf16
    on a CPU with native bf16 and for Swin windows, with contiguous q/k/v in eager mode; SDPA
    elsewhere). Results, parameters and state-dict keys are unchanged. The training engine
    calls it once, after moving the model to its device."""
    use_planned_attention(model)
    return model

"""Pictures of a model and its run: attention rollout (Abnar & Zuidema 2020), where a ViT looks,
as a heat map over the image; training curves and the confusion matrix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError, InputError
from .layers import Attention

__all__ = ["attention_rollout", "save_heatmap_overlay"]


@torch.no_grad()
def attention_rollout(
    model: nn.Module, x: torch.Tensor, discard_ratio: float = 0.0
) -> torch.Tensor:
    """Relevance of each patch to the prediction, ``(B, gh, gw)`` in [0, 1].

    Each layer's head-averaged attention is mixed with the identity (the residual path),
    row-normalised, and the layers are multiplied in order. The class-token row gives the
    map; models without a class token use the mean over all query rows.
    """
    if not (isinstance(discard_ratio, (int, float)) and 0 <= discard_ratio < 1):  # 1: no links
        raise ConfigError(f"discard ratio must be in [0, 1), got {discard_ratio!r}")
    if not hasattr(model, "blocks") or not hasattr(model, "embed"):
        raise InputError(f"attention rollout needs a ViT, got {type(model).__name__}")
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    for a in attns:
        a.store_attn, a.last_attn = True, None
    try:
        model.eval()(x)
        _, _, (gh, gw) = model.embed(x)
        maps = [a.last_attn for a in attns]
    finally:
        for a in attns:
            a.store_attn, a.last_attn = False, None
    B, _, N, _ = maps[0].shape
    eye = torch.eye(N, device=x.device)
    roll = eye.expand(B, N, N)
    for att in maps:
        a = att.mean(dim=1)  # (B, N, N), mean over heads
        if discard_ratio > 0:  # drop the weakest links, keep the diagonal
            flat = a.flatten(1)
            k = int(flat.shape[1] * discard_ratio)
            idx = flat.topk(k, dim=1, largest=False).indices
            flat.scatter_(1, idx, 0)
            a = flat.view(B, N, N)
        a = 0.5 * a + 0.5 * eye
        a = a / a.sum(dim=-1, keepdim=True)
        roll = a @ roll
    p = model.num_prefix_tokens
    rel = roll[:, 0, p:] if p else roll.mean(dim=1)  # (B, gh*gw)
    rel = rel.reshape(B, gh, gw)
    lo, hi = rel.amin((1, 2), keepdim=True), rel.amax((1, 2), keepdim=True)
    return (rel - lo) / (hi - lo).clamp_min(1e-12)


def save_heatmap_overlay(image: np.ndarray, heat: torch.Tensor, path: str | Path) -> None:
    """Blend a ``(gh, gw)`` heat map, upsampled bilinearly, over an HWC uint8 image."""
    plt = pyplot()
    h, w = image.shape[:2]
    up = F.interpolate(heat[None, None].float(), size=(h, w), mode="bilinear", align_corners=False)
    up = up[0, 0].cpu().numpy()
    fig, axes = plt.subplots(1, 2, figsize=(8, 4))
    shown = image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image
    for ax in axes:
        ax.imshow(shown, cmap="gray" if shown.ndim == 2 else None)
        ax.axis("off")
    axes[1].imshow(up, cmap="jet", alpha=0.5)
    axes[0].set_title("input")
    axes[1].set_title("attention rollout")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: writes files, needs no display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


LOSS_CURVES = {"train_loss": "train", "val_loss": "val", "ema_val_loss": "val (EMA)"}
"""The history columns drawn on the loss panel, with their legend labels."""


def plot_curves(history: Sequence[dict[str, Any]], path: Path, metric_keys: Sequence[str]) -> None:
    """Write :func:`curves_figure` as a PNG."""
    fig = curves_figure(history, metric_keys)
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def curves_figure(history: Sequence[dict[str, Any]], metric_keys: Sequence[str]) -> Any:
    """Train and validation loss (left; the latter where the task logs one) and validation
    metrics (right) per epoch, as a matplotlib figure."""
    plt = pyplot()
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for k, label in LOSS_CURVES.items():
        if all(k in h for h in history):
            a.plot(epochs, [h[k] for h in history], marker="o", label=label)
    a.set(xlabel="epoch", ylabel="loss", title="loss")
    a.legend()
    for k in metric_keys:
        if all(k in h for h in history):
            b.plot(epochs, [h[k] for h in history], marker="o", label=k)
    b.set(xlabel="epoch", ylabel="metric", title="validation")
    b.legend()
    b.grid(alpha=0.3)
    a.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_confusion(cm: np.ndarray, class_names: Sequence[str], path: Path) -> None:
    """Row-normalised confusion matrix (rows: true class) with counts in the cells."""
    plt = pyplot()
    n = len(class_names)
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    size = max(4.0, min(0.5 * n + 2, 20.0))
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        ax.set_xticks(range(n), class_names, rotation=90)
        ax.set_yticks(range(n), class_names)
        for i in range(n):
            for j in range(n):
                if cm[i, j]:
                    color = "white" if norm[i, j] > 0.5 else "black"
                    ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=7, color=color)
    ax.set(
        xlabel="predicted", ylabel="true", title=f"confusion (acc {np.trace(cm) / cm.sum():.4f})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""vtfm export / benchmark: parity on real val images, dynamic sizes, int8, the table, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from vision_tfm.cli import main
from vision_tfm.config import apply_overrides, config_to_dict
from vision_tfm.data.config import MNIST_MEAN, MNIST_STD
from vision_tfm.train import ClsConfig, atomic_save, build_cls_model
from vision_tfm.train.grasp import GraspConfig, build_grasp_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = {
    "vit_mnist": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
    "swin_mnist": {"embed_dim": 8, "depths": [2], "num_heads": [1], "window_size": 7},
    "grasp_hybrid_t": {
        "stem_chs": [8, 8, 8],
        "stem_depths": [0, 1, 1],
        "embed_dim": 16,
        "depth": 1,
        "num_heads": 2,
    },
}


def cls_checkpoint(path: Path, name: str, model_name: str | None = None) -> Path:
    """An untrained tiny classifier saved as a training checkpoint (parity needs no training)."""
    cfg = apply_overrides(ClsConfig(), {"model.name": name, "model.kwargs": TINY[name]})
    torch.manual_seed(0)
    model = build_cls_model(cfg.model, 10, 1, 28)
    meta = {
        "task": "cls",
        "model_name": model_name or name,
        "num_classes": 10,
        "in_chans": 1,
        "img_size": 28,
        "class_names": [str(i) for i in range(10)],
        "mean": list(MNIST_MEAN),
        "std": list(MNIST_STD),
    }
    ckpt = path / f"{name}.pt"
    atomic_save({"model": model.state_dict(), "config": config_to_dict(cfg), "meta": meta}, ckpt)
    return ckpt


def grasp_checkpoint(path: Path) -> Path:
    """A tiny RGB-D grasp model over the 3-view Cornell fixture at 32x32."""
    over = {
        "model.name": "grasp_hybrid_t",
        "model.kwargs": TINY["grasp_hybrid_t"],
        "data.root": str(FIXTURES / "cornell"),
        "data.output_size": 32,
        "data.train_frac": 0.67,
    }
    cfg = apply_overrides(GraspConfig(), over)
    torch.manual_seed(0)
    model = build_grasp_model(cfg)
    meta = {"task": "grasp", "model_name": "grasp_hybrid_t", "in_chans": 4, "input": "rgbd",
            "img_size": 32, "crop_size": 300, "width_scale": cfg.data.width_scale}
    ckpt = path / "grasp.pt"
    atomic_save({"model": model.state_dict(), "config": config_to_dict(cfg), "meta": meta}, ckpt)
    return ckpt

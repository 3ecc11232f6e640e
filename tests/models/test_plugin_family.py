"""A new family is its own file plus ``register_model``: no edit to the package.

``ToyViT`` below is such a file. It is registered, built by name, trained one step by the
training engine (layer decay through its ``group_matcher``, gradient checkpointing through
the base class) and exported to ONNX.
"""

from dataclasses import dataclass

import pytest
import torch
from conftest import raises_naming
from torch import nn

import vision_tfm as vt
from vision_tfm.config import ConfigError, apply_overrides
from vision_tfm.layers import PatchEmbed, block_stack, run_blocks
from vision_tfm.models import register_model
from vision_tfm.models._common import check_model_config
from vision_tfm.models.base import VisionModel
from vision_tfm.models.registry import _REGISTRY

# --- the family: what a new model file holds ------------------------------------------------


@dataclass(frozen=True)
class ToyConfig:
    img_size: int = 28
    in_chans: int = 1
    num_classes: int = 10
    embed_dim: int = 16
    depth: int = 2
    num_heads: int = 2
    patch_size: int = 7

    def __post_init__(self) -> None:  # its fields are all shared ones: _common's ranges
        check_model_config(self)


class ToyViT(VisionModel):
    """Patchify, Transformer blocks, mean-pool, linear."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.cfg, self.in_chans, self.num_classes = cfg, cfg.in_chans, cfg.num_classes
        self.num_features = D = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, D)
        self.blocks = block_stack(cfg.depth, dim=D, num_heads=cfg.num_heads)
        self.head = nn.Linear(D, cfg.num_classes)
        self.feature_info = [{"module": "blocks", "num_chs": D, "reduction": cfg.patch_size}]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(1, 2)  # (B, N, D)
        return run_blocks(self.blocks, x, grad_ckpt=self.grad_checkpointing)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x).mean(1))

    def group_matcher(self, coarse: bool = False) -> dict:
        return {"stem": r"^patch_embed", "blocks": [(r"^blocks\.(\d+)", None)]}


# --- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def toy():
    register_model("toy_vit", ToyViT, ToyConfig())
    yield
    del _REGISTRY["toy_vit"]  # keep other modules' registry-wide tests to the package's names


def test_registered_built_by_name_and_checked():
    assert "toy_vit" in vt.list_models("toy*")
    m = vt.create_model("toy_vit", num_classes=3)
    assert m(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    assert m.pretrained_cfg["input_size"] == (1, 28, 28) and m.get_classifier() is m.head
    with raises_naming(ConfigError, "depth", 0):  # its config checks itself
        vt.create_model("toy_vit", depth=0)
    with raises_naming(ValueError, "toy_vit"):  # no detection backbone for this family
        vt.create_backbone("toy_vit")


def test_trained_one_step_by_the_engine_with_layer_decay_and_checkpointing(tmp_path):
    from vision_tfm.tasks import ClassificationTask, ClsConfig
    from vision_tfm.train import Trainer

    cfg = apply_overrides(
        ClsConfig(),
        {
            "model.name": "toy_vit",
            "model.grad_checkpointing": True,
            "optim.layer_decay": 0.5,
            "data.train_subset": 64,
            "data.batch_size": 64,
            "sched.epochs": 1,
            "run.out_dir": str(tmp_path),
            "run.tensorboard": False,
            "run.plots": False,
        },
    )
    trainer = Trainer(cfg, ClassificationTask(cfg))
    metrics = trainer.fit()
    assert trainer.model.grad_checkpointing and 0.0 <= metrics["top1"] <= 1.0
    scales = sorted({g["lr_scale"] for g in trainer.optimizer.param_groups})
    assert scales == [0.125, 0.25, 0.5, 1.0]  # stem, block 0, block 1, head
    assert (trainer.run_dir / "last.pt").is_file()


def test_exported_to_onnx(tmp_path):
    from vision_tfm.export.onnx import export_onnx, ort_runner, ort_session

    m = vt.create_model("toy_vit").eval()
    x = torch.randn(2, 1, 28, 28)
    export_onnx(m, x, tmp_path / "toy.onnx", output_names=["logits"])
    (got,) = ort_runner(ort_session(tmp_path / "toy.onnx"))(x)
    with torch.no_grad():
        assert (got - m(x)).abs().max().item() < 1e-4

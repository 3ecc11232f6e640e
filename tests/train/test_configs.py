"""Every shipped YAML recipe parses against the dataclasses; override rules hold."""

from pathlib import Path

import pytest
from conftest import raises_naming

from vision_tfm.config import ConfigError, apply_overrides, parse_cli_overrides
from vision_tfm.tasks import ClsConfig
from vision_tfm.tasks.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("cls/*.yaml")), ids=lambda p: p.name)
def test_cls_recipes_load_and_document_themselves(path):
    cfg = load_config(ClsConfig(), path, {})
    head = path.read_text().splitlines()[:3]
    assert head[0].startswith("# ") and "train_cls.py" in "\n".join(head), (
        "recipe must open with its command"
    )
    assert cfg.model.name


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("grasp/*.yaml")), ids=lambda p: p.name)
def test_grasp_recipes_load(path):
    from vision_tfm.tasks.grasp import GraspConfig

    cfg = load_config(GraspConfig(), path, {})
    assert "train_grasp.py" in path.read_text().splitlines()[0]
    assert cfg.model.name.startswith("grasp_")


def test_imagenet_recipes_match_published_numbers():
    vit = load_config(ClsConfig(), CONFIGS / "cls/vit_s16_imagenet.yaml", {})
    swin = load_config(ClsConfig(), CONFIGS / "cls/swin_t_imagenet.yaml", {})
    for cfg, dp in ((vit, 0.1), (swin, 0.2)):
        assert (cfg.optim.opt, cfg.optim.lr, cfg.optim.lr_base_batch) == ("adamw", 5e-4, 512)
        assert (cfg.sched.epochs, cfg.sched.warmup_epochs) == (300, 20)
        assert (cfg.optim.weight_decay, cfg.optim.clip_grad) == (0.05, 5.0)
        assert cfg.aug.rand_augment.startswith("rand-m9")
        assert (cfg.aug.random_erasing, cfg.aug.mixup, cfg.aug.cutmix) == (0.25, 0.8, 1.0)
        assert cfg.aug.label_smoothing == 0.1 and cfg.model.kwargs["drop_path_rate"] == dp


def test_override_typing_rules():
    cfg = apply_overrides(
        ClsConfig(),
        parse_cli_overrides(
            ["optim.lr=1e-3", "sched.epochs=3", "aug.scale=[0.8, 1.2]", "model.kwargs.depth=2"]
        ),
    )
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.aug.scale == (0.8, 1.2) and cfg.model.kwargs == {"depth": 2}
    with raises_naming(ConfigError, "sched.epochs", "2.5"):
        apply_overrides(ClsConfig(), {"sched.epochs": 2.5})
    with raises_naming(ConfigError, "run.plots", "yes please"):
        apply_overrides(ClsConfig(), {"run.plots": "yes please"})
    with raises_naming(ConfigError, "aug.scale", 2, 3):  # expects 2 values, got 3
        apply_overrides(ClsConfig(), {"aug.scale": [1, 2, 3]})
    with raises_naming(ConfigError, "dat", "data"):  # the unknown key and the closest one
        apply_overrides(ClsConfig(), {"dat.name": "x"})
    with raises_naming(ConfigError, "optim.lr"):
        parse_cli_overrides(["optim.lr"])


def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1, 2\n")
    with raises_naming(ConfigError, bad):
        load_config(ClsConfig(), bad, {})
    bad.write_text("optim:\n  learning_rate: 1\n")
    with raises_naming(ConfigError, bad, "optim.learning_rate"):
        load_config(ClsConfig(), bad, {})
    with raises_naming(FileNotFoundError, tmp_path / "none.yaml"):
        load_config(ClsConfig(), tmp_path / "none.yaml", {})

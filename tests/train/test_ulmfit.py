"""ULMFiT fine-tuning (Howard & Ruder 2018): discriminative rates, slanted triangular learning
rates and gradual unfreezing, each checked against the paper's definition."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import vision_tfm as vt
from vision_tfm.config import apply_overrides
from vision_tfm.errors import ConfigError
from vision_tfm.io import load_checkpoint
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.config import OptimConfig, SchedConfig
from vision_tfm.train import Trainer, build_optimizer, build_scheduler
from vision_tfm.train.optim import group_ids

TINY = {
    "model.name": "vit_mnist",
    "model.kwargs": {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 7},
    "data.train_subset": 128,
    "data.batch_size": 64,
    "sched.epochs": 3,
    "run.tensorboard": False,
    "run.plots": False,
    "run.log_interval": 1000,
    "optim.unfreeze": 1,
}


def stlr(t: int, T: int, lr: float, cut_frac: float, ratio: float) -> float:
    """The paper's eq. 3, written out: cut = floor(T cut_frac); p = t / cut before the cut,
    else 1 - (t - cut) / (cut (1 / cut_frac - 1)); lr_t = lr (1 + p (ratio - 1)) / ratio."""
    cut = math.floor(T * cut_frac)
    p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
    return lr * (1 + p * (ratio - 1)) / ratio


def test_slanted_triangular_schedule_follows_the_papers_formula() -> None:
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, OptimConfig(weight_decay=0.0), lr=0.01)
    sched = build_scheduler(opt, SchedConfig(name="slanted_triangular", epochs=10), 20)
    T = 200  # 10 epochs of 20 updates
    for t in (0, 7, 20, 21, 150, 200):  # start, rise, peak, just past it, decay, end
        sched.step_update(num_updates=t)
        want = stlr(t, T, 0.01, 0.1, 32.0)
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12), t
    assert stlr(20, T, 0.01, 0.1, 32.0) == pytest.approx(0.01)  # the peak is the lr
    assert stlr(200, T, 0.01, 0.1, 32.0) == pytest.approx(0.01 / 32)  # and the floor


def test_discriminative_rates_are_2_6_apart_through_warmup_and_decay() -> None:
    model = vt.create_model("vit_test")
    o = OptimConfig(discriminative=2.6)
    opt = build_optimizer(model, o, lr=1e-3)
    sched = build_scheduler(opt, SchedConfig(epochs=4, warmup_epochs=1), 10)
    groups = len(set(group_ids(model).values()))
    assert groups == model.cfg.depth + 2  # embeddings, each block, the head
    for t in (0, 5, 10, 25, 39):  # in warmup and along the decay
        sched.step_update(num_updates=t)
        rates = sorted({g["lr"] for g in opt.param_groups if g["params"]}, reverse=True)
        assert len(rates) == groups
        for hi, lo in itertools.pairwise(rates):
            assert hi / lo == pytest.approx(2.6, rel=1e-9), t
    with pytest.raises(ConfigError, match=r"layer_decay.*discriminative"):
        OptimConfig(discriminative=2.6, layer_decay=0.75)


def _trainer(tmp_path, **kw) -> Trainer:
    cfg = apply_overrides(ClsConfig(), {**TINY, "run.out_dir": str(tmp_path), **kw})
    return Trainer(cfg, ClassificationTask(cfg))


def test_a_frozen_group_is_bit_identical_and_has_no_optimiser_state(tmp_path) -> None:
    trainer = _trainer(tmp_path, **{"sched.epochs": 2, "optim.unfreeze": 2})
    trainer._setup()
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    ids = group_ids(trainer.model)
    top = max(ids.values())
    trainer._fit()  # two epochs: only the head has trained
    after = trainer.model.state_dict()
    params = dict(trainer.model.named_parameters())
    for name in params:
        same = torch.equal(before[name], after[name])
        assert same == (ids[name] < top), f"{name} (group {ids[name]} of {top})"
    with_state = {id(p) for p in trainer.optimizer.state}
    assert all((id(p) in with_state) == (ids[n] == top) for n, p in params.items())
    assert all(p.requires_grad for p in params.values())  # everything trains again after


def test_resume_across_an_unfreeze_boundary_is_bit_identical(tmp_path) -> None:
    full = _trainer(tmp_path / "a")
    full.fit()
    part = _trainer(tmp_path / "b", **{"run.stop_after": 1})
    part.fit()
    last = part.run_dir / "last.pt"
    assert load_checkpoint(last)["state"]["epoch"] == 1  # stopped between two unfreezes
    cfg = apply_overrides(ClsConfig(), {**TINY, "run.out_dir": str(tmp_path / "b")})
    resumed = Trainer(cfg, ClassificationTask(cfg), resume=last)
    resumed.fit()
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"


def test_finetune_flag_starts_from_the_checkpoint_with_the_recipe(tmp_path) -> None:
    """``train_cls.py --finetune CKPT``: the checkpoint's architecture and weights, the ULMFiT
    recipe, and the user's own flags over both (``--epochs``)."""
    from pathlib import Path

    from vision_tfm.train.launch import base_parser, finetune_overrides, resolve_config

    root = Path(__file__).resolve().parents[2]
    src = _trainer(tmp_path / "src", **{"sched.epochs": 1, "optim.unfreeze": 0})
    src.fit()
    ckpt = src.run_dir / "last.pt"
    args = base_parser("t").parse_intermixed_args(["--epochs", "2", "data.train_subset=64"])
    extra = finetune_overrides(str(ckpt), root / "configs" / "cls" / "finetune.yaml")
    cfg = resolve_config(ClsConfig(), args, root / "configs" / "cls", "_mnist", extra,
                         task=ClassificationTask)  # fmt: skip
    assert cfg.model.pretrained == str(ckpt) and cfg.model.kwargs == TINY["model.kwargs"]
    assert cfg.optim.discriminative == 2.6 and cfg.optim.unfreeze == 1
    assert cfg.sched.name == "slanted_triangular" and cfg.sched.epochs == 2  # the flag wins
    model = ClassificationTask(cfg).build()[0]
    trained = src.model.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, trained[k]), k  # the checkpoint's weights, head included here

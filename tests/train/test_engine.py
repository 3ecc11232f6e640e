"""The training engine: exact resume, interrupts, NaN guard, run dirs, CLI errors, DDP."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vision_tfm.config import apply_overrides
from vision_tfm.train import ClassificationTask, ClsConfig, NonFiniteLossError, Trainer
from vision_tfm.train.checkpoint import atomic_save, load_checkpoint
from vision_tfm.train.classification import restore_cls_model
from vision_tfm.train.engine import make_run_dir

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "model.name": "vit_mnist",
    "model.kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
    "data.train_subset": 256,
    "data.batch_size": 64,
    "sched.epochs": 2,
    "sched.warmup_epochs": 0.5,
    "aug.mixup": 0.2,  # exercise timm Mixup + its RNG in the resume test
    "model.kwargs.drop_path_rate": 0.1,
    "run.tensorboard": False,
    "run.plots": False,
    "run.log_interval": 1000,
}
TINY_CLI = [
    "model.name=vit_mnist",
    "model.kwargs={embed_dim: 16, depth: 1, num_heads: 2, patch_size: 7}",
    "data.train_subset=128",
    "data.batch_size=64",
    "sched.epochs=1",
    "run.tensorboard=false",
]


def tiny_cfg(tmp_path, **kw) -> ClsConfig:
    return apply_overrides(ClsConfig(), {**TINY, "run.out_dir": str(tmp_path), **kw})


def run(cfg, resume=None):
    trainer = Trainer(cfg, ClassificationTask(cfg), resume=resume)
    metrics = trainer.fit()
    return trainer, metrics


def test_resume_at_epoch_boundary_is_bit_identical(tmp_path):
    full, _ = run(tiny_cfg(tmp_path / "a"))
    part, _ = run(tiny_cfg(tmp_path / "b", **{"run.stop_after": 1}))
    ck = load_checkpoint(part.run_dir / "last.pt")
    assert ck["state"]["epoch"] == 1
    resumed, _ = run(tiny_cfg(tmp_path / "b"), resume=part.run_dir / "last.pt")
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
    assert resumed.run_dir == part.run_dir  # continued in place
    rows = (part.run_dir / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch,train_loss,lr,top1,top5")


def test_checkpoint_contents_and_outputs(tmp_path, capsys):
    trainer, metrics = run(
        tiny_cfg(
            tmp_path,
            **{"sched.epochs": 1, "run.plots": True, "ema.enabled": True, "ema.decay": 0.9},
        )
    )
    d = trainer.run_dir
    assert d.parent == tmp_path and d.name.startswith("vit_mnist-")
    for f in ["last.pt", "best.pt", "config.yaml", "metrics.csv", "curves.png", "confusion.png"]:
        assert (d / f).is_file(), f
    ck = load_checkpoint(d / "last.pt")
    assert {"model", "optimizer", "scheduler", "ema", "scaler", "rng", "config", "meta"} <= set(ck)
    assert ck["meta"]["class_names"] == [str(i) for i in range(10)]
    assert 0.0 <= metrics["top1"] <= metrics["top5"] <= 1.0 and "ema_top1" in metrics
    # with EMA on, the EMA is the shipped model: its figure is printed and its weights load
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out == f"val top1: {metrics['ema_top1']:.4f}"
    assert ck["meta"]["weights"] == "ema" and ck["state"]["best"] == metrics["ema_top1"]
    ema = {k.removeprefix("module."): v for k, v in ck["ema"].items()}
    for use_ema, expect in ((None, ema), (True, ema), (False, ck["model"])):
        model, _ = restore_cls_model(ck, use_ema=use_ema)
        for k, v in model.state_dict().items():
            assert torch.equal(v, expect[k]), (use_ema, k)
    assert any(not torch.equal(ema[k], ck["model"][k]) for k in ema)  # they do differ


class _NanTask(ClassificationTask):
    def __init__(self, cfg, nan_at):
        super().__init__(cfg)
        self.calls, self.nan_at = 0, nan_at

    def loss(self, model, batch, device):
        self.calls += 1
        loss, n = super().loss(model, batch, device)
        return (loss * float("nan") if self.calls >= self.nan_at else loss), n


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, _NanTask(cfg, nan_at=6))  # 4 steps per epoch: NaN in epoch 2
    with pytest.raises(NonFiniteLossError, match="loss became nan at epoch 2") as e_info:
        trainer.fit()
    ck = load_checkpoint(trainer.run_dir / "last.pt")
    assert ck["state"]["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ck["model"].values())
    assert "last good checkpoint kept" in str(e_info.value)


def test_nan_loss_before_any_checkpoint_says_so(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, _NanTask(cfg, nan_at=2))
    with pytest.raises(
        NonFiniteLossError, match=r"step 2; stopping \(no checkpoint yet\)"
    ):
        trainer.fit()
    assert not (trainer.run_dir / "last.pt").exists()


def test_training_split_smaller_than_a_batch_is_refused(tmp_path):
    cfg = tiny_cfg(tmp_path, **{"data.train_subset": 10, "data.batch_size": 64})
    with pytest.raises(ValueError, match=r"training split has 10 images, fewer than one batch"):
        Trainer(cfg, ClassificationTask(cfg)).fit()
    assert not list(tmp_path.iterdir())  # no run dir left behind


class _InterruptTask(ClassificationTask):
    def loss(self, model, batch, device):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return super().loss(model, batch, device)


def test_sigint_writes_resumable_checkpoint(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, _InterruptTask(cfg))
    with pytest.raises(SystemExit) as e:
        trainer.fit()
    assert e.value.code == 130
    ck = load_checkpoint(trainer.run_dir / "last.pt")
    assert ck["state"]["epoch"] == 0 and ck["state"]["step_in_epoch"] == 2
    resumed, _ = run(cfg, resume=trainer.run_dir / "last.pt")
    assert resumed.state.epoch == 2 and resumed.state.num_updates == 8


def test_run_dirs_are_never_reused(tmp_path):
    a, b = make_run_dir(tmp_path, "m"), make_run_dir(tmp_path, "m")
    assert a != b and a.is_dir() and b.is_dir()


def test_atomic_save_keeps_previous_file_on_failure(tmp_path):
    p = tmp_path / "last.pt"
    atomic_save({"v": torch.ones(1)}, p)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_save({"v": Boom()}, p)
    assert torch.equal(torch.load(p, weights_only=True)["v"], torch.ones(1))
    assert [f.name for f in tmp_path.iterdir()] == ["last.pt"]


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "train_cls.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["optim.lrr=1"], "unknown config key 'optim.lrr'; did you mean optim.lr"),
        (["optim.lr=fast"], "config key 'optim.lr': expected a number, got 'fast'"),
        (["--data", "/nonexistent/dir"], "/nonexistent/dir"),
        (["--resume", "/nonexistent/last.pt"], "checkpoint not found: /nonexistent/last.pt"),
        (["--model", "vit_nope"], "unknown model name 'vit_nope'"),
    ],
)
def test_cli_bad_input_one_line(tmp_path, args, msg):
    r = _cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0], r.stderr
    assert not (tmp_path / "runs").exists()


def test_cli_train_eval_only_resume_mismatch_and_predict(tmp_path):
    r = _cli(*TINY_CLI, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("val top1: ")
    (run_dir,) = (tmp_path / "runs" / "cls").iterdir()
    ck = run_dir / "best.pt"
    r = _cli("--eval-only", "--resume", str(ck), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().startswith("val top1: "), r.stderr
    r = _cli("--resume", str(ck), "--model", "swin", cwd=tmp_path)
    assert r.returncode == 2 and "holds a 'vit_mnist' checkpoint" in r.stderr
    before = sorted(p.name for p in run_dir.iterdir())
    from PIL import Image

    from vision_tfm.data import load_mnist

    x, _ = load_mnist("val")
    Image.fromarray(x[0]).save(tmp_path / "digit.png")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vision_tfm.cli",
            "predict",
            str(tmp_path / "digit.png"),
            "--checkpoint",
            str(ck),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 5
    probs = [float(line.split()[1]) for line in lines]
    assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
    png = tmp_path / "att.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vision_tfm.cli",
            "attention",
            str(tmp_path / "digit.png"),
            "--checkpoint",
            str(ck),
            "--out",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and png.stat().st_size > 1000, out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written was touched


def test_ddp_two_cpu_processes(tmp_path):
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_port=29533",
    ]
    r = subprocess.run(
        [*torchrun, str(ROOT / "train_cls.py"), *TINY_CLI, "run.plots=false"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    dirs = list((tmp_path / "runs" / "cls").iterdir())
    assert len(dirs) == 1  # only rank 0 writes
    assert "x2" in r.stdout and r.stdout.count("val top1: ") == 1
    ck = load_checkpoint(dirs[0] / "last.pt")
    assert ck["state"]["num_updates"] == 1  # 128 images / (2 ranks x 64)

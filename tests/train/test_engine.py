"""The training engine: exact resume, interrupts, NaN guard, run dirs, CLI errors, DDP."""

import copy
import itertools
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_names, raises_naming
from timm.optim import create_optimizer_v2

from vision_tfm.config import ConfigError, apply_overrides
from vision_tfm.errors import CheckpointError
from vision_tfm.io import atomic_save, load_checkpoint
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.config import OptimConfig
from vision_tfm.train import Interrupted, NonFiniteLossError, Trainer, build_optimizer, make_run_dir
from vision_tfm.train.launch import base_parser, resolve_config

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


def test_bf16_training_warns_once_where_bf16_is_emulated(tmp_path, fake_cpu, caplog):
    fake_cpu("AVX2", False)
    run(
        tiny_cfg(
            tmp_path, **{"run.precision": "bf16", "run.stop_after": 1, "data.train_subset": 64}
        )
    )
    (record,) = [r for r in caplog.records if "emulated" in r.getMessage()]
    assert record.levelname == "WARNING" and "run.precision" in record.getMessage()


@pytest.mark.parametrize(
    ("device", "native", "want"),
    [("cpu", True, "bf16"), ("cpu", False, "fp32"), ("cuda", False, "amp")],
)
def test_auto_precision_never_picks_emulated_bf16(fake_cpu, device, native, want):
    from types import SimpleNamespace

    fake_cpu("AVX512" if native else "AVX2", native)
    cfg = ClsConfig()
    cfg.run.precision = "auto"
    trainer = SimpleNamespace(cfg=cfg, device=torch.device(device))
    assert Trainer.precision(trainer) == want


def _snapshot(d: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}


def test_resume_from_an_older_checkpoint_forks_a_new_run_dir(tmp_path, capsys):
    part, _ = run(tiny_cfg(tmp_path, **{"run.stop_after": 1}))
    a = part.run_dir
    (a / "epoch1.pt").write_bytes((a / "last.pt").read_bytes())  # an older state, e.g. best.pt
    run(tiny_cfg(tmp_path), resume=a / "last.pt")  # the newest state continues in place
    before = _snapshot(a)
    with raises_naming(ValueError, a / "last.pt", "sched.epochs"):
        run(tiny_cfg(tmp_path), resume=a / "last.pt")
    forked, _ = run(tiny_cfg(tmp_path), resume=a / "epoch1.pt")
    assert _snapshot(a) == before  # the old run is byte-for-byte untouched
    b = forked.run_dir
    assert b != a and b.parent == a.parent
    out = capsys.readouterr().out.splitlines()  # the fork is said: what was resumed, where to
    assert any(str(a / "epoch1.pt") in line and str(b) in line for line in out), out
    rows = (b / "metrics.csv").read_text().strip().splitlines()
    assert rows[0].startswith("epoch,") and [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    assert (b / "best.pt").is_file()  # epoch 1 was the best so far, or epoch 2 beat it
    old, new = load_checkpoint(a / "last.pt"), load_checkpoint(b / "last.pt")
    assert new["state"] == old["state"]  # same lineage, same place: exact resume
    for k, v in old["model"].items():
        assert torch.equal(v, new["model"][k]), k


def test_resume_with_more_epochs_follows_the_longer_schedule(tmp_path, capsys):
    """Resuming with a larger sched.epochs stretches the cosine, as a fresh run of that length
    would have it, instead of staying at min_lr after the old end."""
    full, _ = run(tiny_cfg(tmp_path / "a", **{"sched.epochs": 4}))
    part, _ = run(tiny_cfg(tmp_path / "b", **{"sched.epochs": 2, "run.stop_after": 1}))
    resumed, _ = run(tiny_cfg(tmp_path / "b", **{"sched.epochs": 4}), part.run_dir / "last.pt")
    (notice,) = [ln for ln in capsys.readouterr().out.splitlines() if "schedule" in ln]
    assert_names(notice, 8, 16)  # updates in the checkpoint's schedule, in the new one
    lrs = [row["lr"] for row in resumed.history]
    assert lrs[1:] == pytest.approx([row["lr"] for row in full.history][1:], rel=1e-9)
    assert lrs[1] > 10 * resumed.cfg.sched.min_lr  # not stuck at the old schedule's floor


def test_resuming_a_fine_tune_needs_not_the_weights_it_started_from(tmp_path):
    """The checkpoint holds the weights: resume on a machine where model.pretrained's file is
    gone (or its download unreachable) continues, and the saved config still names it."""
    start, _ = run(tiny_cfg(tmp_path / "start", **{"sched.epochs": 1}))
    weights = tmp_path / "start.pt"
    weights.write_bytes((start.run_dir / "last.pt").read_bytes())
    tuned = {"model.pretrained": str(weights)}
    part, _ = run(tiny_cfg(tmp_path / "tune", **tuned, **{"run.stop_after": 1}))
    weights.unlink()
    resumed, _ = run(tiny_cfg(tmp_path / "tune", **tuned), part.run_dir / "last.pt")
    assert resumed.run_dir == part.run_dir and [r["epoch"] for r in resumed.history] == [1, 2]
    ck = load_checkpoint(part.run_dir / "last.pt")
    assert ck["state"]["epoch"] == 2 and ck["config"]["model"]["pretrained"] == str(weights)
    with raises_naming(FileNotFoundError, weights):  # a fresh run still needs them
        run(tiny_cfg(tmp_path / "fresh", **tuned))


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
    assert {"model", "optimizer", "scheduler", "ema", "scaler", "config", "meta"} <= set(ck)
    assert ck["meta"]["class_names"] == [str(i) for i in range(10)]
    assert 0.0 <= metrics["top1"] <= metrics["top5"] <= 1.0 and "ema_top1" in metrics
    # with EMA on, the EMA is the shipped model: its figure is printed and its weights load
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out == f"val top1: {metrics['ema_top1']:.4f}"
    assert ck["meta"]["weights"] == "ema" and ck["state"]["best"] == metrics["ema_top1"]
    ema = {k.removeprefix("module."): v for k, v in ck["ema"].items()}
    for use_ema, expect in ((None, ema), (True, ema), (False, ck["model"])):
        model, _ = ClassificationTask.restore(ck, use_ema=use_ema)
        for k, v in model.state_dict().items():
            assert torch.equal(v, expect[k]), (use_ema, k)
    assert any(not torch.equal(ema[k], ck["model"][k]) for k in ema)  # they do differ
    del ck["ema"]  # a run without EMA: --ema is refused, not quietly served raw weights
    with raises_naming(CheckpointError, "ema"):
        ClassificationTask.restore(ck, use_ema=True)


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
    with raises_naming(NonFiniteLossError, "nan", "epoch 2") as e:
        trainer.fit()
    assert_names(str(e.value), trainer.run_dir / "last.pt")  # the checkpoint kept
    ck = load_checkpoint(trainer.run_dir / "last.pt")
    assert ck["state"]["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in ck["model"].values())


def test_nan_loss_before_any_checkpoint_says_so(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, _NanTask(cfg, nan_at=2))
    with raises_naming(NonFiniteLossError, "nan", "step 2") as e:
        trainer.fit()
    assert "last.pt" not in str(e.value)  # no checkpoint to point at yet
    assert not (trainer.run_dir / "last.pt").exists()


def test_training_split_smaller_than_a_batch_is_refused(tmp_path):
    cfg = tiny_cfg(tmp_path, **{"data.train_subset": 10, "data.batch_size": 64})
    with raises_naming(ValueError, 10, "data.batch_size"):  # 10 images, batches of 64
        Trainer(cfg, ClassificationTask(cfg)).fit()
    assert not list(tmp_path.iterdir())  # no run dir left behind


@pytest.mark.parametrize(
    ("key", "value", "also"),
    [
        ("data.batch_size", 0, ()),
        ("data.batch_size", -8, ()),
        ("sched.epochs", 0, ()),
        ("sched.epochs", -1, ()),
        ("optim.accum_steps", 0, ()),
        ("run.log_interval", 0, ()),
        ("run.precision", "fp8", ()),
        ("run.device", "gpu", ("cpu", "cuda")),  # the choices
        ("optim.opt", "adamz", ("adam",)),  # the closest timm optimizer
        ("model.name", "grasp_hybrid_t", ()),
    ],
)
def test_bad_settings_fail_before_a_run_dir(tmp_path, key, value, also):
    with raises_naming(ValueError, key, value, *also):
        cfg = tiny_cfg(tmp_path, **{key: value})
        Trainer(cfg, ClassificationTask(cfg)).fit()
    assert not list(tmp_path.iterdir())  # no run dir left behind


def test_load_checkpoint_says_what_the_file_is(tmp_path):
    cases = {
        "notes.txt": b"epoch 3: 97%\n",
        "empty.pt": b"",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    torch.save({"model": {}, "config": {}}, tmp_path / "no_meta.pt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # a whole pickled module
    atomic_save({"model": {}, "config": {}, "meta": {}}, tmp_path / "weights_only.pt")
    missing = {"no_meta.pt": ("meta",)}  # the keys a readable file lacks
    for name in ("notes.txt", "empty.pt", "no_meta.pt", "module.pt"):
        with raises_naming(CheckpointError, tmp_path / name, *missing.get(name, ())) as e:
            load_checkpoint(tmp_path / name)
        assert "weights_only" not in str(e.value), name  # never advise the unsafe load
    load_checkpoint(tmp_path / "weights_only.pt")  # enough for predict / export
    with raises_naming(CheckpointError, "optimizer", "scheduler", "scaler", "state"):
        load_checkpoint(tmp_path / "weights_only.pt", resume=True)
    with raises_naming(IsADirectoryError, tmp_path):
        load_checkpoint(tmp_path)


def _resolve(*argv, task=ClassificationTask):
    args = base_parser("test").parse_intermixed_args([str(a) for a in argv])
    return resolve_config(ClsConfig(), args, ROOT / "configs" / "cls", "_mnist", task=task)


def test_resume_refuses_flags_it_would_ignore_and_other_tasks(tmp_path):
    ck = tmp_path / "last.pt"
    with raises_naming(ValueError, "--eval-only", "--resume"):
        _resolve("--eval-only")
    with raises_naming(ValueError, "--config", "--resume"):
        _resolve("--resume", ck, "--config", tmp_path / "missing.yaml")
    with raises_naming(ValueError, "--out-dir", "--resume"):
        _resolve("--resume", ck, "--out-dir", tmp_path / "elsewhere")
    grasp = {"model": {}, "config": {"loss": {"maps": "mse"}}, "meta": {"task": "grasp"}}
    atomic_save(grasp, ck)
    with raises_naming(ValueError, ck, "train_grasp.py"):  # the script that trains it
        _resolve("--resume", ck, "--eval-only")
    atomic_save({**grasp, "meta": {"task": "cls"}}, ck)  # a stored config this code rejects
    with raises_naming(ConfigError, ck, "loss"):  # the key a classifier's config lacks
        _resolve("--resume", ck)
    atomic_save({**grasp, "config": {"optim": {"lr": 0.1}}, "meta": {"task": "cls"}}, ck)
    cfg = _resolve("--resume", ck, "optim.lr=0.2", "--epochs", 3, "sched.min_lr=0")
    assert (cfg.optim.lr, cfg.sched.epochs, cfg.sched.min_lr) == (0.2, 3, 0.0)  # any order


class _InterruptTask(ClassificationTask):
    def loss(self, model, batch, device):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return super().loss(model, batch, device)


def test_sigint_writes_resumable_checkpoint(tmp_path):
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, _InterruptTask(cfg))
    with pytest.raises(Interrupted):  # the launcher maps it to exit code 130
        trainer.fit()
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
    ("args", "names"),
    [
        (["optim.lrr=1"], ("optim.lrr", "optim.lr")),  # and the closest key
        (["optim.lr=fast"], ("optim.lr", "fast")),
        (["--data", "/nonexistent/dir"], ("/nonexistent/dir",)),
        (["--resume", "/nonexistent/last.pt"], ("/nonexistent/last.pt",)),
        (["--model", "vit_nope"], ("vit_nope",)),
        (["optim.lr=1", "--model", "vit_nope", "optim.lr=2"], ("vit_nope",)),
        (["--eval-only"], ("--eval-only", "--resume")),
        (["--epochs", "0"], ("sched.epochs", 0)),
        (["run.precision=fp8"], ("run.precision", "fp8")),
    ],
)
def test_cli_bad_input_one_line(tmp_path, monkeypatch, capsys, args, names):
    """In this process (``run_cli`` is what catches the error either way); the first case
    also runs as a child, so a real interpreter's stderr is held to the same line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train_cls.py", *args])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "train_cls.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.startswith("error: ")  # the scripts' one-line format, as the CLI's
    assert_names(err, *names)  # one line, naming the setting
    assert not (tmp_path / "runs").exists()
    if args == ["optim.lrr=1"]:
        r = _cli(*args, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr == err, r.stderr


def test_cli_train_eval_only_resume_mismatch_and_predict(tmp_path, capsys):
    r = _cli(*TINY_CLI, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("val top1: ")
    (run_dir,) = (tmp_path / "runs" / "cls").iterdir()
    ck = run_dir / "best.pt"
    r = _cli("--eval-only", "--resume", str(ck), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().startswith("val top1: "), r.stderr
    r = _cli("--resume", str(ck), "--model", "swin", cwd=tmp_path)
    assert r.returncode == 2
    assert_names(r.stderr, ck, "vit_mnist", "swin")  # what the checkpoint holds, what was asked
    before = sorted(p.name for p in run_dir.iterdir())
    from PIL import Image

    from vision_tfm.data import load_mnist

    x, _ = load_mnist("val")
    Image.fromarray(x[0]).save(tmp_path / "digit.png")
    from vision_tfm.cli import main

    main(["predict", str(tmp_path / "digit.png"), "--checkpoint", str(ck)])  # in-process
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5
    probs = [float(line.split()[1]) for line in lines]
    assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-6
    png = tmp_path / "att.png"
    main(["attention", str(tmp_path / "digit.png"), "--checkpoint", str(ck), "--out", str(png)])
    assert png.stat().st_size > 1000
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


@pytest.fixture(scope="module")
def digit_ckpt(tmp_path_factory):
    """A digit PNG and an untrained tiny vit_mnist checkpoint: enough to drive ``vtfm``."""
    from PIL import Image

    from vision_tfm.data import load_mnist
    from vision_tfm.models import create_model

    d = tmp_path_factory.mktemp("vtfm")
    Image.fromarray(load_mnist("val")[0][0]).save(d / "digit.png")
    kw = {"embed_dim": 16, "depth": 1, "num_heads": 2}
    meta = {"task": "cls", "num_classes": 10, "in_chans": 1, "img_size": 28}
    meta |= {"class_names": [str(i) for i in range(10)], "mean": [0.13], "std": [0.31]}
    ck = {
        "model": create_model("vit_mnist", **kw).state_dict(),
        "config": {"model": {"name": "vit_mnist", "kwargs": kw}},
        "meta": meta,
    }
    torch.save(ck, d / "ck.pt")
    return d / "digit.png", d / "ck.pt"


def vtfm(capsys, *args) -> tuple[int, str, str]:
    """Run ``vtfm`` in-process: (exit code, stdout, stderr)."""
    from vision_tfm.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["predict", "--topk", "-3"], ("--topk", -3)),
        (["predict", "--topk", "0"], ("--topk", 0)),
        (["attention", "--discard-ratio", "1.5"], (1.5,)),
        (["attention", "--discard-ratio", "-0.1"], (-0.1,)),
        (["attention", "--out", "att.jpg"], ("--out", "att.jpg", ".png")),
    ],
)
def test_vtfm_bad_flags_are_one_line_errors(digit_ckpt, tmp_path, capsys, args, names):
    digit, ck = digit_ckpt
    cmd, *flags = args
    flags = [str(tmp_path / f) if f.endswith(".jpg") else f for f in flags]
    code, out, err = vtfm(capsys, cmd, digit, "--checkpoint", ck, *flags)
    assert code == 2 and out == "", err
    assert_names(err, *names)
    assert list(tmp_path.iterdir()) == []


def test_vtfm_predict_topk_is_capped_at_the_class_count(digit_ckpt, capsys):
    digit, ck = digit_ckpt
    code, out, err = vtfm(capsys, "predict", digit, "--checkpoint", ck, "--topk", "50")
    assert code == 0, err
    assert len(out.strip().splitlines()) == 10


def test_a_fine_tuned_checkpoint_needs_not_the_weights_it_started_from(
    digit_ckpt, tmp_path, capsys
):
    """Its own weights replace model.pretrained's: predict and export on another machine,
    where that file is gone, must neither read it nor fail for it."""
    digit, ck = digit_ckpt
    start = tmp_path / "start.pt"
    tuned = torch.load(ck, weights_only=False)
    torch.save({"model": tuned["model"]}, start)
    tuned["config"] = {**tuned["config"], "model": {**tuned["config"]["model"]}}
    tuned["config"]["model"]["pretrained"] = str(start)
    tuned["model"] = {k: v + 0.01 for k, v in tuned["model"].items()}  # differs from start
    torch.save(tuned, tmp_path / "tuned.pt")
    start.unlink()
    model, cfg = ClassificationTask.restore(tuned)
    assert cfg.model.pretrained == str(start)  # the run's provenance is kept
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, tuned["model"][k], rtol=0, atol=0)
    code, out, err = vtfm(capsys, "predict", digit, "--checkpoint", tmp_path / "tuned.pt")
    assert code == 0 and len(out.strip().splitlines()) == 5, err


def test_vtfm_attention_out_names_the_file_it_writes(digit_ckpt, tmp_path, capsys):
    digit, ck = digit_ckpt
    base = ["attention", digit, "--checkpoint", ck, "--out"]
    code, out, err = vtfm(capsys, *base, tmp_path / "att")  # no extension: .png is added
    png = tmp_path / "att.png"
    assert code == 0 and out == f"wrote {png}\n", err
    before = png.read_bytes()
    code, out, err = vtfm(capsys, *base, tmp_path / "att")  # the final path exists
    assert code == 2
    assert_names(err, png, "--overwrite")
    assert png.read_bytes() == before
    # a missing input is the news, not the output that exists
    code, out, err = vtfm(
        capsys, "attention", digit, "--checkpoint", tmp_path / "no.pt", "--out", png
    )
    assert code == 2
    assert_names(err, tmp_path / "no.pt")
    code, out, err = vtfm(capsys, "attention", tmp_path / "no.png", *base[2:], png)
    assert code == 2
    assert_names(err, tmp_path / "no.png")
    folder = tmp_path / "adir"
    folder.mkdir()
    code, out, err = vtfm(capsys, *base, folder, "--overwrite")
    assert code == 2
    assert_names(err, "--out", folder)
    assert not (tmp_path / "adir.png").exists() and list(folder.iterdir()) == []
    deep = tmp_path / "nodir" / "sub" / "att.png"
    code, out, err = vtfm(capsys, *base, deep)
    assert code == 0 and out == f"wrote {deep}\n" and deep.stat().st_size > 1000, err


class _FaultTask(ClassificationTask):
    """Ctrl-C (SIGINT to itself) or a crash (as SIGKILL would leave things) at a given call;
    validates on the first two batches only, to keep the test short."""

    def __init__(self, cfg, at=0, fault=""):
        super().__init__(cfg)
        self.calls, self.at, self.fault = 0, at, fault

    def evaluate(self, model, loader, device):
        return super().evaluate(model, list(itertools.islice(loader, 2)), device)

    def loss(self, model, batch, device):
        self.calls += 1
        if self.calls == self.at:
            if self.fault == "crash":
                raise RuntimeError("killed")
            os.kill(os.getpid(), signal.SIGINT)
        return super().loss(model, batch, device)


def _without_times(path: Path) -> list[str]:
    """metrics.csv rows without the wall-clock columns."""
    rows = [line.split(",") for line in path.read_text().splitlines()]
    drop = {rows[0].index("epoch_time_s"), rows[0].index("img_per_s")}
    return [",".join(v for i, v in enumerate(r) if i not in drop) for r in rows]


def test_mid_epoch_stop_and_crash_resume_exactly_and_log_each_step_once(tmp_path):
    # one epoch of 10 batches in accumulation groups of 3, 3, 3 and a trailing 1
    kw = {"data.batch_size": 24, "optim.accum_steps": 3, "run.log_interval": 1}
    kw["sched.epochs"] = 1
    cfg = tiny_cfg(tmp_path / "a", **kw)
    full = Trainer(cfg, _FaultTask(cfg))
    full.fit()
    assert full.state.num_updates == 4  # the trailing micro-batch is stepped, not dropped
    cfg = tiny_cfg(tmp_path / "b", **kw)
    stopped = Trainer(cfg, _FaultTask(cfg, at=2, fault="sigint"))
    with pytest.raises(Interrupted):  # Ctrl-C on a micro-batch that is not its group's last
        stopped.fit()
    last = stopped.run_dir / "last.pt"
    state = load_checkpoint(last)["state"]
    assert (state["epoch"], state["step_in_epoch"], state["num_updates"]) == (0, 3, 1)
    assert state["loss_count"] == 3  # the partial epoch's losses travel with it
    elsewhere = tmp_path / "c" / "last.pt"  # stopped mid-epoch under another process count
    elsewhere.parent.mkdir()
    ck = load_checkpoint(last)
    atomic_save({**ck, "state": {**ck["state"], "world_size": 2}}, elsewhere)
    with raises_naming(ValueError, elsewhere, 2):  # resume it under 2 processes
        Trainer(cfg, ClassificationTask(cfg), resume=elsewhere).fit()
    assert sorted(p.name for p in elsewhere.parent.iterdir()) == ["last.pt"]
    crashed = Trainer(cfg, _FaultTask(cfg, at=5, fault="crash"), resume=last)
    with pytest.raises(RuntimeError, match="killed"):  # dies past update 2, as SIGKILL would
        crashed.fit()
    assert "\n2," in (stopped.run_dir / "steps.csv").read_text()  # a row past last.pt
    resumed = Trainer(cfg, _FaultTask(cfg), resume=last)
    resumed.fit()
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after a mid-epoch resume"
    assert _without_times(resumed.run_dir / "metrics.csv") == _without_times(
        full.run_dir / "metrics.csv"
    )  # train_loss averages all 10 steps, as uninterrupted
    steps = (resumed.run_dir / "steps.csv").read_text()
    assert steps == (full.run_dir / "steps.csv").read_text()  # no duplicate rows
    assert len(steps.splitlines()) == 1 + 4


def test_an_items_augmentation_depends_on_its_epoch_and_index_only():
    """Not on what was drawn before, nor on the DataLoader worker (which seeds itself)."""
    from torch.utils.data import DataLoader

    from vision_tfm.train.sampling import SeededItems as _SeededItems

    cfg = apply_overrides(ClsConfig(), {**TINY, "aug.random_erasing": 0.5})
    _, train, _, _ = ClassificationTask(cfg).build()
    items = _SeededItems(train, seed=3)
    keys = [(0, 5), (0, 7), (1, 5)]
    here = [items[k][0] for k in keys]
    assert not torch.equal(here[0], here[2])  # another epoch, another augmentation
    items[(0, 9)]
    assert torch.equal(items[(0, 5)][0], here[0])  # whatever was drawn in between
    loader = DataLoader(items, batch_size=None, sampler=keys, num_workers=1)
    for got, want in zip(loader, here):
        assert torch.equal(got[0], want)


def test_adamw_runs_fused_and_steps_as_the_per_parameter_loop_does():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)
    )
    twin = copy.deepcopy(model)
    o = OptimConfig(opt="adamw", lr=1e-2, weight_decay=0.05)
    fused = build_optimizer(model, o, o.lr)
    assert fused.defaults["fused"] is True
    loop = create_optimizer_v2(twin, opt="adamw", lr=o.lr, weight_decay=0.05, foreach=False)
    for step in range(5):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        for m, opt in ((model, fused), (twin, loop)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert not build_optimizer(model, OptimConfig(opt="sgd"), 0.1).defaults.get("fused")


def test_launcher_maps_an_interrupt_to_exit_130_and_errors_to_one_line(capsys):
    from vision_tfm.errors import ConfigError
    from vision_tfm.train.launch import run_cli

    def stopped() -> None:
        raise Interrupted("interrupted; resume with --resume x/last.pt")

    def bad() -> None:
        raise ConfigError("optim.lr must be > 0, got -1")

    with pytest.raises(SystemExit) as e:
        run_cli(stopped)
    assert e.value.code == 130
    with pytest.raises(SystemExit) as e:
        run_cli(bad)
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: optim.lr must be > 0, got -1\n"


def test_a_finished_run_leaves_no_loader_workers_alive(tmp_path):
    """Workers ignore SIGTERM, and at interpreter exit multiprocessing ends workers with
    SIGTERM and waits for them: a worker still alive when a run ends would hang its exit,
    however long the trainer itself is kept."""
    import multiprocessing

    cfg = tiny_cfg(tmp_path, **{"data.num_workers": 1, "sched.epochs": 1})
    trainer, _ = run(cfg)  # still referenced
    assert multiprocessing.active_children() == []
    Trainer(cfg, ClassificationTask(cfg), resume=trainer.run_dir / "best.pt").fit(eval_only=True)
    assert multiprocessing.active_children() == []

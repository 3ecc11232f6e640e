"""Safety and failure behaviour: settings, run dirs, locks, faults, hostile checkpoints."""

from __future__ import annotations

import dataclasses
import errno
import math
import os
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
import torch
from conftest import assert_names, raises_naming

from vision_tfm.config import ConfigError, apply_overrides, parse_cli_overrides
from vision_tfm.errors import CheckpointError, RunDirError
from vision_tfm.io import atomic_save, load_checkpoint
from vision_tfm.models import create_model, load_pretrained
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.grasp import GraspConfig
from vision_tfm.train import NonFiniteLossError, Trainer
from vision_tfm.train.rundir import LOCK_FILE, RUN_MARKER, RunLock

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "model.name": "vit_mnist",
    "model.kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
    "data.train_subset": 128,
    "data.batch_size": 64,
    "sched.epochs": 2,
    "run.tensorboard": False,
    "run.plots": False,
}
READ_ONLY = Path("/sys/vtfm_runs")  # sysfs refuses new files even to root (chmod does not)


def tiny_cfg(out: Path, **kw) -> ClsConfig:
    return apply_overrides(ClsConfig(), {**TINY, "run.out_dir": str(out), **kw})


def run(cfg: ClsConfig, resume: Path | None = None) -> Trainer:
    trainer = Trainer(cfg, ClassificationTask(cfg), resume=resume)
    trainer.fit()
    return trainer


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped after epoch 1 of 2: its last.pt is resumable."""
    out = tmp_path_factory.mktemp("runs")
    return run(tiny_cfg(out, **{"run.stop_after": 1})).run_dir


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and p.name != LOCK_FILE:
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


# ------------------------------------------------------------------------------ settings


ISSUE_SETTINGS = [
    ("optim.lr=inf", "optim.lr"),
    ("aug.rotate=nan", "aug.rotate"),
    ("ema.decay=2.0", "ema.decay"),
    ("optim.clip_grad=nan", "optim.clip_grad"),
    ("optim.layer_decay=5", "optim.layer_decay"),
    ("sched.min_lr=nan", "sched.min_lr"),
    ("aug.label_smoothing=2", "aug.label_smoothing"),
    ("aug.hflip=5", "aug.hflip"),
]


@pytest.mark.parametrize(("item", "key"), ISSUE_SETTINGS)
def test_settings_that_ruined_a_run_are_refused_naming_key_and_value(item, key) -> None:
    with raises_naming(ConfigError, key, item.split("=")[1]):
        apply_overrides(ClsConfig(), parse_cli_overrides([item]))


def test_grasp_width_scale_zero_is_refused() -> None:
    with raises_naming(ConfigError, "data.width_scale", 0):
        apply_overrides(GraspConfig(), parse_cli_overrides(["data.width_scale=0"]))


def _float_keys(cfg, prefix: str = "") -> list[str]:
    out = []
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += _float_keys(value, f"{prefix}{f.name}.")
        elif hints[f.name] is float or "float" in str(hints[f.name]):
            out.append(prefix + f.name)
    return out


@pytest.mark.parametrize("default", [ClsConfig(), GraspConfig()], ids=["cls", "grasp"])
def test_every_float_setting_refuses_nan_and_inf(default) -> None:
    keys = _float_keys(default)
    assert len(keys) > 15
    for key in keys:
        value = getattr(default, key.split(".")[0])
        for part in key.split(".")[1:]:
            value = getattr(value, part)
        for bad in (math.nan, math.inf, -math.inf):
            new = [bad] * max(len(value), 1) if isinstance(value, (tuple, list)) else bad
            with raises_naming(ConfigError, key):
                apply_overrides(default, {key: new})


def test_bad_yaml_in_an_override_names_the_key() -> None:
    with raises_naming(ConfigError, "model.kwargs"):
        parse_cli_overrides(["model.kwargs={embed_dim: [16"])


@pytest.mark.parametrize(
    ("script", "args", "key"),
    [
        ("train_cls.py", ["optim.lr=inf"], "optim.lr"),
    ],
)
def test_cli_refuses_bad_settings_in_one_line(tmp_path, script, args, key) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert_names(r.stderr, key)
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------ run dirs


def test_resume_in_a_user_folder_never_touches_its_files(stopped_run, tmp_path, capsys) -> None:
    user = _copy_run(stopped_run, tmp_path / "downloads")
    (user / RUN_MARKER).unlink()  # a folder the package did not make
    (user / "config.yaml").write_text("my own notes\n")
    precious = tmp_path / "precious.csv"
    precious.write_text("do not overwrite\n")
    (user / "metrics.csv").unlink()
    (user / "metrics.csv").symlink_to(precious)
    before = {p.name: p.read_bytes() for p in user.iterdir()}
    trainer = run(tiny_cfg(tmp_path / "runs"), resume=user / "last.pt")
    assert {p.name: p.read_bytes() for p in user.iterdir()} == before
    assert precious.read_text() == "do not overwrite\n"
    assert trainer.run_dir.parent == tmp_path / "runs" and (trainer.run_dir / "last.pt").is_file()
    assert str(user) in capsys.readouterr().out  # says why it left the folder alone


def test_resume_never_writes_through_a_symlink_in_its_run_dir(stopped_run, tmp_path) -> None:
    own = _copy_run(stopped_run, tmp_path / "runs" / "vit_mnist-x")
    precious = tmp_path / "precious.csv"
    precious.write_text("user data\n")
    (own / "steps.csv").unlink(missing_ok=True)
    (own / "steps.csv").symlink_to(precious)
    trainer = run(tiny_cfg(tmp_path / "runs"), resume=own / "last.pt")
    assert precious.read_text() == "user data\n" and trainer.run_dir != own


def test_resume_in_place_in_its_own_run_dir_and_clears_stale_temps(stopped_run, tmp_path) -> None:
    own = _copy_run(stopped_run, tmp_path / "runs" / "vit_mnist-x")
    stale = own / ".last.pt.k1ll3d.tmp"  # what a SIGKILL mid-save leaves
    stale.write_bytes(b"half a checkpoint")
    trainer = run(tiny_cfg(tmp_path / "runs"), resume=own / "last.pt")
    assert trainer.run_dir == own and not stale.exists()
    assert load_checkpoint(own / "last.pt")["state"]["epoch"] == 2


def test_a_second_resume_of_a_run_dir_in_use_names_the_pid(stopped_run, tmp_path) -> None:
    own = _copy_run(stopped_run, tmp_path / "runs" / "vit_mnist-x")
    before = (own / "metrics.csv").read_bytes()
    with RunLock(own), raises_naming(RunDirError, own, os.getpid()):  # the first resume runs
        run(tiny_cfg(tmp_path / "runs"), resume=own / "last.pt")
    assert (own / "metrics.csv").read_bytes() == before


def test_a_run_that_moved_on_while_we_loaded_is_not_overwritten(stopped_run, tmp_path) -> None:
    own = _copy_run(stopped_run, tmp_path / "runs" / "vit_mnist-x")
    cfg = tiny_cfg(tmp_path / "runs")
    trainer = Trainer(cfg, ClassificationTask(cfg), resume=own / "last.pt")
    trainer._setup()  # loaded; now another run writes a newer last.pt before we lock
    atomic_save(load_checkpoint(own / "last.pt"), own / "last.pt")
    newer = (own / "last.pt").read_bytes()
    try:
        trainer._fit()
    finally:
        trainer._dirs.release()
    assert trainer.run_dir != own and (own / "last.pt").read_bytes() == newer


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path) -> None:
    (tmp_path / LOCK_FILE).write_text("999999999\n")  # a PID file nobody holds a lock on
    with RunLock(tmp_path):
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    with RunLock(tmp_path), raises_naming(RunDirError, tmp_path, os.getpid()):
        RunLock(tmp_path).acquire()


def _need_read_only() -> None:
    try:
        tempfile.TemporaryFile(dir=READ_ONLY.parent).close()
    except OSError:
        return
    pytest.skip("no read-only folder here")


def test_read_only_out_dir_fails_up_front(tmp_path, monkeypatch) -> None:
    _need_read_only()
    built = []
    monkeypatch.setattr(ClassificationTask, "build", lambda self: built.append(1))
    cfg = tiny_cfg(READ_ONLY)
    with raises_naming(RunDirError, "run.out_dir", "/sys"):
        Trainer(cfg, ClassificationTask(cfg)).fit()
    assert not built


# ------------------------------------------------------------------------------ faults


def _enospc_after_half(obj, f, *a, **kw) -> None:
    f.write(b"PK partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _torch_write_failed(obj, f, *a, **kw) -> None:
    f.write(b"PK partial")
    raise RuntimeError(
        "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
        "data/0: file write failed"
    )


@pytest.mark.parametrize("fail", [_enospc_after_half, _torch_write_failed])
def test_full_disk_mid_checkpoint(tmp_path, monkeypatch, fail) -> None:
    path = tmp_path / "last.pt"
    atomic_save({"w": torch.ones(2)}, path)
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", fail)
    with raises_naming(RunDirError, path):
        atomic_save({"w": torch.zeros(2)}, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_non_finite_weights_are_never_written(tmp_path, monkeypatch) -> None:
    real = Trainer._evaluate

    def poison(self, loader=None):
        with torch.no_grad():
            next(self.model.parameters()).fill_(math.inf)  # a finite loss, broken weights
        return real(self, loader)

    monkeypatch.setattr(Trainer, "_evaluate", poison)
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, ClassificationTask(cfg))
    with pytest.raises(NonFiniteLossError) as e:
        trainer.fit()
    assert not (trainer.run_dir / "last.pt").exists()
    assert_names(str(e.value), next(name for name, _ in trainer.model.named_parameters()))
    assert "last.pt" not in str(e.value)  # no checkpoint to point at yet


# ------------------------------------------------------------------------------ checkpoints


def _ckpt(path: Path, **edit) -> Path:
    kw = {"embed_dim": 16, "depth": 1, "num_heads": 2}
    meta = {"task": "cls", "model_name": "vit_mnist", "num_classes": 10, "in_chans": 1}
    meta |= {"img_size": 28, "class_names": [str(i) for i in range(10)]}
    meta |= {"mean": [0.13], "std": [0.31]}
    ck = {
        "model": create_model("vit_mnist", **kw).state_dict(),
        "config": {"model": {"name": "vit_mnist", "kwargs": kw}},
        "meta": {**meta, **edit.pop("meta", {})},
        **edit,
    }
    torch.save(ck, path)
    return path


def _vtfm(capsys, *args) -> tuple[int, str]:
    from vision_tfm.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.fixture
def digit(tmp_path) -> Path:
    from PIL import Image

    Image.new("L", (28, 28), 128).save(tmp_path / "digit.png")
    return tmp_path / "digit.png"


def test_predict_refuses_nan_weights_naming_the_tensor(tmp_path, digit, capsys) -> None:
    path = _ckpt(tmp_path / "ck.pt")
    assert _vtfm(capsys, "predict", digit, "--checkpoint", path)[0] == 0
    ck = torch.load(path, weights_only=True)
    ck["model"]["blocks.0.attn.qkv.weight"][0, 0] = math.nan
    torch.save(ck, path)
    code, err = _vtfm(capsys, "predict", digit, "--checkpoint", path)
    assert code == 2
    assert_names(err, "blocks.0.attn.qkv.weight")


def test_load_pretrained_refuses_non_finite_tensors() -> None:
    model = create_model("vit_test")
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["pos_embed"][0, 0, 0] = math.inf
    with raises_naming(CheckpointError, "pos_embed"):
        load_pretrained(model, sd)


@pytest.mark.parametrize(
    ("meta", "key"),
    [
        ({"class_names": ["only one"]}, "class_names"),
        ({"in_chans": "x"}, "in_chans"),
        ({"img_size": -1}, "img_size"),
        ({"num_classes": None}, "num_classes"),
        ({"mean": []}, "mean"),
        ({"std": [0.0]}, "std"),
    ],
)
def test_edited_meta_is_a_one_line_error_naming_the_field(tmp_path, meta, key) -> None:
    from vision_tfm.export.source import load_source

    path = _ckpt(tmp_path / "ck.pt", meta=meta)
    with raises_naming(CheckpointError, path, key):
        load_source(path)  # what export and benchmark build on


def test_config_asking_for_a_huge_model_is_refused_before_allocating(tmp_path) -> None:
    path = _ckpt(tmp_path / "ck.pt")
    ck = torch.load(path, weights_only=True)
    ck["config"]["model"]["kwargs"]["embed_dim"] = 65536  # 51 G parameters if built
    with raises_naming(CheckpointError, "embed_dim", "GiB"):  # refused from the config alone
        ClassificationTask.restore(ck)
    ck["config"]["model"]["kwargs"]["embed_dim"] = 64  # fits in memory, not the weights
    with raises_naming(CheckpointError, 16, 64):  # the width saved, the width asked for
        ClassificationTask.restore(ck)


def test_resume_of_an_edited_config_is_refused_before_building(stopped_run, tmp_path) -> None:
    ck = torch.load(stopped_run / "last.pt", weights_only=True)
    ck["config"]["model"]["kwargs"]["embed_dim"] = 65536  # what --resume builds the model from
    own = _copy_run(stopped_run, tmp_path / "runs" / "vit_mnist-x")
    torch.save(ck, own / "last.pt")
    with raises_naming(CheckpointError, own / "last.pt", "embed_dim"):
        run(tiny_cfg(tmp_path / "runs", **{"model.kwargs.embed_dim": 65536}), own / "last.pt")


@pytest.mark.parametrize(("key", "value"), [("epoch", -5), ("num_updates", 10**18)])
def test_resume_of_an_edited_position_is_refused(stopped_run, tmp_path, key, value) -> None:
    ck = torch.load(stopped_run / "last.pt", weights_only=True)
    ck["state"][key] = value  # trained on from epoch -4 or logged steps from 10**18
    own = _copy_run(stopped_run, tmp_path / "runs" / "vit_mnist-x")
    torch.save(ck, own / "last.pt")
    with raises_naming(CheckpointError, own / "last.pt", f"state.{key}", value):
        run(tiny_cfg(tmp_path / "runs"), own / "last.pt")


@pytest.mark.parametrize("seconds", ["inf", "nan", "-1"])
def test_benchmark_refuses_unending_or_meaningless_seconds(tmp_path, capsys, seconds) -> None:
    path = _ckpt(tmp_path / "ck.pt")
    code, err = _vtfm(capsys, "benchmark", "--checkpoint", path, "--seconds", seconds)
    assert code == 2
    assert_names(err, "--seconds", seconds)


def test_benchmark_checks_its_output_folder_before_any_work(tmp_path, capsys, monkeypatch) -> None:
    _need_read_only()
    import vision_tfm.export as export

    monkeypatch.setattr(export, "benchmark_checkpoint", lambda *a, **k: pytest.fail("worked"))
    path = _ckpt(tmp_path / "ck.pt")
    code, err = _vtfm(capsys, "benchmark", "--checkpoint", path, "--out", READ_ONLY, "--quick")
    assert code == 2
    assert_names(err, "--out", "/sys")


def test_export_checks_its_output_folder_before_any_work(tmp_path, capsys, monkeypatch) -> None:
    _need_read_only()
    import vision_tfm.export.pipeline as pipeline

    monkeypatch.setattr(pipeline, "load_source", lambda *a, **k: pytest.fail("worked"))
    path = _ckpt(tmp_path / "ck.pt")
    code, err = _vtfm(capsys, "export", "--checkpoint", path, "--out", READ_ONLY / "m.onnx")
    assert code == 2
    assert_names(err, "--out", "/sys")

"""Preemption: SIGTERM / SIGUSR1 stop a run as Ctrl-C does, and ``--resume auto`` continues
the newest unfinished run of the same config, so relaunching one command after a kill ends
where an uninterrupted run ends."""

import contextlib
import io
import itertools
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import raises_naming

from vision_tfm.config import ConfigError, apply_overrides
from vision_tfm.io import load_checkpoint
from vision_tfm.tasks import ClassificationTask, ClsConfig
from vision_tfm.tasks.config import run_hash
from vision_tfm.train import Interrupted, Trainer
from vision_tfm.train.launch import base_parser, resolve_config, run_cli
from vision_tfm.train.rundir import LOCK_FILE, newest_unfinished
from vision_tfm.train.stops import STOP_SIGNALS, StopSignals

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "model.name": "vit_mnist",
    "model.kwargs": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
    "model.kwargs.drop_path_rate": 0.1,
    "data.train_subset": 240,
    "data.batch_size": 24,  # 10 micro-batches per epoch
    "optim.accum_steps": 3,  # updates of 3, 3, 3 and a trailing 1
    "sched.epochs": 2,
    "run.tensorboard": False,
    "run.plots": False,
    "run.log_interval": 1,
}


def tiny_cfg(out: Path, **kw) -> ClsConfig:
    return apply_overrides(ClsConfig(), {**TINY, "run.out_dir": str(out), **kw})


class _SignalTask(ClassificationTask):
    """Sends ``sig`` to its own process at the ``at``-th micro-batch (0: never); validates on
    two batches to keep the test short."""

    def __init__(self, cfg, at=0, sig=signal.SIGTERM):
        super().__init__(cfg)
        self.calls, self.at, self.sig = 0, at, sig

    def evaluate(self, model, loader, device):
        return super().evaluate(model, list(itertools.islice(loader, 2)), device)

    def loss(self, model, batch, device):
        self.calls += 1
        if self.calls == self.at:  # while stdout is redirected, as in torchmetrics' COCO eval
            with contextlib.redirect_stdout(io.StringIO()):
                os.kill(os.getpid(), self.sig)
        return super().loss(model, batch, device)


def _fit(cfg, task):
    trainer = Trainer(cfg, task)
    trainer.fit()
    return trainer


def test_every_stop_signal_is_caught_once_and_a_second_one_gives_up(capsys):
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1} <= set(STOP_SIGNALS)
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        with StopSignals() as stops:
            os.kill(os.getpid(), sig)
            assert stops.received == sig
            with pytest.raises(KeyboardInterrupt):  # a second one: stop at once
                os.kill(os.getpid(), signal.SIGTERM)
        assert capsys.readouterr().out == ""  # the handler only records; the loop says it
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before  # restored


def test_sigterm_mid_epoch_checkpoints_and_auto_resume_ends_bit_identical(tmp_path, capsys):
    sig = signal.SIGTERM
    full = _fit(tiny_cfg(tmp_path / "a"), _SignalTask(tiny_cfg(tmp_path / "a")))
    cfg = tiny_cfg(tmp_path / "b")
    stopped = Trainer(cfg, _SignalTask(cfg, at=15, sig=sig))  # epoch 2, inside its 2nd update
    with pytest.raises(Interrupted) as info:
        stopped.fit()
    assert info.value.signum == sig  # the launcher exits 128 + it
    run_dir = stopped.run_dir
    assert not (run_dir / LOCK_FILE).exists()  # released, and removed, after the checkpoint
    state = load_checkpoint(run_dir / "last.pt", resume=True)["state"]
    assert (state["epoch"], state["step_in_epoch"], state["num_updates"]) == (1, 6, 6)
    out = capsys.readouterr().out
    assert f"{sig.name}: finishing this update" in out and "checkpoint written" in out

    auto = tiny_cfg(tmp_path / "b", **{"run.resume": "auto"})  # the same command, relaunched
    resumed = _fit(auto, _SignalTask(auto))
    assert resumed.run_dir == run_dir  # continued in place
    assert f"resuming {run_dir} at epoch 2, update 6\n" in capsys.readouterr().out
    a, b = full.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after SIGTERM and --resume auto"
    assert resumed.history[-1]["train_loss"] == full.history[-1]["train_loss"]
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == [
        ".vision_tfm_run"
    ]  # no lock file left


def test_auto_resume_picks_the_newest_unfinished_run_of_the_same_config(tmp_path, capsys):
    out = tmp_path / "runs"
    quick = {"data.train_subset": 48, "optim.accum_steps": 1}  # 2 updates per epoch
    cfg = tiny_cfg(out, **quick, **{"run.stop_after": 1})
    older = _fit(cfg, _SignalTask(cfg)).run_dir
    newer = _fit(cfg, _SignalTask(cfg)).run_dir
    other = tiny_cfg(out, **quick, **{"run.stop_after": 1, "optim.lr": 5e-4})
    _fit(other, _SignalTask(other))  # newest of all, but another config
    os.utime(older / "last.pt", ns=(1, 1))  # order by last.pt, not by name
    same = run_hash(cfg)
    assert newest_unfinished(out, lambda c: run_hash(c) == same, 2) == newer / "last.pt"
    # launch keys (where, how far, whether to resume) do not make another run
    auto = tiny_cfg(out, **quick, **{"run.resume": "auto"})
    assert run_hash(auto) == same
    done = _fit(auto, _SignalTask(auto))
    assert done.run_dir == newer and done.state.epoch == 2
    capsys.readouterr()
    again = _fit(auto, _SignalTask(auto))  # newer is finished now: the older one is next
    assert again.run_dir == older
    assert f"resuming {older} at epoch 2, update 2" in capsys.readouterr().out
    fresh = _fit(auto, _SignalTask(auto))  # none left: a new run
    assert fresh.run_dir not in (older, newer) and fresh.state.epoch == 2
    assert "no unfinished run of this config" in capsys.readouterr().out


def _resolve(*argv):
    args = base_parser("t").parse_intermixed_args([str(a) for a in argv])
    return args, resolve_config(
        ClsConfig(), args, ROOT / "configs" / "cls", "_mnist", task=ClassificationTask
    )


def test_resume_auto_on_the_command_line(tmp_path):
    args, cfg = _resolve("--model", "vit", "--resume", "auto", "run.stop_after=2")
    assert args.resume is None  # no checkpoint for the trainer: it looks for one itself
    assert (cfg.run.resume, cfg.run.stop_after, cfg.aug.label_smoothing) == ("auto", 2, 0.1)
    recipe = ROOT / "configs" / "cls" / "vit_mnist.yaml"
    _, cfg = _resolve("--config", recipe, "--resume", "auto")  # a job's whole command
    assert cfg.run.resume == "auto"
    with raises_naming(ConfigError, "--eval-only", "--resume"):
        _resolve("--resume", "auto", "--eval-only")
    with raises_naming(ConfigError, "run.resume", "auto"):
        _resolve("run.resume=last")
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: (_ for _ in ()).throw(Interrupted("stopped", signal.SIGTERM)))
    assert e.value.code == 128 + signal.SIGTERM


def test_sigterm_to_the_process_group_stops_the_script_and_the_relaunch_finishes(
    tmp_path, monkeypatch, capsys
):
    """As ``timeout -s TERM`` does: the signal reaches the DataLoader worker too, which must
    leave it to the main process; exit 143 after the checkpoint, then the same command with
    ``--resume auto`` continues that run dir to the end."""
    cmd = [
        sys.executable,
        str(ROOT / "train_cls.py"),
        "model.name=vit_mnist",
        "model.kwargs={embed_dim: 16, depth: 1, num_heads: 2, patch_size: 7}",
        "data.train_subset=2048",
        "data.holdout=64",  # validates on 64 held-out images: a short evaluation
        "data.batch_size=8",
        "data.num_workers=1",
        "sched.epochs=1",
        "run.log_interval=1",
        "run.tensorboard=false",
        "run.plots=false",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "out.txt").open("w")
    p = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("runs/cls/*/steps.csv")):  # training has started
            assert p.poll() is None and time.monotonic() < deadline, (
                tmp_path / "out.txt"
            ).read_text()
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        log.close()
    out = (tmp_path / "out.txt").read_text()
    assert p.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "checkpoint written" in out and "Traceback" not in out, out[-3000:]
    (run_dir,) = tmp_path.glob("runs/cls/*")
    assert not (run_dir / LOCK_FILE).exists()
    monkeypatch.chdir(tmp_path)  # the relaunch, in this process (one start-up less)
    monkeypatch.setattr(sys, "argv", [*cmd[1:], "--resume", "auto"])
    runpy.run_path(cmd[1], run_name="__main__")  # run_cli exits only on a failure
    shown = capsys.readouterr().out
    assert f"resuming {run_dir.relative_to(tmp_path)} at epoch 1, update " in shown
    assert load_checkpoint(run_dir / "last.pt", resume=True)["state"]["epoch"] == 1
    assert list(tmp_path.glob("runs/cls/*")) == [run_dir]


def test_a_stop_signal_on_another_ddp_rank_stops_this_one_at_the_same_update(tmp_path, monkeypatch):
    """Under DDP every rank asks the others at each update, in one all-reduce of its flags
    (one per stop signal); here another rank's answer is stood in for: it got SIGTERM before
    the second update. This rank, which got none, stops there too, for the same signal."""
    from vision_tfm.train import engine

    asked, ours = [], engine.any_rank

    def with_another_rank(flags, device):
        asked.append(flags)
        theirs = [sig == signal.SIGTERM and len(asked) == 2 for sig in STOP_SIGNALS]
        return [a or b for a, b in zip(ours(flags, device), [*theirs, False])]

    monkeypatch.setattr(engine, "any_rank", with_another_rank)
    cfg = tiny_cfg(tmp_path)
    trainer = Trainer(cfg, _SignalTask(cfg))
    with pytest.raises(Interrupted) as info:
        trainer.fit()
    assert info.value.signum == signal.SIGTERM  # exit 143 here as on the rank that got it
    assert not any(any(flags[:-1]) for flags in asked)  # this rank raised no flag itself
    state = load_checkpoint(trainer.run_dir / "last.pt", resume=True)["state"]
    assert (state["epoch"], state["step_in_epoch"], state["num_updates"]) == (0, 6, 2)

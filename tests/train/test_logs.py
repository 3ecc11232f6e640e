"""What a run tells its user: no library warnings, counts of items rather than repeats, both
losses in curves.png, no lock file left, the version, and a config reference that matches
the dataclasses."""

import dataclasses
import logging
import runpy
import sys
from pathlib import Path

import pytest
import torch

from vision_tfm.models import create_model
from vision_tfm.tasks import TASKS
from vision_tfm.tasks.config import SchedConfig
from vision_tfm.tasks.reference import attribute_docs, render
from vision_tfm.train.engine import data_counts
from vision_tfm.train.optim import build_scheduler
from vision_tfm.train.rundir import LOCK_FILE, RunLock
from vision_tfm.version import __version__
from vision_tfm.viz import curves_figure

ROOT = Path(__file__).resolve().parents[2]


def test_a_one_update_cosine_builds_without_timms_warning(caplog):
    """Warmup over all but the last update (a one-epoch run): timm would warn that its
    cosine "will have no effect"; that is the schedule asked for."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with caplog.at_level(logging.WARNING):
        sched = build_scheduler(opt, SchedConfig(epochs=1, warmup_epochs=1, min_lr=1e-5), 4)
    assert caplog.records == []
    lrs = []
    for t in range(5):
        sched.step_update(t)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[3] == pytest.approx(0.1) and lrs[4] == pytest.approx(1e-5)  # peak, then min
    logging.getLogger("timm.scheduler.cosine_lr").warning("will have no effect")  # not muted
    assert len(caplog.records) == 1


def test_gradient_checkpointing_trains_without_torchs_fx_warning(capfd):
    once = getattr(torch.fx._symbolic_trace, "is_fx_tracing_warning", None)
    if once is not None:  # it warns once per process
        once.cache_clear()
    model = create_model("vit_mnist", embed_dim=16, depth=1, num_heads=2)
    model.set_grad_checkpointing()
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    assert "is_fx_tracing" not in capfd.readouterr().err
    torch.fx.symbolic_trace(model)  # fx still sees through the checkpointed blocks


class _Views:
    def __init__(self, n, repeat=1):
        self.n, self.repeat = n, repeat

    def __len__(self):
        return self.n * self.repeat


def test_the_run_line_counts_items_not_repeats():
    assert data_counts(_Views(56, repeat=8), _Views(14)) == "56 train (x8 per epoch) / 14 val"
    assert data_counts(list(range(8000)), list(range(2000))) == "8000 train / 2000 val"


def test_curves_show_train_and_val_loss():
    history = [
        {"epoch": e, "train_loss": 2.0 / e, "val_loss": 1.5 / e, "top1": 0.5 + e / 10}
        for e in (1, 2, 3)
    ]
    fig = curves_figure(history, ["top1", "top5"])
    loss, metrics = fig.axes
    assert [line.get_label() for line in loss.get_lines()] == ["train", "val"]
    assert list(loss.get_lines()[1].get_ydata()) == [1.5, 0.75, 0.5]
    assert [line.get_label() for line in metrics.get_lines()] == ["top1"]


def test_a_released_lock_leaves_no_file(tmp_path):
    lock = RunLock(tmp_path).acquire()
    assert (tmp_path / LOCK_FILE).read_text().strip().isdigit()
    lock.release()
    assert list(tmp_path.iterdir()) == []
    with RunLock(tmp_path):  # free to take again, and gone again after
        pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", ["vtfm", "train_cls.py", "train_grasp.py"])
def test_version_and_help_name_the_config_reference(script, monkeypatch, capsys):
    from vision_tfm.cli import main

    def run(*argv):
        monkeypatch.setattr(sys, "argv", [script, *argv])
        with pytest.raises(SystemExit) as e:
            main() if script == "vtfm" else runpy.run_path(str(ROOT / script), run_name="__main__")
        assert e.value.code == 0
        return capsys.readouterr().out

    assert run("--version") == f"vision_tfm {__version__}\n"
    assert "docs/config.md" in " ".join(run("--help").split())
    assert (ROOT / "docs" / "config.md").is_file()


def test_the_config_reference_is_up_to_date():
    assert (ROOT / "docs" / "config.md").read_text() == render(), (
        "docs/config.md is stale: run python -m vision_tfm.tasks.reference"
    )


def test_every_config_key_is_described():
    missing = []
    for task in TASKS.values():
        cfg = task.config_cls()
        for f in dataclasses.fields(cfg):
            section = type(getattr(cfg, f.name))
            docs = attribute_docs(section)
            missing += [
                f"{f.name}.{g.name}" for g in dataclasses.fields(section) if g.name not in docs
            ]
    assert not missing, f"give these an Attributes: entry in their dataclass: {missing}"

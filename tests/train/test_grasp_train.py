"""train_grasp.py on the committed Cornell fixtures: runs, checkpoints, predicts, fails cleanly."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_names, raises_naming

from vision_tfm.config import apply_overrides
from vision_tfm.data.grasp import CornellGrasp, crop_box, output_to_crop
from vision_tfm.grasp import MAP_KEYS, Grasp, decode_grasps, split_maps
from vision_tfm.io import load_checkpoint
from vision_tfm.models.convert import read_state_dict
from vision_tfm.tasks.grasp import GraspConfig, GraspMaps, GraspTask, predict_grasps
from vision_tfm.tasks.grasp.task import build_grasp_model, grasp_all_views
from vision_tfm.train import Trainer

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "cornell"
TINY = {
    "model.name": "grasp_hybrid_t",
    "data.root": str(FIX),
    "data.output_size": 64,
    "data.batch_size": 2,
    "sched.epochs": 1,
    "run.tensorboard": False,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("grasp")
    # per-view normalisation, so predict_grasps must follow the checkpoint's setting to agree
    # with validation (test_validation_and_predict_grasps_crop_alike)
    over = {**TINY, "data.normalise": "image", "run.out_dir": str(out)}
    cfg = apply_overrides(GraspConfig(), over)
    trainer = Trainer(cfg, GraspTask(cfg))
    metrics = trainer.fit()
    return trainer, metrics


def test_grasp_run_outputs(trained, capsys):
    trainer, metrics = trained
    assert 0.0 <= metrics["grasp_acc"] <= 1.0
    d = trainer.run_dir
    for f in [
        "last.pt",
        "best.pt",
        "config.yaml",
        "metrics.csv",
        "curves.png",
        "val_overlay_0.png",
    ]:
        assert (d / f).is_file(), f
    meta = load_checkpoint(d / "best.pt")["meta"]
    assert meta["task"] == "grasp" and meta["in_chans"] == 4 and "image-wise" in meta["split"]


def test_predict_grasps_maps_back_to_the_raw_view(trained):
    trainer, _ = trained
    grasps, img = predict_grasps(
        trainer.run_dir / "best.pt", FIX / "01" / "pcd0100r.png", FIX / "01" / "pcd0100d.tiff", 3
    )
    assert img.shape == (480, 640, 3)
    assert 1 <= len(grasps) <= 3 and all(isinstance(g, Grasp) for g in grasps)
    for g in grasps:  # inside the centre 300x300 crop, in raw-view pixels
        assert 170 - 1 <= g.x <= 470 and 90 - 1 <= g.y <= 390
        assert -np.pi / 2 <= g.angle < np.pi / 2 and g.opening >= 0
    with raises_naming(ValueError, "--depth"):
        predict_grasps(trainer.run_dir / "best.pt", FIX / "01" / "pcd0100r.png")


def test_validation_and_predict_grasps_crop_alike(trained):
    # the val item and predict_grasps see the same centre crop, so the model's maps agree and
    # the decoded grasps map back onto the raw view at the same place
    trainer, _ = trained
    val = trainer.val_ds
    view = val.views[0]
    x, _, _ = val[0]
    with torch.no_grad():
        maps = split_maps(GraspMaps(trainer.shipped_model.eval())(x[None]))
    ev = trainer.cfg.eval
    preds = decode_grasps(
        *(maps[k][0, 0] for k in MAP_KEYS), num_grasps=2, **ev.decode_kwargs(val.width_scale)
    )
    box = crop_box((480, 640), trainer.cfg.data.crop_size)  # the fixture views are 640x480
    ckpt = trainer.run_dir / "last.pt"
    grasps, _ = predict_grasps(ckpt, view.rgb_path, view.depth_path, 2)
    assert len(grasps) == len(preds) >= 1
    for g, p in zip(grasps, preds):
        ((x0, y0),) = output_to_crop(np.array([[p.x, p.y]], np.float32), box, val.output_size)
        assert (g.x, g.y, g.angle, g.quality) == pytest.approx((x0, y0, p.angle, p.quality), 1e-4)
    gt_x, _, _ = val.recropped("grasps")[0]
    assert not torch.equal(gt_x, x)  # the GG-CNN crop differs on this view: the test can fail


def test_eval_reports_both_crops_headline_last(trained):
    trainer, metrics = trained
    shipped = trainer.shipped_metrics(metrics)
    assert {"grasp_acc", "grasp_acc_gt_crop"} <= set(metrics)
    text = trainer.task.summary(shipped).splitlines()
    assert text[0].endswith(
        f"GG-CNN ground-truth-centred crop): {shipped['grasp_acc_gt_crop']:.2f}"
    )
    assert text[-1] == f"grasp acc (image-wise, top-1): {shipped['grasp_acc']:.2f}"
    assert "grasp_acc_gt_crop" in trainer.history[-1]  # logged every epoch (metrics.csv)


def test_eval_only_on_another_folder_prints_no_schedule_message(trained, tmp_path):
    trainer, _ = trained
    root = tmp_path / "other"
    shutil.copytree(FIX / "01", root / "01")
    (root / "01" / "pcd0102r.png").unlink()  # another folder: another epoch length
    r = _cli(
        "--eval-only",
        "--resume",
        str(trainer.run_dir / "last.pt"),
        f"data.root={root}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-1500:]
    lines = r.stdout.strip().splitlines()
    assert "schedule" not in r.stdout and len(lines) == 3, r.stdout
    assert lines[0].startswith(f"eval-only: every view of {root} (it trained on ")
    assert lines[-1].startswith("grasp acc (all 2 views, top-1): ")  # every view, counted


def _main(monkeypatch, capsys, *args):
    """train_grasp.py's main in this process (no interpreter start-up): its stdout lines."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["train_grasp.py", *args])
    runpy.run_path(str(ROOT / "train_grasp.py"), run_name="__main__")
    return capsys.readouterr().out.strip().splitlines()


SMALL = [
    "data.output_size=32",
    "data.batch_size=2",
    "sched.epochs=1",
    "run.plots=false",
    "model.kwargs.embed_dim=16",
    "model.kwargs.stem_chs=[4,8,8,16]",
]


def test_no_data_trains_on_generated_views_then_scores_and_seeds_real_ones(
    tmp_path, monkeypatch, capsys
):
    # the embedded default's path (--data synthetic:N: tiny here), the CI smoke test
    out = tmp_path / "runs"
    lines = _main(
        monkeypatch, capsys, "--data", "synthetic:10", "--model", "grasp_hybrid_t",
        "--out-dir", str(out), "data.repeat=1", *SMALL,
    )  # fmt: skip
    assert re.fullmatch(r"grasp acc \(synthetic, image-wise, top-1\): \d\.\d\d", lines[-1])
    (run,) = out.iterdir()
    ckpt = run / "best.pt"
    meta = load_checkpoint(ckpt)["meta"]
    assert meta["split"].startswith("synthetic image-wise") and len(meta["val_ids"]) == 2
    # a generated view saved as Cornell files is a view vtfm grasp takes
    from vision_tfm.data.grasp.synthetic import SceneSettings, generate_labelled, save_cornell

    rgb = save_cornell(generate_labelled(0, SceneSettings()), tmp_path / "gen", 0)
    grasps, img = predict_grasps(ckpt, rgb, rgb.with_name("pcd0000d.tiff"), 2)
    assert img.shape == (480, 640, 3) and 1 <= len(grasps) <= 2
    # scored zero-shot on a real folder: every view, counted on the line
    lines = _main(monkeypatch, capsys, "--eval-only", "--resume", str(ckpt), "--data", str(FIX))
    assert lines[0] == f"eval-only: every view of {FIX} (it trained on synthetic:10)"
    assert re.fullmatch(r"grasp acc \(all 3 views, top-1\): \d\.\d\d", lines[-1])
    # the same views from Python (benchmarks/grasp_failures.py --all-views): the folder is
    # read as Cornell although the checkpoint's config names generated scenes
    syn_cfg = apply_overrides(GraspConfig(), load_checkpoint(ckpt)["config"])
    assert syn_cfg.data.dataset == "synthetic"
    views = grasp_all_views(syn_cfg, FIX)
    assert isinstance(views, CornellGrasp) and len(views) == 3
    assert views[0][0].shape == (4, syn_cfg.data.output_size, syn_cfg.data.output_size)
    # the same data it trained on keeps the split, and says so
    lines = _main(monkeypatch, capsys, "--eval-only", "--resume", str(ckpt))
    assert lines[0].startswith("eval-only: the validation split of synthetic:10")
    assert lines[-1].startswith("grasp acc (synthetic, image-wise, top-1): ")
    # --init: a new run on real views that starts from the generated-scene weights
    lines = _main(
        monkeypatch, capsys, "--data", str(FIX), "--model", "grasp_hybrid_t", "--init",
        str(ckpt), "--out-dir", str(tmp_path / "ft"), *SMALL,
    )  # fmt: skip
    assert lines[-1].startswith("grasp acc (image-wise, top-1): ")
    (ft,) = (tmp_path / "ft").iterdir()
    cfg = load_checkpoint(ft / "last.pt")["config"]
    assert cfg["model"]["pretrained"] == str(ckpt) and cfg["data"]["dataset"] == "cornell"
    start = build_grasp_model(apply_overrides(GraspConfig(), cfg))  # the weights it began with
    shipped = read_state_dict(ckpt)  # the EMA weights the run shipped
    assert all(torch.equal(v, shipped[k]) for k, v in start.state_dict().items())


def test_folds_cli_end_to_end(tmp_path):
    r = _cli(
        "--data",
        str(FIX),
        "--model",
        "grasp_hybrid_t",
        "--folds",
        "3",
        "--out-dir",
        str(tmp_path / "cv"),
        "data.output_size=32",
        "data.batch_size=1",
        "sched.epochs=1",
        "run.plots=false",
        "model.kwargs.embed_dim=16",
        "model.kwargs.stem_chs=[4,8,8,16]",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-1500:]
    lines = r.stdout.strip().splitlines()
    assert re.fullmatch(r"grasp acc \(image-wise 3-fold, top-1\): \d\.\d\d ± \d\.\d\d", lines[-1])
    assert "GG-CNN ground-truth-centred crop" in lines[-2]
    (cv_dir,) = (tmp_path / "cv").iterdir()
    cv = json.loads((cv_dir / "cv.json").read_text())
    vals = [f["val_ids"] for f in cv["folds"]]
    assert sorted(i for v in vals for i in v) == ["pcd0100", "pcd0101", "pcd0102"]
    accs = [f["grasp_acc"] for f in cv["folds"]]
    assert cv["grasp_acc"]["mean"] == pytest.approx(np.mean(accs))
    assert all((cv_dir / f"fold{k}" / "last.pt").is_file() for k in (1, 2, 3))
    assert sum(ln.startswith("fold ") for ln in lines) == 3


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, str(ROOT / "train_grasp.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("setup", "args", "names"),
    [
        ("empty", [], ("views_root",)),  # the --data folder
        ("nodepth", ["--input", "rgbd"], ("pcd0100d.tiff", "rgbd")),
        ("small", ["data.crop_size=600"], ("pcd0100r.png", 600)),
        ("small", ["data.crop_size=600", "--input", "rgbd"], ("pcd0100r.png", 600)),
        ("badfile", [], ("pcd0100cpos.txt", 3)),  # 3 corner lines
        ("freetext", [], ("pcd0100cpos.txt:2", "abc def")),  # file:line and the bad field
        ("empty", ["--eval-only"], ("--eval-only", "--resume")),
        ("views", ["data.train_views=5"], ("train_views", "[1, 2]", 5)),  # 2 training views
    ],
)
def test_grasp_cli_bad_input(tmp_path, monkeypatch, capsys, setup, args, names):
    """In this process, as ``run_cli`` catches the error either way; the first case also
    runs as a child, whose real stderr must end in the same line."""
    root = tmp_path / "views_root"
    (root / "01").mkdir(parents=True)
    if setup != "empty":
        for ext in ("r.png", "cpos.txt") + (() if setup == "nodepth" else ("d.tiff",)):
            for i in (100, 101, 102):
                src = FIX / "01" / f"pcd0{i}{ext}"
                (root / "01" / src.name).write_bytes(src.read_bytes())
    if setup == "badfile":
        (root / "01" / "pcd0100cpos.txt").write_text("1 2\n3 4\n5 6\n")
    if setup == "freetext":  # only literal NaN rectangles are a known quirk to skip
        (root / "01" / "pcd0100cpos.txt").write_text("1 2\nabc def\n3 4\n5 6\n")
    argv = ["--data", str(root), "--model", "grasp_hybrid_t", *args, "data.output_size=64"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        _main(monkeypatch, capsys, *argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err[-1500:]
    last = err.strip().splitlines()[-1]  # warnings may come first
    assert_names(last, *names)
    assert not (tmp_path / "runs").exists()
    if setup == "empty" and not args:
        r = _cli(*argv, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == last, r.stderr[-1500:]


def test_vtfm_grasp_cli(trained, tmp_path):
    trainer, _ = trained
    view = FIX / "01" / "pcd0101"
    png = tmp_path / "g.png"  # --out g: the .png matplotlib adds is what is checked and printed
    args = [
        sys.executable,
        "-m",
        "vision_tfm.cli",
        "grasp",
        f"{view}r.png",
        "--depth",
        f"{view}d.tiff",
        "--checkpoint",
        str(trainer.run_dir / "best.pt"),
        "--top",
        "2",
        "--out",
        str(tmp_path / "g"),
    ]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split() == ["x", "y", "angle_deg", "opening", "jaw", "quality"]
    assert 2 <= len(lines) <= 4 and png.stat().st_size > 1000 and lines[-1] == f"wrote {png}"
    before = png.read_bytes()
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)  # refuses to overwrite
    assert r.returncode == 2
    assert_names(r.stderr, png, "--overwrite")
    assert png.read_bytes() == before
    for top in ("0", "-2"):  # used to print every grasp
        r = subprocess.run([*args, "--top", top], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2
        assert_names(r.stderr, "--top", top)


def test_quality_loss_is_bce_on_logits_unclamped():
    # a confident wrong logit (+50 where nothing is graspable) costs ~50; BCE on clamped
    # probabilities stopped at -log(1e-6) = 13.8 and gave it no gradient
    from torch import nn

    class Const(nn.Module):
        def __init__(self):
            super().__init__()
            self.z = nn.Parameter(torch.tensor(50.0))

        def forward(self, x):
            return {k: self.z.expand(x.shape[0], 1, 8, 8) for k in MAP_KEYS}

    cfg = apply_overrides(GraspConfig(), {"model.name": "grasp_hybrid_t"})
    model = Const()
    maps = {k: torch.zeros(2, 1, 8, 8) for k in MAP_KEYS}  # no graspable pixel: quality only
    loss, n = GraspTask(cfg).loss(model, (torch.zeros(2, 4, 8, 8), maps, []), torch.device("cpu"))
    loss.backward()
    assert n == 2 and loss.item() == pytest.approx(50.0, rel=1e-4)
    assert model.z.grad.item() == pytest.approx(1.0, rel=1e-4)  # d/dz mean BCE = sigmoid(z)


@pytest.mark.parametrize(("key", "value"), [("loss.maps", "l1"), ("loss.quality", "focal")])
def test_unknown_loss_names_are_one_line_errors(key, value):
    with raises_naming(ValueError, key, value):
        apply_overrides(GraspConfig(), {key: value})


@pytest.mark.parametrize(
    ("key", "value", "also"),
    [
        ("data.output_size", 0, ()),
        ("data.crop_size", -300, ()),
        ("eval.min_distance", -1, ()),
        ("eval.top_n", 0, ()),
        ("model.name", "vit_mnist", ("grasp_hybrid_t", "train_cls.py")),  # what to use instead
    ],
)
def test_bad_grasp_settings_fail_before_any_data_is_read(key, value, also):
    with raises_naming(ValueError, key, value, *also):
        GraspTask(apply_overrides(GraspConfig(), {key: value, "data.root": "/nonexistent"}))


def test_graspable_geometry_loss_reads_only_graspable_pixels():
    import torch

    q = torch.zeros(1, 1, 8, 8)
    q[..., 2:4, 2:4] = 1
    target = {"quality": q, "cos": q * 0.5, "sin": q * 0.2, "width": q * 0.3}

    def model_with_background(value):
        def model(x):
            out = {k: v.clone() for k, v in target.items()}
            for k in ("cos", "sin", "width"):
                out[k][q == 0] = value  # differs only where nothing is graspable
            out["quality"] = q * 0.9 + 0.05
            return out

        return model

    batch = (torch.zeros(1, 4, 8, 8), target, None)
    losses = {}
    for geometry in ("graspable", "all"):
        task = GraspTask(apply_overrides(GraspConfig(), {"loss.geometry": geometry}))
        losses[geometry] = [
            task.loss(model_with_background(v), batch, torch.device("cpu"))[0].item()
            for v in (0.0, 0.7)
        ]
    assert losses["graspable"][0] == pytest.approx(losses["graspable"][1])
    assert losses["all"][1] > losses["all"][0] + 1e-3


def _width_loss(space: str, opening: float, predicted: float) -> float:
    """The loss of a model whose maps are exact except the width on one graspable patch."""
    q = torch.zeros(1, 1, 8, 8)
    q[..., 2:4, 2:4] = 1
    target = {"quality": q, "cos": q * 0.5, "sin": q * 0.2, "width": q * opening}
    exact = {  # logits whose activations are the targets (quality far from 0.5 both ways)
        "quality": (q * 2 - 1) * 30,
        "cos": torch.atanh(target["cos"]),
        "sin": torch.atanh(target["sin"]),
        "width": torch.logit(torch.full_like(q, predicted)),
    }
    task = GraspTask(apply_overrides(GraspConfig(), {"loss.width_space": space}))
    batch = (torch.zeros(1, 4, 8, 8), target, None)
    return task.loss(lambda x: exact, batch, torch.device("cpu"))[0].item()


def test_log_width_loss_judges_an_opening_by_its_ratio():
    """The rectangle IoU fails a narrow grasp read 2x too wide as surely as a wide one: the
    log loss charges both the same; the linear one (smooth-L1, quadratic at these errors)
    charges the narrow grasp 16x less."""
    exact = _width_loss("log", 0.1, 0.1)
    assert exact == pytest.approx(_width_loss("log", 0.3, 0.3), abs=1e-6) and exact < 1e-6
    narrow, wide = _width_loss("log", 0.05, 0.1), _width_loss("log", 0.2, 0.4)
    assert narrow == pytest.approx(wide, rel=1e-4) and narrow > 1e-3
    narrow, wide = _width_loss("linear", 0.05, 0.1), _width_loss("linear", 0.2, 0.4)
    assert wide == pytest.approx(16 * narrow, rel=1e-3)


def test_log_width_needs_graspable_geometry():
    with raises_naming(ValueError, "loss.width_space=log", "loss.geometry=graspable"):
        apply_overrides(GraspConfig(), {"loss.width_space": "log", "loss.geometry": "all"})


def test_view_cache_in_dataloader_workers_survives_epochs(tmp_path, monkeypatch):
    """One persistent loader per split: each view is decoded once per run, not per epoch."""
    from vision_tfm.data.grasp import GraspDataset

    log = tmp_path / "loads.txt"
    decode = GraspDataset._load

    def counted(self, view):
        with open(log, "a") as f:  # appended from inside the (forked) workers
            f.write(f"{view.view_id}\n")
        return decode(self, view)

    monkeypatch.setattr(GraspDataset, "_load", counted)
    over = {"data.cache": True, "data.num_workers": 1, "data.repeat": 2, "sched.epochs": 2}
    cfg = apply_overrides(GraspConfig(), {**TINY, **over, "run.out_dir": str(tmp_path)})
    cfg.run.plots = False
    Trainer(cfg, GraspTask(cfg)).fit()
    loads = sorted(log.read_text().split())
    # 2 training views, and the validation view once per crop (deployment and GG-CNN)
    assert loads == ["pcd0100", "pcd0101", "pcd0101", "pcd0102"]

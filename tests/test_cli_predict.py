"""``vtfm predict``, ``attention`` and ``grasp`` over many files: folders, globs, batches, a
table per image, pictures where asked, and bad files reported one by one while the rest go on.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_names
from PIL import Image

from vision_tfm.cli import main
from vision_tfm.config import apply_overrides, config_to_dict
from vision_tfm.io import atomic_save
from vision_tfm.models import create_model
from vision_tfm.tasks.grasp import GraspConfig, build_grasp_model, predict_grasps
from vision_tfm.tasks.predict import Classifier

FIX = Path(__file__).resolve().parent / "fixtures" / "cornell" / "01"
TINY_VIT = {"embed_dim": 16, "depth": 1, "num_heads": 2}


def run(capsys, *args: object) -> tuple[int, str, str]:
    """``vtfm`` in-process: (exit code, stdout, stderr)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def cls_ckpt(tmp_path_factory) -> Path:
    """An untrained tiny 28x28 gray classifier."""
    d = tmp_path_factory.mktemp("cls")
    torch.manual_seed(0)
    meta = {"task": "cls", "num_classes": 10, "in_chans": 1, "img_size": 28}
    meta |= {"class_names": [f"c{i}" for i in range(10)], "mean": [0.13], "std": [0.31]}
    ck = {
        "model": create_model("vit_mnist", **TINY_VIT).state_dict(),
        "config": {"model": {"name": "vit_mnist", "kwargs": TINY_VIT}},
        "meta": meta,
    }
    atomic_save(ck, d / "ck.pt")
    return d / "ck.pt"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Three images (one in a subfolder, one with an upper-case extension), a file that is
    not an image, a truncated PNG, and a note that is no image at all."""
    rng = np.random.default_rng(0)
    d = tmp_path / "imgs"
    (d / "sub").mkdir(parents=True)
    for name, shape in (("a.png", (28, 28)), ("b.jpg", (40, 31, 3)), ("sub/c.PNG", (30, 50))):
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(d / name)
    (d / "bad.png").write_text("not an image")
    (d / "trunc.png").write_bytes((d / "a.png").read_bytes()[:120])
    (d / "notes.txt").write_text("skipped: not an image extension")
    return d


GOOD = ["a.png", "b.jpg", "sub/c.PNG"]
BAD = ["bad.png", "trunc.png"]


def test_predict_folder_writes_one_row_per_image_and_names_each_bad_file(
    cls_ckpt: Path, folder: Path, tmp_path: Path, capsys
) -> None:
    """The acceptance case: a folder with corrupt files among the images."""
    table = tmp_path / "out" / "p.csv"
    code, out, err = run(
        capsys, "predict", folder, "--checkpoint", cls_ckpt, "--output", table,
        "--topk", "3", "--batch-size", "2",
    )  # fmt: skip
    assert code == 1 and out == f"wrote {table}: 3 images\n"
    lines = err.strip().splitlines()
    assert len(lines) == len(BAD) + 1 and lines[-1].startswith("not ok: 2 of 5 images")
    for line, name in zip(lines, BAD):
        assert line.startswith("skipped") and str(folder / name) in line
    rows = list(csv.DictReader(table.open()))
    assert [r["path"] for r in rows] == [str(folder / n) for n in GOOD]
    assert list(rows[0]) == [
        "path",
        "label_1",
        "score_1",
        "label_2",
        "score_2",
        "label_3",
        "score_3",
    ]
    clf = Classifier(cls_ckpt)
    for r in rows:  # batched as scored one at a time
        prob = clf.probabilities(clf.preprocess(r["path"])[None])[0]
        top = prob.topk(3)
        assert [r[f"label_{i}"] for i in (1, 2, 3)] == [f"c{i}" for i in top.indices.tolist()]
        scores = [float(r[f"score_{i}"]) for i in (1, 2, 3)]
        assert scores == pytest.approx(top.values.tolist(), abs=1e-6)


def test_predict_reads_files_globs_and_writes_jsonl(
    cls_ckpt: Path, folder: Path, tmp_path: Path, capsys
) -> None:
    table = tmp_path / "p.jsonl"
    glob = str(folder / "**" / "*.[pP][nN][gG]")  # quoted: vtfm expands it, bad files too
    code, out, err = run(
        capsys, "predict", folder / "b.jpg", glob, folder / "a.png", "--checkpoint", cls_ckpt,
        "--output", table, "--topk", "50",
    )  # fmt: skip
    assert code == 1 and err.count("skipped") == 2
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    # the order given, each file once; topk capped at the 10 classes
    assert [r["path"] for r in rows] == [str(folder / n) for n in ("b.jpg", "a.png", "sub/c.PNG")]
    assert all(len(r["top"]) == 10 for r in rows)
    assert sum(t["score"] for t in rows[0]["top"]) == pytest.approx(1, abs=1e-5)
    before = table.read_text()
    code, _, err = run(
        capsys, "predict", folder / "a.png", "--checkpoint", cls_ckpt, "--output", table
    )
    assert code == 2
    assert_names(err.strip(), table, "--overwrite")
    assert table.read_text() == before
    code, out, err = run(capsys, "predict", folder / "a.png", "--checkpoint", cls_ckpt)
    assert code == 0 and err == "" and len(out.splitlines()) == 5  # one image: as before


@pytest.mark.parametrize(
    ("given", "names"),
    [
        ("nowhere.png", ("nowhere.png",)),
        ("*.webp", ("*.webp",)),  # a glob that matches nothing
        ("empty", ("empty",)),  # a folder without images
    ],
)
def test_predict_inputs_that_are_not_there_fail_before_any_work(
    cls_ckpt: Path, folder: Path, capsys, given: str, names: tuple
) -> None:
    (folder / "empty").mkdir()
    code, out, err = run(
        capsys, "predict", folder / "a.png", folder / given, "--checkpoint", cls_ckpt
    )
    assert code == 2 and out == ""
    assert_names(err.strip(), *names)


def test_predict_output_must_be_csv_or_jsonl(cls_ckpt: Path, folder: Path, capsys) -> None:
    code, _, err = run(
        capsys, "predict", folder / "a.png", "--checkpoint", cls_ckpt, "--output", "p.txt"
    )
    assert code == 2
    assert_names(err.strip(), "--output", "p.txt", ".csv", ".jsonl")


def test_attention_pictures_go_beside_each_image_or_into_out_dir(
    cls_ckpt: Path, folder: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = run(
        capsys, "attention", folder / "a.png", folder / "sub", "--checkpoint", cls_ckpt
    )
    beside = [folder / "a_attention.png", folder / "sub" / "c_attention.png"]
    assert code == 0 and out.splitlines() == [f"wrote {p}" for p in beside], err
    assert all(p.stat().st_size > 1000 for p in beside) and list(work.iterdir()) == []
    # a folder scan leaves the pictures out: a second run scores no heat map
    code, out, err = run(capsys, "attention", folder, "--checkpoint", cls_ckpt, "--out-dir", "maps")
    assert code == 1 and err.count("skipped") == 2
    assert sorted(p.name for p in (work / "maps").iterdir()) == [
        "a_attention.png",
        "b_attention.png",
        "c_attention.png",
    ]
    assert not list((work / "maps").glob(".*"))  # no temp file left
    code, _, err = run(capsys, "attention", folder, "--checkpoint", cls_ckpt, "--out-dir", "maps")
    assert code == 2
    assert_names(err.strip(), Path("maps") / "a_attention.png", "--overwrite")  # as given
    shutil.copy(folder / "a.png", folder / "sub" / "a.png")
    code, _, err = run(capsys, "attention", folder, "--checkpoint", cls_ckpt, "--out-dir", "m2")
    assert code == 2  # two a.png into one folder
    assert_names(err.strip(), folder / "a.png", folder / "sub" / "a.png")
    code, _, err = run(capsys, "attention", folder, "--checkpoint", cls_ckpt, "--out", "x.png")
    assert code == 2
    assert_names(err.strip(), "--out", "--out-dir")
    assert sorted(p.name for p in work.iterdir()) == ["maps"]


@pytest.fixture(scope="module")
def grasp_ckpt(tmp_path_factory) -> Path:
    """An untrained tiny RGB-D grasp model at 32x32."""
    over = {
        "model.name": "grasp_hybrid_t",
        "model.kwargs": {"stem_chs": [8, 8], "stem_depths": [0, 1], "embed_dim": 16},
        "data.root": str(FIX.parent),
        "data.output_size": 32,
    }
    cfg = apply_overrides(GraspConfig(), over)
    torch.manual_seed(0)
    meta = {
        "task": "grasp", "model_name": "grasp_hybrid_t", "in_chans": 4, "input": "rgbd",
        "img_size": 32, "crop_size": 300, "width_scale": cfg.data.width_scale,
    }  # fmt: skip
    d = tmp_path_factory.mktemp("grasp")
    state = build_grasp_model(cfg).state_dict()
    atomic_save({"model": state, "config": config_to_dict(cfg), "meta": meta}, d / "grasp.pt")
    return d / "grasp.pt"


def test_grasp_views_in_a_folder_find_their_depth_by_name(
    grasp_ckpt: Path, tmp_path: Path, capsys
) -> None:
    """Cornell's layout: pcdNNNNr.png beside pcdNNNNd.tiff. A view without its depth file
    fails alone; the table has every other view's grasps, as single-view prediction gives."""
    views = tmp_path / "views"
    shutil.copytree(FIX, views)
    (views / "pcd0102d.tiff").unlink()
    table = tmp_path / "g.csv"
    code, out, err = run(
        capsys, "grasp", views, "--checkpoint", grasp_ckpt, "--top", "2", "--output", table,
        "--out-dir", tmp_path / "overlays", "--batch-size", "2",
    )  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and out.endswith(f"wrote {table}: 2 images\n"), err
    assert_names(lines[0], views / "pcd0102r.png", views / "pcd0102d.tiff")
    assert sorted(p.name for p in (tmp_path / "overlays").iterdir()) == [
        "pcd0100r_grasps.png",
        "pcd0101r_grasps.png",
    ]
    rows = list(csv.DictReader(table.open()))
    assert [r["path"] for r in rows] == [str(views / f"pcd010{i}r.png") for i in (0, 1)]
    assert rows[0]["depth"] == str(views / "pcd0100d.tiff")
    assert list(rows[0])[:8] == [
        "path",
        "depth",
        "x_1",
        "y_1",
        "angle_deg_1",
        "opening_1",
        "jaw_1",
        "quality_1",
    ]
    for r in rows:
        ref, _ = predict_grasps(grasp_ckpt, r["path"], r["depth"], 2)
        assert len(ref) >= 1
        for i, g in enumerate(ref, 1):
            assert float(r[f"x_{i}"]) == pytest.approx(g.x, abs=1e-3)
            assert float(r[f"y_{i}"]) == pytest.approx(g.y, abs=1e-3)
            assert float(r[f"angle_deg_{i}"]) == pytest.approx(math.degrees(g.angle), abs=1e-3)
            assert float(r[f"quality_{i}"]) == pytest.approx(g.quality, abs=1e-5)
    code, _, err = run(
        capsys, "grasp", views, "--depth", views / "pcd0100d.tiff", "--checkpoint", grasp_ckpt
    )
    assert code == 2
    assert_names(err.strip(), "--depth")


def test_realsense_png_gives_the_grasps_of_its_float_tiff(
    grasp_ckpt: Path, tmp_path: Path, capsys
) -> None:
    """A uint16 PNG in millimetres, made from the float TIFF in metres, is read as metres."""
    metres = np.asarray(Image.open(FIX / "pcd0100d.tiff"), dtype=np.float32)
    mm = np.where(np.isfinite(metres), np.rint(metres * 1000), 0)  # 0: a RealSense hole
    png = tmp_path / "pcd0100d.png"
    Image.fromarray(mm.astype(np.uint16)).save(png)
    ref, _ = predict_grasps(grasp_ckpt, FIX / "pcd0100r.png", FIX / "pcd0100d.tiff", 3)
    got, _ = predict_grasps(grasp_ckpt, FIX / "pcd0100r.png", png, 3)
    assert len(got) == len(ref) >= 1
    for g, r in zip(got, ref):
        assert (g.x, g.y) == (r.x, r.y)
        assert g.angle == pytest.approx(r.angle, abs=1e-3)
        assert g.quality == pytest.approx(r.quality, abs=1e-3)
    code, out, err = run(
        capsys, "grasp", FIX / "pcd0100r.png", "--depth", png, "--checkpoint", grasp_ckpt,
        "--no-overlay", "--depth-scale", "0.001", "--top", "1",
    )  # fmt: skip
    assert code == 0 and f"{ref[0].x:8.1f} {ref[0].y:8.1f}" in out, err


@pytest.mark.parametrize("scale", ["0", "-1", "nan", "inf"])
def test_grasp_refuses_a_meaningless_depth_scale(grasp_ckpt: Path, capsys, scale: str) -> None:
    code, _, err = run(
        capsys, "grasp", FIX / "pcd0100r.png", "--checkpoint", grasp_ckpt, "--depth-scale", scale
    )
    assert code == 2
    assert_names(err.strip(), "--depth-scale", scale)


def test_grasp_refuses_a_view_smaller_than_the_crop(grasp_ckpt: Path, tmp_path, capsys) -> None:
    """A 1x1 view was upsampled and returned grasp centres outside the image."""
    rgb, depth = tmp_path / "v.png", tmp_path / "v.tiff"
    Image.fromarray(np.zeros((1, 1, 3), np.uint8)).save(rgb)
    Image.fromarray(np.ones((1, 1), np.float32)).save(depth)
    code, _, err = run(capsys, "grasp", rgb, "--depth", depth, "--checkpoint", grasp_ckpt)
    assert code == 1  # each view fails alone, as an unreadable one does
    assert_names(err.splitlines()[0], rgb, "1x1", "300x300", "data.crop_size")


K = (500.0, 500.0, 320.0, 240.0)  # fx, fy, cx, cy: a 640x480 camera's


def _metric_rows(capsys, table: Path, *args: object) -> list[dict]:
    code, _, err = run(
        capsys, "grasp", *args, "--intrinsics", ",".join(map(str, K)), "--no-overlay",
        "--top", "3", "--output", table,
    )  # fmt: skip
    assert code == 0, err
    return list(csv.DictReader(table.open()))


def test_grasps_on_a_flat_surface_are_the_pinhole_formula_in_metres(
    grasp_ckpt: Path, tmp_path: Path, capsys
) -> None:
    """A fronto-parallel surface at 0.7 m: each grasp's centre is ((x - cx) / fx * z,
    (y - cy) / fy * z, z), its opening opening * z / f, its yaw minus its image angle."""
    flat = tmp_path / "flat.tiff"
    Image.fromarray(np.full((480, 640), 0.7, np.float32)).save(flat)
    (row,) = _metric_rows(capsys, tmp_path / "m.csv", FIX / "pcd0100r.png", "--depth", flat,
                          "--checkpoint", grasp_ckpt)  # fmt: skip
    fx, fy, cx, cy = K
    n = sum(1 for k in row if k.startswith("x_m_") and row[k])
    assert n >= 1
    for i in range(1, n + 1):
        x, y = float(row[f"x_{i}"]), float(row[f"y_{i}"])
        assert float(row[f"z_m_{i}"]) == pytest.approx(0.7, abs=1e-6)
        assert float(row[f"x_m_{i}"]) == pytest.approx((x - cx) / fx * 0.7, abs=1e-6)
        assert float(row[f"y_m_{i}"]) == pytest.approx((y - cy) / fy * 0.7, abs=1e-6)
        want = float(row[f"opening_{i}"]) * 0.7 / fx
        assert float(row[f"opening_m_{i}"]) == pytest.approx(want, rel=1e-4)
        yaw = -float(row[f"angle_deg_{i}"])  # y points down in both frames
        assert (float(row[f"yaw_deg_{i}"]) - yaw + 90) % 180 - 90 == pytest.approx(0, abs=1e-3)


def test_an_rgb_model_reads_the_depth_beside_its_view_for_metres(tmp_path: Path, capsys) -> None:
    """Metres need depth whatever the model's input: an RGB model finds the view's depth file
    by name, and a view without one fails alone, naming it."""
    over = {
        "model.name": "grasp_hybrid_t",
        "model.kwargs": {"stem_chs": [8, 8], "stem_depths": [0, 1], "embed_dim": 16},
        "data.root": str(FIX.parent), "data.output_size": 32, "data.input": "rgb",
    }  # fmt: skip
    cfg = apply_overrides(GraspConfig(), over)
    meta = {
        "task": "grasp", "model_name": "grasp_hybrid_t", "in_chans": 3, "input": "rgb",
        "img_size": 32, "crop_size": 300, "width_scale": cfg.data.width_scale,
    }  # fmt: skip
    ckpt = tmp_path / "rgb.pt"
    torch.manual_seed(0)
    state = build_grasp_model(cfg).state_dict()
    atomic_save({"model": state, "config": config_to_dict(cfg), "meta": meta}, ckpt)
    (row,) = _metric_rows(capsys, tmp_path / "m.csv", FIX / "pcd0100r.png", "--checkpoint", ckpt)
    assert row["depth"] == str(FIX / "pcd0100d.tiff")
    z = float(row["z_m_1"])
    assert 0.3 < z < 1.0  # Cornell's camera is about 0.6 m above the table
    lone = tmp_path / "lone.png"
    shutil.copy(FIX / "pcd0100r.png", lone)
    code, _, err = run(capsys, "grasp", lone, "--checkpoint", ckpt, "--intrinsics", "1,1,1,1")
    assert code == 1
    assert_names(err.strip().splitlines()[0], lone, "depth")


def test_a_grasp_over_holes_only_is_marked_without_depth(
    grasp_ckpt: Path, tmp_path: Path, capsys
) -> None:
    holed = np.full((480, 640), np.nan, np.float32)
    holed[0, 0] = 0.7  # one valid pixel, far from the centre crop the grasps lie in
    path = tmp_path / "holed.tiff"
    Image.fromarray(holed).save(path)
    args = ("grasp", FIX / "pcd0100r.png", "--depth", path, "--checkpoint", grasp_ckpt)
    (row,) = _metric_rows(capsys, tmp_path / "m.csv", *args[1:])
    assert row["x_1"] and row["x_m_1"] == "" and row["opening_m_1"] == ""
    code, out, err = run(capsys, *args, "--no-overlay", "--top", "1", "--intrinsics", "1,1,1,1")
    assert code == 0, err
    header, line = out.strip().splitlines()
    assert header.split()[-5:] == ["x_m", "y_m", "z_m", "yaw_deg", "opening_m"]
    assert line.split()[-5:] == ["-"] * 5 and "nan" not in out


@pytest.mark.parametrize(
    "text", ["500,500,320", "500,,320,240", "a,500,320,240", "0,500,320,240", "500,500,nan,240"]
)
def test_grasp_refuses_meaningless_intrinsics(grasp_ckpt: Path, capsys, text: str) -> None:
    code, _, err = run(
        capsys, "grasp", FIX / "pcd0100r.png", "--checkpoint", grasp_ckpt, "--intrinsics", text
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert_names(err.strip(), "intrinsics")

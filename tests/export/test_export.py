"""vtfm export / benchmark: parity on real val images, dynamic sizes, int8, the table, bad input."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import json
import math
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import assert_names

from vision_tfm.accel import cpu_native_bf16
from vision_tfm.cli import main
from vision_tfm.config import apply_overrides, config_to_dict
from vision_tfm.data.config import IMAGENET_MEAN, IMAGENET_STD, MNIST_MEAN, MNIST_STD
from vision_tfm.export.quantize import SMOOTH_ALPHAS
from vision_tfm.io import atomic_save
from vision_tfm.tasks import ClsConfig, build_cls_model
from vision_tfm.tasks.grasp import GraspConfig, build_grasp_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = {
    "vit_mnist": {"embed_dim": 16, "depth": 1, "num_heads": 2, "patch_size": 7},
    "swin_mnist": {
        "embed_dim": 8,
        "depths": [2, 2],
        "num_heads": [1, 1],
        "window_size": 4,
        "patch_size": 4,
    },
    "grasp_hybrid_t": {
        "stem_chs": [8, 8],
        "stem_depths": [0, 1],
        "embed_dim": 16,
        "depth": 1,
        "num_heads": 2,
    },
}


def cls_checkpoint(
    path: Path,
    name: str,
    model_name: str | None = None,
    in_chans: int = 1,
    crop_pct: float = 1.0,
    **kw: object,
) -> Path:
    """An untrained tiny 28x28 classifier saved as a training checkpoint (parity needs no
    training); gray with MNIST statistics, or RGB with ImageNet's. ``kw`` overrides more of
    the model's config."""
    over = {
        "model.name": name,
        "model.kwargs": {**TINY[name], **kw},
        "data.crop_pct": crop_pct,
    }
    cfg = apply_overrides(ClsConfig(), over)
    torch.manual_seed(0)
    model = build_cls_model(cfg.model, 10, in_chans, 28)
    mean, std = (MNIST_MEAN, MNIST_STD) if in_chans == 1 else (IMAGENET_MEAN, IMAGENET_STD)
    meta = {
        "task": "cls",
        "model_name": model_name or name,
        "num_classes": 10,
        "in_chans": in_chans,
        "img_size": 28,
        "class_names": [str(i) for i in range(10)],
        "mean": list(mean),
        "std": list(std),
    }
    ckpt = path / f"{name}.pt"
    atomic_save({"model": model.state_dict(), "config": config_to_dict(cfg), "meta": meta}, ckpt)
    return ckpt


def grasp_checkpoint(path: Path, root: str | None = None) -> Path:
    """A tiny RGB-D grasp model over the 3-view Cornell fixture at 32x32."""
    over = {
        "model.name": "grasp_hybrid_t",
        "model.kwargs": TINY["grasp_hybrid_t"],
        "data.root": root or str(FIXTURES / "cornell"),
        "data.output_size": 32,
        "data.train_frac": 0.67,
    }
    cfg = apply_overrides(GraspConfig(), over)
    torch.manual_seed(0)
    model = build_grasp_model(cfg)
    meta = {
        "task": "grasp",
        "model_name": "grasp_hybrid_t",
        "in_chans": 4,
        "input": "rgbd",
        "img_size": 32,
        "crop_size": 300,
        "width_scale": cfg.data.width_scale,
    }
    ckpt = path / "grasp.pt"
    atomic_save({"model": model.state_dict(), "config": config_to_dict(cfg), "meta": meta}, ckpt)
    return ckpt


def vtfm(*args: str) -> None:
    main([str(a) for a in args])


def fail(capsys, *args: str) -> str:
    """Run the CLI expecting a clean failure: exit 2 and exactly one line on stderr (its
    prefix is checked once, by the format test)."""
    with pytest.raises(SystemExit) as e:
        vtfm(*args)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def vit_export(tmp_path_factory) -> Path:
    """Tiny ViT exported with dynamic batch, H and W plus both int8 flavours (shared: ~10 s)."""
    d = tmp_path_factory.mktemp("vit")
    ckpt = cls_checkpoint(d, "vit_mnist")
    vtfm(
        "export",
        "--checkpoint",
        ckpt,
        "--dynamic",
        "batch,hw",
        "--int8",
        "both",
        "--calib-size",
        "32",
        "--val-images",
        "128",
    )
    return d


def test_dynamic_int8_weight_scales_per_tensor_or_per_output_channel(tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from vision_tfm.export.onnx import export_onnx, ort_runner, ort_session
    from vision_tfm.export.quantize import quantize_int8

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    fp32 = tmp_path / "fp32.onnx"
    export_onnx(model.eval(), x, fp32, output_names=["y"])
    for per_channel, shapes in ((False, [(), ()]), (True, [(16,), (4,)])):
        out = tmp_path / f"int8-{per_channel}.onnx"
        quantize_int8(fp32, out, "dynamic", torch.randn(8, 8), per_channel=per_channel)
        g = onnx.load(str(out)).graph
        weights = [i for i in g.initializer if i.name.endswith("_scale")]
        scales = [numpy_helper.to_array(i).shape for i in weights]
        assert sorted(scales) == sorted(shapes)  # one scale tensor per weight
        assert [n.op_type for n in g.node].count("MatMulInteger") == 2
        y = ort_runner(ort_session(out, threads=1))(x)[0]
        torch.testing.assert_close(y, model(x).detach(), atol=0.05, rtol=0)


def test_dynamic_export_parity_metadata_and_int8(vit_export: Path) -> None:
    modes = ("dynamic", "static")
    d = vit_export
    meta = json.loads((d / "model.json").read_text())
    (fp32,) = meta["files"]  # one self-contained file: no model.onnx.data
    assert fp32["name"] == "model.onnx" and not (d / "model.onnx.data").exists()
    assert fp32["bytes"] == (d / "model.onnx").stat().st_size
    assert fp32["sha256"] == hashlib.sha256((d / "model.onnx").read_bytes()).hexdigest()
    assert meta["model_name"] == "vit_mnist" and meta["in_chans"] == 1
    assert meta["img_size"] == [28, 28] and meta["input_shape"] == ["batch", 1, "height", "width"]
    assert meta["inputs"] == [
        {"name": "image", "shape": ["batch", 1, "height", "width"], "dtype": "float32"}
    ]
    assert meta["outputs"] == [{"name": "logits", "shape": ["batch", 10], "dtype": "float32"}]
    (norm,) = [s for s in meta["preprocess"]["steps"] if s["op"] == "normalize"]
    assert norm["mean"] == list(MNIST_MEAN) and meta["class_names"][3] == "3"
    assert "mean" not in meta and "std" not in meta  # stated once, in their step
    assert len(meta["config_hash"]) == 12 and {"torch", "vision_tfm"} <= set(meta["versions"])
    assert meta["opset"] == 18 and meta["attention"] == "fused"
    checks = meta["parity"]["checks"]
    sizes = {tuple(c["shape"][2:]) for c in checks}
    assert len(sizes) >= 3 and any(h != w for h, w in sizes)
    assert {c["shape"][0] for c in checks} == {1, 16}  # batch is dynamic too
    assert meta["parity"]["ok"] and all(c["max_abs_diff"] <= 1e-4 for c in checks)
    for mode in modes:
        q = json.loads((d / f"model-int8-{mode}.json").read_text())
        assert q["format"] == f"onnx-int8-{mode}" and (d / q["file"]).is_file()
        assert [f["name"] for f in q["files"]] == [q["file"]]  # its own file, not fp32's
        assert 0.0 <= q["top1_agreement"] <= 1.0 and q["val_images"] == 128
        assert q["metric_delta"] == pytest.approx(q["top1"] - q["top1_fp32"])
        assert q["size_mb"] < meta["size_mb"]
    calibration = {
        m: json.loads((d / f"model-int8-{m}.json").read_text())["calibration"] for m in modes
    }
    assert (
        calibration["dynamic"]["images"] == 32 and calibration["dynamic"]["data"] == "train split"
    )
    # chosen on the calibration images; static modes keep the paper-free recipe: no smoothing
    assert calibration["dynamic"]["smoothquant_alpha"] in SMOOTH_ALPHAS
    assert calibration["static"]["images"] == 32 and calibration["static"]["smoothquant_alpha"] == 0
    kept = {m: json.loads((d / f"model-int8-{m}.json").read_text())["fp32_matmuls"] for m in modes}
    assert kept == {"dynamic": TINY["vit_mnist"]["depth"], "static": 0}  # the block's qkv: fp32


def test_exported_model_runs_at_a_new_size_on_real_digits(vit_export: Path) -> None:
    """Independent of the built-in check: onnxruntime vs PyTorch at a size it never saw."""
    from vision_tfm.export import load_source
    from vision_tfm.export.onnx import ort_runner, ort_session, resize
    from vision_tfm.export.source import max_abs_diff

    src = load_source(vit_export / "vit_mnist.pt")
    x = resize(src.batches("val", 3, limit=3)[0][0], (37, 52))
    ours = ort_runner(ort_session(vit_export / "model.onnx"))(x)
    assert max_abs_diff(ours, src.torch_runner()(x)) <= 1e-4


def test_swin_exports_with_dynamic_hw_and_window_attention_on_the_explicit_path(
    tmp_path: Path,
) -> None:
    """One graph for every size: padding, shift choice and mask are computed inside it.

    At 28x28 the second stage is a single 4x4 window (no shift); at the wider parity sizes
    it is shifted, so a graph that baked in either choice fails the check.
    """
    from vision_tfm.export import load_source
    from vision_tfm.export.onnx import ort_runner, ort_session, resize
    from vision_tfm.export.source import max_abs_diff

    ckpt = cls_checkpoint(tmp_path, "swin_mnist")
    vtfm("export", "--checkpoint", ckpt, "--out", tmp_path / "swin.onnx", "--dynamic", "batch,hw")
    meta = json.loads((tmp_path / "swin.json").read_text())
    assert meta["parity"]["ok"] and meta["input_shape"] == ["batch", 1, "height", "width"]
    assert meta["attention"] == "explicit"  # SDPA's exporter takes only 4-D q/k/v
    src = load_source(ckpt)
    assert all(m.fused for m in src.model.modules() if hasattr(m, "fused"))  # flags restored
    run = ort_runner(ort_session(tmp_path / "swin.onnx"))
    digits = src.batches("val", 3, limit=3)[0][0]
    for size in [(16, 16), (37, 52), (64, 33)]:
        x = resize(digits, size)
        assert max_abs_diff(run(x), src.torch_runner()(x)) <= 1e-4, size


def test_linear_attention_checkpoint_exports_quantises_and_benchmarks(tmp_path: Path) -> None:
    """FAVOR+ (its random projection a buffer, exp features): dynamic-H/W parity at three sizes,
    then a benchmark table with fp32 ONNX and int8-dynamic rows, all ok."""
    ckpt = cls_checkpoint(tmp_path, "vit_mnist", attn_type="linear", feature_map="favor")
    vtfm("export", "--checkpoint", ckpt, "--dynamic", "batch,hw")
    meta = json.loads((tmp_path / "model.json").read_text())
    checks = meta["parity"]["checks"]
    assert len({tuple(c["shape"][2:]) for c in checks}) >= 3
    assert meta["parity"]["ok"] and all(c["max_abs_diff"] <= 1e-4 for c in checks)
    out = tmp_path / "b"
    formats = "torch,onnx,onnx-int8-dynamic"
    vtfm(
        "benchmark",
        "--checkpoint",
        ckpt,
        "--formats",
        formats,
        "--quick",
        "--threads",
        "1",
        "--out",
        out,
    )
    rows = list(csv.DictReader((out / "benchmark.csv").open()))
    assert [r["format"] for r in rows] == formats.split(",")
    assert all(r["status"] == "ok" for r in rows), rows
    assert float(rows[1]["max_abs_diff"]) <= 1e-4
    assert float(rows[2]["top1_agreement"]) >= 0.9  # int8 keeps the fp32 model's answers


def assert_rules_documented(spec: str, *rules: str) -> None:
    """model.json names the doc section that states its contract's rules; that section has
    them (the rules change only with a new contract number)."""
    path, _, anchor = spec.partition("#")
    text = (Path(__file__).resolve().parents[2] / path).read_text()
    headings = {
        "-".join(line.lstrip("#").strip().lower().split()): i
        for i, line in enumerate(text.splitlines())
        if line.startswith("#")
    }
    assert anchor in headings, f"{spec}: no such section"
    section = "\n".join(text.splitlines()[headings[anchor] :]).split("\n### ")[0]
    for rule in rules:
        assert rule in section, f"{spec} does not state {rule!r}"


def test_grasp_exports_the_four_maps_as_one_output(tmp_path: Path) -> None:
    import onnxruntime as ort

    vtfm("export", "--checkpoint", grasp_checkpoint(tmp_path))
    sess = ort.InferenceSession(str(tmp_path / "model.onnx"))
    assert [o.name for o in sess.get_outputs()] == ["maps"]
    meta = json.loads((tmp_path / "model.json").read_text())
    assert meta["task"] == "grasp" and meta["parity"]["ok"] and meta["in_chans"] == 4
    pre, post = meta["preprocess"], meta["postprocess"]
    steps = {s["op"]: s for s in pre["steps"]}
    assert [s["op"] for s in pre["steps"]] == [
        "decode",
        "convert",
        "decode_depth",
        "center_crop_square",
        "fill_depth_holes",  # on the crop, before the resize
        "resize_area",
        "center_depth",
        "normalize_rgb",
        "to_tensor",
    ]
    assert steps["to_tensor"]["channels"] == ["R", "G", "B", "D"]
    assert meta["outputs"] == [{"name": "maps", "shape": ["batch", 4, 32, 32], "dtype": "float32"}]
    assert pre["contract"] == "vision_tfm.grasp.preprocess/4"
    assert steps["resize_area"]["size"] == [32, 32] and steps["center_crop_square"]["size"] == 300
    assert post["maps"]["channels"] == ["quality", "cos", "sin", "width"]
    (maps,) = sess.run(
        None, {"image": np.random.default_rng(0).normal(size=(2, 4, 32, 32)).astype(np.float32)}
    )
    assert maps.shape == (2, 4, 32, 32)
    assert (maps[:, [0, 3]] >= 0).all() and (maps[:, [0, 3]] <= 1).all() and (maps >= -1).all()
    post_steps = {s["op"]: s for s in post["steps"]}
    assert [s["op"] for s in post["steps"]] == [
        "flip_average",
        "gaussian_filter",
        "peaks",
        "grasps",
        "to_image",
    ]
    assert post_steps["gaussian_filter"]["sigma"]["quality"] == 2.0
    assert_rules_documented(pre["spec"], "8 neighbours", "area average", "max(std, min_std)")
    assert_rules_documented(post["spec"], "GaussianBlur", "Chebyshev distance")
    for step in pre["steps"] + post["steps"]:  # each step's section states its rules
        assert_rules_documented(step["spec"], f"`{step['op']}")


def test_data_root_that_moved_is_named_and_data_points_at_it(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Training stores data.root as given (often relative); export from elsewhere says so."""
    monkeypatch.chdir(tmp_path)
    ckpt = grasp_checkpoint(tmp_path, root="../elsewhere/cornell")
    err = fail(capsys, "export", "--checkpoint", ckpt)
    assert_names(err, "data.root", "../elsewhere/cornell", "--data")  # and the way out
    assert not (tmp_path / "model.onnx").exists()
    vtfm("export", "--checkpoint", ckpt, "--data", FIXTURES / "cornell")
    assert json.loads((tmp_path / "model.json").read_text())["parity"]["ok"]
    err = fail(capsys, "export", "--checkpoint", ckpt, "--data", "nowhere", "--overwrite")
    assert_names(err, "--data", "nowhere")


def test_killed_export_leaves_no_staging_folder(tmp_path: Path) -> None:
    """``kill`` mid-export: the staging folder goes with it and nothing is installed."""
    import signal
    import time

    ckpt = cls_checkpoint(tmp_path, "vit_mnist")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "vision_tfm.cli", "export", "--checkpoint", str(ckpt)]
    proc = subprocess.Popen([*cmd, "--out", str(out / "m.onnx"), "--int8", "both"])
    deadline = time.monotonic() + 120
    while not list(out.glob(".vtfm-export-*")) and proc.poll() is None:
        assert time.monotonic() < deadline, "the export never started staging"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(out.iterdir()) == []


def test_fixed_size_export_metadata_and_overwrite_leaves_no_stale_int8(
    tmp_path: Path, capsys
) -> None:
    ckpt = cls_checkpoint(tmp_path, "vit_mnist")
    common = ("export", "--checkpoint", ckpt, "--dynamic", "none", "--img-size", "28x42")
    vtfm(*common, "--int8", "dynamic", "--val-images", "32")
    meta = json.loads((tmp_path / "model.json").read_text())
    assert meta["img_size"] == [28, 42] and meta["input_shape"] == [1, 1, 28, 42]
    assert meta["train_img_size"] == [28, 28]
    steps = {s["op"]: s for s in meta["preprocess"]["steps"]}
    assert steps["resize_short_side"]["size"] == 28 and steps["center_crop"]["size"] == [28, 28]
    assert "not OpenCV's" in steps["resize_short_side"]["not"] and steps["convert"]["to"] == "L"
    assert steps["convert"]["luma"] == {"weights": [19595, 38470, 7471], "add": 32768, "shift": 16}
    assert meta["size_order"] == "[height, width]"
    assert_rules_documented(
        steps["resize_short_side"]["spec"],
        "Keys kernel a = -0.75",
        "(v + 2**21) >> 22",
        "not OpenCV's resize",
        "[H, W]",
        "cast each to float32",
    )
    assert_rules_documented(steps["decode"]["spec"], "(v + 128) // 257", "`v >> 8`", "EXIF")
    assert_rules_documented(steps["convert"]["spec"], "R * 19595 + G * 38470 + B * 7471 + 32768")
    assert meta["checkpoint"] == "vit_mnist.pt"  # a name: a path would leak the machine
    assert (tmp_path / "model-int8-dynamic.onnx").is_file()
    capsys.readouterr()
    vtfm(*common[:4], "batch", "--overwrite")  # the fp32 model changes; its int8 would lie
    assert "removed" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model.json",
        "model.onnx",
        "vit_mnist.pt",
    ]


def test_failed_parity_exits_nonzero_says_by_how_much_and_writes_nothing(
    vit_export: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A reference that is off by 1e-3 must fail the 1e-4 check (the export itself is reused)."""
    import shutil

    from vision_tfm.export import pipeline
    from vision_tfm.export.source import ExportSource

    def reuse_export(model, example, path, **kw) -> None:
        shutil.copy(vit_export / "model.onnx", Path(path).parent / "model.onnx")

    honest = ExportSource.torch_runner
    monkeypatch.setattr(pipeline, "export_onnx", reuse_export)
    monkeypatch.setattr(
        ExportSource, "torch_runner", lambda self: lambda x: [y + 1e-3 for y in honest(self)(x)]
    )
    shutil.copy(vit_export / "vit_mnist.pt", tmp_path / "vit_mnist.pt")
    err = fail(capsys, "export", "--checkpoint", tmp_path / "vit_mnist.pt", "--dynamic", "batch,hw")
    assert_names(err, "1.00e-03", "1e-04", "9.00e-04")  # the diff, the tolerance, the excess
    assert "trace size" not in err  # it failed there too: not a shape-specialisation problem
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vit_mnist.pt"]


def test_benchmark_table_has_every_column_and_survives_a_failing_format(
    vit_export: Path, tmp_path: Path, capsys, fake_cpu, caplog
) -> None:
    from vision_tfm.export.tables import COLUMNS

    fake_cpu("AVX2", False)  # bf16 emulated: one warning line, and the footer says it

    empty = tmp_path / "no_images"
    empty.mkdir()
    formats = "torch,torch-bf16,onnx,onnx-int8-dynamic,onnx-int8-static"
    args = (
        "benchmark",
        "--checkpoint",
        vit_export / "vit_mnist.pt",
        "--formats",
        formats,
        "--quick",
        "--threads",
        "1",
        "--out",
        tmp_path / "b",
        "--calib-data",
        empty,
        "--keep-exports",
        tmp_path / "k",
    )
    with pytest.raises(SystemExit) as e:  # a failed row: complete table, then exit 1
        vtfm(*args)
    out, err = capsys.readouterr()
    assert e.value.code == 1
    # every int8 format calibrates, so both fail; the line names them
    assert_names(err.strip().splitlines()[-1], "onnx-int8-dynamic", "onnx-int8-static")
    assert "| format | status | size MB | peak RSS MB | top1 |" in out
    rows = list(csv.DictReader((tmp_path / "b" / "benchmark.csv").open()))
    assert tuple(rows[0]) == COLUMNS and [r["format"] for r in rows] == formats.split(",")
    status = {r["format"]: r["status"] for r in rows}
    for fmt in ("onnx-int8-dynamic", "onnx-int8-static"):
        assert status[fmt].startswith("failed: DataError")
        assert_names(status[fmt], empty)  # the calibration folder without images
    for r in rows[:3]:
        assert r["status"] == "ok", r
        assert float(r["latency_median_ms"]) <= float(r["latency_p90_ms"])
        assert float(r["throughput_img_s"]) > 0 and float(r["size_mb"]) > 0
        assert r["threads"] == "1" and float(r["gflops"]) > 0
    # each format's peak in its own process: onnxruntime's never holds torch (~10x more)
    rss = {r["format"]: float(r["peak_rss_mb"]) for r in rows[:3]}
    assert 0 < 2 * rss["onnx"] < min(rss["torch"], rss["torch-bf16"])
    assert rows[3]["peak_rss_mb"] == rows[4]["peak_rss_mb"] == ""  # failed formats ran nowhere
    assert float(rows[2]["max_abs_diff"]) <= 1e-4  # fp32 onnx vs PyTorch
    result = json.loads((tmp_path / "b" / "benchmark.json").read_text())
    assert result["val_images"] == 64 and result["metric_name"] == "top1"
    assert {"torch", "vision_tfm", "onnx", "onnxruntime"} <= set(result["versions"])
    md = (tmp_path / "b" / "benchmark.md").read_text()
    assert md.startswith("| format |") and "torch-bf16: bf16 is emulated" in md
    assert list(result["ceiling_gflops"]) == ["fp32"]  # no bf16 matmul timed where emulated
    assert rows[1]["pct_of_ceiling"] == "" and float(rows[0]["pct_of_ceiling"]) > 0
    assert len([r for r in caplog.records if "emulated" in r.getMessage()]) == 1
    err = fail(capsys, *args)  # the tables exist now: refused before any work
    assert_names(err, tmp_path / "b", "--overwrite")
    kept = json.loads((tmp_path / "k" / "model-opset18.json").read_text())
    assert kept["format"] == "onnx" and kept["opset"] == 18 and kept["preprocess"]
    assert not list((tmp_path / "k").glob("*int8*"))  # a failed format keeps no file
    err = fail(capsys, *args[:-6], "--out", tmp_path / "b2", *args[-4:])
    assert_names(err, "--keep-exports", tmp_path / "k", "--overwrite")


def test_benchmark_times_pytorchs_deployment_paths(vit_export: Path, tmp_path: Path) -> None:
    """optimize_for_inference, eager and compiled, are rows like the runtimes': held to fp32
    parity with the torch row, timed, and measured in their own process."""
    out, formats = tmp_path / "b", "torch,torch-optimized,torch-compiled"
    quick = ("--quick", "--threads", "1", "--out", out)
    vtfm("benchmark", "--checkpoint", vit_export / "vit_mnist.pt", "--formats", formats, *quick)
    rows = {r["format"]: r for r in csv.DictReader((out / "benchmark.csv").open())}
    assert list(rows) == formats.split(",")
    for fmt in ("torch-optimized", "torch-compiled"):
        r = rows[fmt]
        assert r["status"] == "ok", r
        assert float(r["max_abs_diff"]) <= 1e-4 and float(r["top1_agreement"]) == 1.0
        assert float(r["latency_median_ms"]) > 0 and float(r["peak_rss_mb"]) > 0
        assert r["size_mb"] == rows["torch"]["size_mb"]  # the same weights


def openvino_benchmark(ckpt: Path, out: Path, formats: str, *extra: str, rc: int = 0) -> dict:
    """``vtfm benchmark`` in a child process: OpenVINO's CPU plugin loaded into the pytest
    process made a later ``torch.compile`` test segfault, so it never loads here."""
    cmd = [sys.executable, "-m", "vision_tfm.cli", "benchmark", "--checkpoint", str(ckpt)]
    cmd += ["--formats", formats, "--quick", "--threads", "1", "--out", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == rc, done.stderr[-2000:]
    return json.loads((out / "benchmark.json").read_text())


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino extra")
def test_openvino_rows_meet_fp32_parity_and_report_their_precision(
    vit_export: Path, tmp_path: Path
) -> None:
    ckpt = vit_export / "vit_mnist.pt"
    result = openvino_benchmark(ckpt, tmp_path / "b", "onnx,openvino,openvino-bf16")
    rows = {r["format"]: r for r in result["rows"]}
    ov, bf16 = rows["openvino"], rows["openvino-bf16"]
    assert ov["status"] == "ok" and ov["max_abs_diff"] <= 1e-4
    assert ov["size_mb"] == rows["onnx"]["size_mb"]  # the same exported file
    assert bf16["status"].startswith("ok") and bf16["top1_agreement"] >= 0.9
    assert 1e-4 < bf16["max_abs_diff"] < 0.5 or "runs fp32" in bf16["status"]
    for r in (ov, bf16):
        assert r["latency_median_ms"] > 0 and r["throughput_img_s"] > 0 and r["peak_rss_mb"] > 0
    assert result["versions"]["openvino"]
    # the bf16 matmul ceiling is timed only where bf16 is native (emulated, it takes minutes)
    assert ("bf16" in result["ceiling_gflops"]) == cpu_native_bf16()
    strict = openvino_benchmark(
        ckpt, tmp_path / "s", "openvino", "--atol", "1e-9", "--no-memory", rc=1
    )
    (row,) = strict["rows"]
    assert row["status"].startswith("exported but parity failed: max abs diff")
    assert "> 1e-09 on the val images" in row["status"] and row["latency_median_ms"] > 0


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino extra")
def test_openvino_int8_export_writes_the_layout_openvino_runs(
    vit_export: Path, tmp_path: Path
) -> None:
    """``--int8 openvino``: QDQ in OpenVINO's int8 layout, scored in OpenVINO against fp32
    PyTorch, with its own metadata (a child process: see openvino_benchmark)."""
    import onnx

    out = tmp_path / "m.onnx"
    cmd = [sys.executable, "-m", "vision_tfm.cli", "export", "--checkpoint"]
    cmd += [str(vit_export / "vit_mnist.pt"), "--int8", "openvino", "--out", str(out)]
    cmd += ["--calib-size", "32", "--val-images", "128"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    q = json.loads((tmp_path / "m-int8-openvino.json").read_text())
    assert q["format"] == "openvino-int8" and q["file"] == "m-int8-openvino.onnx"
    assert q["calibration"] == {"data": "train split", "images": 32, "smoothquant_alpha": 0.0}
    assert q["fp32_matmuls"] == 0 and q["val_images"] == 128
    assert q["top1_agreement"] >= 0.9 and abs(q["metric_delta"]) <= 0.05
    assert q["size_mb"] < json.loads(out.with_suffix(".json").read_text())["size_mb"]
    assert "int8 openvino: top1" in done.stdout
    assert_openvino_qdq_layout(onnx.load(str(tmp_path / q["file"])).graph)


def test_openvino_missing_is_a_failed_row_or_a_refused_export(
    vit_export: Path, monkeypatch
) -> None:
    from vision_tfm.export import (
        BenchOptions,
        ExportOptions,
        benchmark_checkpoint,
        export_checkpoint,
    )

    monkeypatch.setitem(sys.modules, "openvino", None)  # import raises ImportError
    opts = BenchOptions.quick(formats=("torch", "openvino"), threads=1, memory=False)
    result = benchmark_checkpoint(vit_export / "vit_mnist.pt", opts, log=lambda _: None)
    torch_row, ov = result["rows"]
    assert torch_row["status"] == "ok" and torch_row["latency_median_ms"] > 0
    assert ov["status"].startswith("failed: DependencyError") and "[openvino]" in ov["status"]
    assert ov["latency_median_ms"] is None and result["versions"]["openvino"] is None
    from vision_tfm.export.openvino import openvino_runner

    with pytest.raises(ValueError, match=r"\bint8\b"):
        openvino_runner(vit_export / "model.onnx", 1, "int8")
    out = vit_export / "never.onnx"  # refused before any work: nothing is written
    with pytest.raises(ValueError, match=r"--int8 openvino needs openvino.*\[openvino\]"):
        export_checkpoint(
            vit_export / "vit_mnist.pt", ExportOptions(out=str(out), int8=("openvino",))
        )
    assert not out.exists()


@pytest.mark.parametrize(
    "case",
    [
        "opset",
        "calib",
        "calib_empty",
        "calib_size",
        "int8_scores",
        "parity_images",
        "out_folder",
        "exists",
        "unknown_model",
        "stale_weights",
    ],
)
def test_bad_input_is_one_line_and_nonzero(tmp_path: Path, capsys, case: str) -> None:
    unknown = "vit_giant_imaginary"
    ckpt = cls_checkpoint(
        tmp_path, "vit_mnist", model_name=unknown if case == "unknown_model" else None
    )
    if case == "stale_weights":  # the registered size changed after training
        saved = torch.load(ckpt, weights_only=True)
        saved["config"]["model"]["kwargs"]["embed_dim"] = 32
        atomic_save(saved, ckpt)
    taken = tmp_path / "taken.onnx"
    taken.write_text("keep me")
    (tmp_path / "empty").mkdir()
    (tmp_path / "folder.onnx").mkdir()
    extra, names = {
        "opset": (["--opset", "17"], ("opset", 17)),
        "calib": (["--int8", "static", "--calib-data", tmp_path / "nowhere"], ("nowhere",)),
        "calib_empty": (  # found before the export runs
            ["--int8", "static", "--calib-data", tmp_path / "empty", "--out", tmp_path / "e.onnx"],
            (tmp_path / "empty",),
        ),
        "calib_size": (["--int8", "static", "--calib-size", "0"], ("--calib-size", 0)),
        "int8_scores": (["--int8", "dynamic", "--int8-scores", "int4"], ("--int8-scores", "int4")),
        "parity_images": (["--parity-images", "0"], ("--parity-images", 0)),
        "out_folder": (["--out", tmp_path / "folder.onnx"], ("--out", tmp_path / "folder.onnx")),
        "exists": (["--out", taken], (taken, "--overwrite")),
        "unknown_model": ([], (unknown,)),
        "stale_weights": ([], (16, 32)),  # the width trained, the width the config now asks
    }[case]
    assert_names(fail(capsys, "export", "--checkpoint", ckpt, *extra), *names)
    assert taken.read_text() == "keep me"
    assert not list(tmp_path.glob("*.json")) and not list(tmp_path.glob(".vtfm-export-*"))


def test_missing_checkpoint_or_bad_format_is_reported_before_existing_outputs(
    tmp_path: Path, capsys
) -> None:
    """Also THE test of the CLI's error format: exit 2, nothing on stdout, and stderr exactly
    ``error: <one line naming the thing>``. Every other CLI test checks the exit code, one
    line and the names, not this prefix."""
    (tmp_path / "model.onnx").write_text("keep me")
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "benchmark" / "benchmark.md").write_text("keep me")
    nope = tmp_path / "nope.pt"
    for cmd in (("export",), ("benchmark", "--formats", "torch")):
        with pytest.raises(SystemExit) as e:
            vtfm(cmd[0], "--checkpoint", nope, *cmd[1:])
        out, err = capsys.readouterr()
        assert e.value.code == 2 and out == "", out
        assert re.fullmatch(rf"error: [^\n]*{re.escape(str(nope))}[^\n]*\n", err), err
    ckpt = cls_checkpoint(tmp_path, "vit_mnist")
    err = fail(capsys, "benchmark", "--checkpoint", ckpt, "--formats", "torch,onx")
    assert_names(err, "--formats", "onx")
    assert (tmp_path / "model.onnx").read_text() == "keep me"
    assert (tmp_path / "benchmark" / "benchmark.md").read_text() == "keep me"


def test_calibration_reads_idx_and_image_folders(tmp_path: Path) -> None:
    import gzip

    import numpy as np
    from PIL import Image

    from vision_tfm.export import calibration_images, load_source

    src = load_source(cls_checkpoint(tmp_path, "vit_mnist"))
    digits = np.zeros((5, 28, 28), np.uint8)
    digits[:, 10:18, 12:16] = 255
    header = (2051).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in digits.shape)
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "t10k-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(header + digits.tobytes())
    )
    (tmp_path / "pngs" / "any").mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((40, 30, 3), 60 * i, np.uint8)).save(
            tmp_path / "pngs" / "any" / f"{i}.png"
        )
    idx = calibration_images(src, tmp_path / "idx", n=4)
    pngs = calibration_images(src, tmp_path / "pngs", n=4)
    own = calibration_images(src, None, n=8)  # the checkpoint's training split (embedded MNIST)
    assert idx.shape == (4, 1, 28, 28) and pngs.shape == (3, 1, 28, 28) and own.shape[0] == 8
    lo = (0 - MNIST_MEAN[0]) / MNIST_STD[0]
    assert idx.min().item() == pytest.approx(lo, abs=1e-4)  # normalised as in training
    assert pngs[0].max().item() == pytest.approx(lo, abs=1e-4)  # a black image


def test_attention_switch_probes_token_rank_and_restores(tmp_path: Path) -> None:
    from vision_tfm.export import load_source
    from vision_tfm.export.onnx import export_attention

    for name, expect in (("vit_mnist", "fused"), ("swin_mnist", "explicit")):
        model = load_source(cls_checkpoint(tmp_path, name)).model
        with export_attention(model, torch.zeros(2, 1, 28, 28)) as mode:
            assert mode == expect
        assert all(m.fused for m in model.modules() if hasattr(m, "fused"))


def test_cpu_description_names_model_and_matrix_isa(tmp_path) -> None:
    from vision_tfm.export import cpu_description

    info = tmp_path / "cpuinfo"
    core = "model name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_int8\n"
    info.write_text(f"processor\t: 0\n{core}\nprocessor\t: 1\n{core}")
    assert cpu_description(info) == "AMD EPYC 9R14 [avx2 avx512f avx512_bf16 amx_int8]"
    info.write_text("model name\t: Some CPU\nflags\t\t: fpu sse\n")
    assert cpu_description(info) == "Some CPU"
    # no /proc (not Linux): platform's name, never the machine (callers print that already)
    assert cpu_description(tmp_path / "missing") == (platform.processor() or "unknown CPU model")


def test_flops_follow_the_two_per_multiply_add_convention() -> None:
    from vision_tfm.export import count_flops, matmul_ceiling
    from vision_tfm.export.benchmark import time_runs

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    assert count_flops(model, torch.zeros(4, 32)) == 2 * (32 * 64 + 64 * 8)
    assert matmul_ceiling(torch.float32, threads=1, sizes=(64,), seconds=0.0) > 0
    calls: list[str] = []
    fns = {k: (lambda x, k=k: calls.append(k)) for k in ("a", "b")}
    times = time_runs(fns, torch.zeros(1), warmup=3, runs=7, seconds=0.0, round_calls=2)
    # 4 rounds of 2 calls reach 7; the formats take turns after their warmups
    assert {k: len(v) for k, v in times.items()} == {"a": 8, "b": 8}
    assert calls[:6] == ["a"] * 3 + ["b"] * 3 and calls[6:10] == ["a", "a", "b", "b"]


@pytest.mark.parametrize(
    ("name", "gmacs"),
    [("vit_small_patch16_224", 4.6), ("swin_tiny_patch4_window7_224", 4.5)],  # DeiT / Swin papers
)
def test_flops_count_cpu_attention_and_match_the_papers(name: str, gmacs: float) -> None:
    """On CPU, SDPA runs a kernel torch's counter had no formula for: attention went uncounted."""
    from vision_tfm import create_model
    from vision_tfm.export import count_flops

    model = create_model(name).eval()
    assert count_flops(model, torch.zeros(1, 3, 224, 224)) / 2e9 == pytest.approx(gmacs, rel=0.02)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_exports_in_the_form_onnxruntime_fuses(tmp_path: Path, approximate: str) -> None:
    """At opset 18 (no Gelu op) GELU is written out so that onnxruntime fuses it to one node."""
    import onnx
    import onnxruntime as ort

    from vision_tfm.export.onnx import export_onnx, ort_runner

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(approximate=approximate), torch.nn.Linear(16, 4)
    ).eval()
    x = torch.randn(3, 8) * 3
    path = tmp_path / "mlp.onnx"
    export_onnx(model, x, path, output_names=["out"], opset=18)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert not {"Erf", "Tanh"} & set(ops), ops
    assert {"Gelu", "BiasGelu", "FastGelu"} & set(ops), ops
    torch.testing.assert_close(ort_runner(sess)(x)[0], model(x), atol=1e-5, rtol=1e-5)


def client_images(folder: Path) -> list[Path]:
    """One file per input kind the client must read as ``vtfm predict`` does."""
    from PIL import Image

    rng = np.random.default_rng(0)

    def noise(*shape: int) -> np.ndarray:
        return rng.integers(0, 256, shape, dtype=np.uint8)

    pal = Image.fromarray(noise(33, 47, 3)).quantize(colors=37)
    kinds = {
        "gray.png": Image.fromarray(noise(50, 37), "L"),
        "rgb.jpg": Image.fromarray(noise(45, 80, 3)),
        "16bit.png": Image.fromarray(rng.integers(0, 65536, (40, 30)).astype(np.uint16)),
        "palette.png": pal,
        "rgba.png": Image.fromarray(noise(41, 41, 4), "RGBA"),
        "upscaled.png": Image.fromarray(noise(7, 10, 3)),
        # 32 / 64 * 97 = 48.5: the long side rounds half to even (48), not up
        "nonsquare.png": Image.fromarray(noise(64, 97, 3)),
    }
    folder.mkdir()
    for name, im in kinds.items():
        im.save(folder / name)
    assert Image.open(folder / "16bit.png").mode.startswith("I")
    return [folder / n for n in kinds]


@pytest.mark.parametrize("in_chans", [1, 3])
def test_onnx_client_matches_vtfm_predict_on_every_input_kind(
    tmp_path: Path, capsys, in_chans: int
) -> None:
    """examples/onnx_client.py (onnxruntime, numpy, Pillow) follows model.json alone."""
    from vision_tfm.data import build_eval_transform, load_image
    from vision_tfm.io import load_checkpoint
    from vision_tfm.tasks import ClassificationTask, eval_data_config

    ckpt = cls_checkpoint(tmp_path, "vit_mnist", in_chans=in_chans, crop_pct=0.875)
    vtfm("export", "--checkpoint", ckpt)
    images = client_images(tmp_path / "images")
    client = Path(__file__).resolve().parents[2] / "examples" / "onnx_client.py"
    cmd = [sys.executable, str(client), str(tmp_path / "model.onnx"), *map(str, images)]
    done = subprocess.run([*cmd, "--probs"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    probs = [np.asarray(json.loads(line)) for line in done.stdout.splitlines()]
    # what vtfm predict computes, unrounded
    saved = load_checkpoint(ckpt)
    model, cfg = ClassificationTask.restore(saved)
    transform = build_eval_transform(eval_data_config(cfg, saved["meta"]))
    capsys.readouterr()
    for path, prob in zip(images, probs, strict=True):
        x = transform(load_image(path, in_chans))[None]
        with torch.no_grad():
            ref = model(x).float().softmax(-1)[0].double().numpy()
        assert np.abs(prob - ref).max() <= 1e-5, path.name
        vtfm("predict", path, "--checkpoint", ckpt, "--topk", "3")
        top = np.argsort(-prob)[:3]
        lines = [f"{i:>20d}  {prob[i]:.4f}" for i in top]
        assert_tables_close(capsys.readouterr().out.splitlines(), lines)


def test_benchmark_of_a_registered_model_without_checkpoint(tmp_path: Path, capsys) -> None:
    """--model: speed and agreement rows on real images, and plainly no accuracy column."""
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (40, 52 + i, 3), dtype=np.uint8)).save(
            tmp_path / "imgs" / f"{i}.png"
        )
    common = ("benchmark", "--model", "vit_test", "--img-size", "32", "--threads", "1")
    args = (*common, "--quick", "--no-memory", "--data", tmp_path / "imgs")
    fmts = ("--formats", "torch,onnx,onnx-int8-dynamic", "--int8-scores", "int8")
    vtfm(*args, *fmts, "--out", tmp_path / "b")
    out = capsys.readouterr().out
    assert out.startswith("| format | status | size MB | peak RSS MB | top-1 agree |")
    assert "no accuracy column" in out and "random" in out
    result = json.loads((tmp_path / "b" / "benchmark.json").read_text())
    assert result["checkpoint"] is None and result["img_size"] == [32, 32]
    assert result["val_images"] == 5 and result["metric_name"] is None
    assert f"top-1 takes {result['fp32_top1_classes']} distinct classes" in out
    assert 1 <= result["fp32_top1_classes"] <= 5
    rows = {r["format"]: r for r in result["rows"]}
    assert all(r["status"] == "ok" and r["metric"] is None for r in rows.values())
    assert rows["onnx"]["max_abs_diff"] <= 1e-4 and rows["onnx"]["top1_agreement"] == 1.0
    assert rows["onnx-int8-dynamic"]["max_abs_diff"] > 0 and rows["torch"]["latency_median_ms"] > 0
    recipe = result["int8_recipes"]["onnx-int8-dynamic"]  # every MatMul int8, as asked
    assert recipe["fp32_matmuls"] == 0 and recipe["smoothquant_alpha"] in SMOOTH_ALPHAS
    assert f"onnx-int8-dynamic: SmoothQuant alpha {recipe['smoothquant_alpha']:g}" in out
    assert_names(fail(capsys, *common, "--out", tmp_path / "c"), "--data")
    assert_names(fail(capsys, "benchmark", "--checkpoint", "x.pt", "--img-size", "32"), "--model")
    err = fail(capsys, *args, "--model", "grasp_hybrid_t", "--out", tmp_path / "d")
    assert_names(err, tmp_path / "imgs")  # a grasp model needs RGB-D views, not plain images


def test_model_source_converts_timm_weights(tmp_path: Path) -> None:
    import timm

    from vision_tfm.export.source import model_source

    torch.manual_seed(1)
    ref = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2
    ).eval()
    torch.save(ref.state_dict(), tmp_path / "timm.pth")
    src = model_source("vit_test", 32, tmp_path, tmp_path / "timm.pth")
    x = torch.randn(2, 3, 32, 32)
    assert (src.torch_runner()(x)[0] - ref(x)).abs().max().item() <= 1e-5
    assert src.describe()["checkpoint"] == "timm.pth" and src.meta["weights"] == "timm.pth"


@pytest.fixture(scope="module")
def trained_grasp(tmp_path_factory) -> tuple[Path, float]:
    """The tiny grasp model trained 1 epoch on the Cornell fixture (2 train views, 1 val), and
    the val grasp accuracy of its shipped weights."""
    return _train_tiny_grasp(tmp_path_factory.mktemp("grasp_run"))


def _train_tiny_grasp(out_dir: Path, **extra: Any) -> tuple[Path, float]:
    from vision_tfm.tasks.grasp import GraspTask
    from vision_tfm.train import Trainer

    over = {
        "model.name": "grasp_hybrid_t",
        "model.kwargs": TINY["grasp_hybrid_t"],
        "data.root": str(FIXTURES / "cornell"),
        "data.output_size": 32,
        "data.train_frac": 0.67,
        "data.batch_size": 2,
        "sched.epochs": 1,
        "run.tensorboard": False,
        "run.plots": False,
        "run.out_dir": str(out_dir),
        **extra,
    }
    cfg = apply_overrides(GraspConfig(), over)
    trainer = Trainer(cfg, GraspTask(cfg))
    metrics = trainer.shipped_metrics(trainer.fit())
    return trainer.run_dir / "best.pt", metrics["grasp_acc"]


def test_grasp_folder_views_ignore_the_checkpoints_fold_split(trained_grasp, tmp_path: Path):
    """A calibration folder is any folder of views: a 5-fold checkpoint still reads one with 2
    views (every view, in the run's preprocessing), where its split would need 5."""
    import shutil
    from dataclasses import replace

    from vision_tfm.export import load_source

    src = load_source(trained_grasp[0])
    src.task.cfg = replace(src.cfg, data=replace(src.cfg.data, folds=5, fold=4, normalise="image"))
    folder = tmp_path / "calib" / "01"
    folder.mkdir(parents=True)
    for f in (FIXTURES / "cornell" / "01").glob("pcd010[01]*"):
        shutil.copy(f, folder)
    views = src.folder_dataset(tmp_path / "calib")
    assert sorted(v for ds in views.datasets for v in ds.ids) == ["pcd0100", "pcd0101"]
    assert {ds.normalise for ds in views.datasets} == {"image"}  # the run's preprocessing


def test_grasp_benchmark_scores_grasps_in_every_format(trained_grasp, tmp_path: Path) -> None:
    """Grasp accuracy on the deployment crop, top-grasp agreement and map diffs per format;
    static int8 quantises the conv stem too; no absolute path in the shared JSON."""
    import onnx

    ckpt, acc = trained_grasp
    has_ov = importlib.util.find_spec("openvino") is not None
    formats = "torch,onnx,onnx-int8-dynamic,onnx-int8-static"
    formats += ",openvino,openvino-int8" if has_ov else ""
    keep = tmp_path / "k"
    result = openvino_benchmark(
        ckpt, tmp_path / "b", formats, "--no-memory", "--keep-exports", str(keep)
    )
    rows = {r["format"]: r for r in result["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    ref = rows["torch"]
    assert result["metric_name"] == "grasp_acc" and ref["metric"] == pytest.approx(acc)
    for fmt in ("onnx", "openvino") if has_ov else ("onnx",):
        r = rows[fmt]
        assert r["max_abs_diff"] <= 1e-4 and r["top1_agreement"] == 1.0
        assert r["metric"] == ref["metric"]
    for fmt in ("onnx-int8-dynamic", "onnx-int8-static", *(("openvino-int8",) if has_ov else ())):
        r = rows[fmt]
        assert r["metric_delta"] == pytest.approx(r["metric"] - ref["metric"])
        assert 0 <= r["top1_agreement"] <= 1 and r["max_abs_diff"] > 0
    md = (tmp_path / "b" / "benchmark.md").read_text()
    assert "| top grasp agree |" in md and "cropped at the image centre" in md
    text = (tmp_path / "b" / "benchmark.json").read_text()
    assert result["checkpoint"] == "best.pt" and str(ckpt.parent) not in text
    assert str(ckpt.parent) not in (keep / "model-opset18.json").read_text()
    graph = onnx.load(str(keep / "onnx-int8-static.onnx")).graph
    made_by = {o: n.op_type for n in graph.node for o in n.output}
    stem = next(n for n in graph.node if n.op_type == "Conv")
    assert [made_by.get(i) for i in stem.input[:2]] == ["DequantizeLinear"] * 2
    if has_ov:
        assert_openvino_qdq_layout(onnx.load(str(keep / "openvino-int8.onnx")).graph)


def assert_openvino_qdq_layout(graph) -> None:
    """The layout OpenVINO runs in int8: every Conv and MatMul (attention's included) reads
    symmetric s8 Q/DQ inputs (zero point 0), and a quantised op's output is quantised only
    for another quantised op (the grasp maps leave the head in fp32)."""
    from onnx import TensorProto, numpy_helper

    quantised_ops = ("Conv", "MatMul", "Gemm")
    made_by = {o: n for n in graph.node for o in n.output}
    read_by: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            read_by.setdefault(i, []).append(n)
    consts = {t.name: t for t in graph.initializer}
    quantise = [n for n in graph.node if n.op_type == "QuantizeLinear"]
    assert quantise
    for q in quantise:
        zp = consts[q.input[2]]
        assert zp.data_type == TensorProto.INT8 and not numpy_helper.to_array(zp).any()
        if q.input[0] in made_by and made_by[q.input[0]].op_type in quantised_ops:
            (dq,) = read_by[q.output[0]]
            assert {n.op_type for n in read_by[dq.output[0]]} <= set(quantised_ops), q.name

    def dequantised(name: str) -> bool:
        return name in made_by and made_by[name].op_type == "DequantizeLinear"

    ops = [n for n in graph.node if n.op_type in ("Conv", "MatMul")]
    assert {n.op_type for n in ops} == {"Conv", "MatMul"}
    assert all(dequantised(n.input[0]) and dequantised(n.input[1]) for n in ops)


def test_benchmark_of_a_grasp_model_without_checkpoint(tmp_path: Path, capsys) -> None:
    """--model grasp_*: speed and agreement rows on real RGB-D views, no accuracy column."""
    common = ("benchmark", "--model", "grasp_hybrid_t", "--img-size", "32", "--threads", "1")
    args = (*common, "--quick", "--no-memory", "--data", FIXTURES / "cornell")
    vtfm(*args, "--formats", "torch,onnx,onnx-int8-dynamic", "--out", tmp_path / "b")
    out = capsys.readouterr().out
    assert "| top grasp agree |" in out and "no accuracy column" in out and "random" in out
    result = json.loads((tmp_path / "b" / "benchmark.json").read_text())
    assert result["task"] == "grasp" and result["metric_name"] is None
    assert result["val_images"] == 3 and result["img_size"] == [32, 32]
    assert f"falls on {result['fp32_top_grasp_pixels']} distinct pixels" in out
    assert result["images"] == "cornell" and str(FIXTURES) not in json.dumps(result)
    rows = {r["format"]: r for r in result["rows"]}
    assert rows["onnx"]["max_abs_diff"] <= 1e-4 and rows["onnx"]["top1_agreement"] == 1.0
    assert rows["onnx-int8-dynamic"]["max_abs_diff"] > 0
    assert_names(fail(capsys, *args, "--ema", "--out", tmp_path / "c"), "--ema", "--model")
    err = fail(capsys, *args, "--weights", __file__, "--out", tmp_path / "d")
    assert_names(err, "--weights", "grasp_hybrid_t")  # classifier weights, a grasp model


def test_grasp_fp32_exports_match_pytorch_at_three_sizes(trained_grasp, tmp_path: Path) -> None:
    """onnxruntime (in the export's parity check) and OpenVINO within 1e-4 of PyTorch on real
    views at three sizes through one dynamic-H/W graph."""
    ckpt, _ = trained_grasp
    out = tmp_path / "g.onnx"
    vtfm("export", "--checkpoint", ckpt, "--dynamic", "batch,hw", "--out", out)
    checks = json.loads(out.with_suffix(".json").read_text())["parity"]["checks"]
    assert len({tuple(c["shape"][2:]) for c in checks}) >= 3
    assert all(c["max_abs_diff"] <= 1e-4 for c in checks), checks
    if importlib.util.find_spec("openvino") is None:
        return
    code = (  # a child process: see openvino_benchmark
        "import json, sys\n"
        "from vision_tfm.export.onnx import parity_inputs\n"
        "from vision_tfm.export.openvino import openvino_runner\n"
        "from vision_tfm.export.source import load_source, max_abs_diff\n"
        "src = load_source(sys.argv[1])\n"
        "run, precision = openvino_runner(sys.argv[2], 1)\n"
        "xs = parity_inputs(src, src.img_size, frozenset({'batch', 'hw'}))\n"
        "diffs = [max_abs_diff(run(x), src.torch_runner()(x)) for x in xs]\n"
        "print(json.dumps([precision, [list(x.shape) for x in xs], diffs]))\n"
    )
    cmd = [sys.executable, "-c", code, str(ckpt), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    precision, shapes, diffs = json.loads(done.stdout.splitlines()[-1])
    assert precision == "fp32" and len({tuple(s[2:]) for s in shapes}) >= 3
    assert max(diffs) <= 1e-4, diffs


@pytest.mark.parametrize("normalise", ["fixed", "image"])
def test_onnx_client_finds_vtfm_grasps_top_grasps(
    trained_grasp, normalise: str, tmp_path: Path, capsys
) -> None:
    """examples/onnx_client.py decodes an RGB-D pair from model.json alone, holes and a 16-bit
    RGB view included, with either input normalisation."""
    from PIL import Image

    from vision_tfm.data.grasp import load_depth
    from vision_tfm.export import load_source
    from vision_tfm.grasp import angle_difference
    from vision_tfm.tasks.grasp import predict_grasps

    if normalise == "fixed":
        ckpt, _ = trained_grasp
    else:
        ckpt, _ = _train_tiny_grasp(tmp_path / "run", **{"data.normalise": "image"})
    model = tmp_path / "model.onnx"
    vtfm("export", "--checkpoint", ckpt, "--out", model)
    assert load_source(ckpt).datasets()[1].normalise == normalise  # scored as trained
    view = FIXTURES / "cornell" / "01"
    rgb, depth = view / "pcd0100r.png", view / "pcd0100d.tiff"
    holed = load_depth(depth).copy()  # the centre crop spans x 170..469, y 90..389
    holed[150:200, 250:330], holed[300:304, 400:420], holed[90:93, 170:470] = 0, np.nan, 0
    Image.fromarray(holed).save(tmp_path / "holed.tiff")
    gray16 = np.asarray(Image.open(rgb).convert("L"), dtype=np.uint16) * 257  # 16-bit view
    Image.fromarray(gray16).save(tmp_path / "gray16.png")
    client = Path(__file__).resolve().parents[2] / "examples" / "onnx_client.py"
    capsys.readouterr()
    pairs = [(rgb, depth), (rgb, tmp_path / "holed.tiff"), (tmp_path / "gray16.png", depth)]
    for image, dep in pairs:
        cmd = [sys.executable, str(client), str(model), str(image), "--depth", str(dep), "--top"]
        done = subprocess.run([*cmd, "3", "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        got = json.loads(done.stdout)
        ref, _ = predict_grasps(ckpt, image, dep, 3)
        assert len(got) == len(ref) >= 1, (image.name, dep.name)
        for g, r in zip(got, ref):
            assert abs(g["x"] - r.x) <= 1e-4 and abs(g["y"] - r.y) <= 1e-4, (image.name, dep.name)
            assert angle_difference(g["angle"], r.angle) <= 1e-5, (image.name, dep.name)
            assert g["opening"] == pytest.approx(r.opening, rel=1e-4)
        printed = subprocess.run([*cmd, "3"], capture_output=True, text=True, timeout=120)
        png = tmp_path / f"{image.stem}-{dep.stem}-out.png"
        vtfm("grasp", "--checkpoint", ckpt, image, "--depth", dep, "--top", "3", "--out", png)
        assert_tables_close(capsys.readouterr().out.splitlines()[:-1], printed.stdout.splitlines())


def test_onnx_client_puts_grasps_in_metres_as_vtfm_does(trained_grasp, tmp_path: Path) -> None:
    """examples/onnx_client.py --intrinsics follows model.json's postprocess.metric and the
    docs alone to the metres vtfm gives, on Cornell's real depth with its holes."""
    from vision_tfm.grasp.camera import Intrinsics
    from vision_tfm.tasks.grasp import predict_metric_grasps

    ckpt, _ = trained_grasp
    model = tmp_path / "model.onnx"
    vtfm("export", "--checkpoint", ckpt, "--out", model)
    view = FIXTURES / "cornell" / "01"
    rgb, depth, k = view / "pcd0100r.png", view / "pcd0100d.tiff", "570.3,570.3,319.5,239.5"
    client = Path(__file__).resolve().parents[2] / "examples" / "onnx_client.py"
    cmd = [sys.executable, str(client), str(model), str(rgb), "--depth", str(depth)]
    done = subprocess.run(
        [*cmd, "--top", "3", "--json", "--intrinsics", k], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    ref = predict_metric_grasps(ckpt, rgb, Intrinsics.parse(k), depth, 3)
    assert len(got) == len(ref) >= 1 and all(r.has_depth for r in ref)
    for g, r in zip(got, ref):
        assert [g["x_m"], g["y_m"], g["z_m"]] == pytest.approx([r.x, r.y, r.z], abs=1e-5)
        assert g["opening_m"] == pytest.approx(r.opening, abs=1e-5)
        assert abs((g["yaw"] - r.yaw + math.pi / 2) % math.pi - math.pi / 2) <= 1e-4
    bad = subprocess.run([*cmd, "--intrinsics", "1,2,3"], capture_output=True, text=True)
    assert (
        bad.returncode == 2 and "--intrinsics" in bad.stderr and len(bad.stderr.splitlines()) == 1
    )


def _number(token: str) -> tuple[float, float] | None:
    """A printed number and one unit in its last printed place; None for a word."""
    try:
        value = float(token)
    except ValueError:
        return None
    _, _, decimals = token.partition(".")
    return value, 10.0 ** -len(decimals.rstrip("%"))


def assert_tables_close(got: list[str], want: list[str]) -> None:
    """Two printed tables agree: the same words in the same places, and each number within
    one unit of its last printed digit (two runtimes can round a shared value either way)."""
    assert len(got) == len(want), (got, want)
    for row, (a, b) in enumerate(zip(got, want)):
        ta, tb = a.split(), b.split()
        assert len(ta) == len(tb), (row, a, b)
        for x, y in zip(ta, tb):
            nx, ny = _number(x), _number(y)
            if nx is None or ny is None:
                assert x == y, (row, a, b)
            else:
                assert abs(nx[0] - ny[0]) <= 1.01 * max(nx[1], ny[1]), (row, a, b)


def test_ort_session_spins_within_a_run_and_stops_after_it(tmp_path: Path) -> None:
    """Deployment and benchmark sessions alike: spinning between ops (batch-1 latency), parked
    workers once a run returns (the cores go back to the caller), denormals flushed, and the
    caller's thread left computing denormals as before (onnxruntime flushes it for good)."""
    from vision_tfm.export.onnx import export_onnx, ort_runner, ort_session

    def keeps_denormals() -> bool:
        return bool(np.float32(1e-40) * np.float32(1.0) != 0)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    x = torch.randn(3, 8)
    export_onnx(model, x, tmp_path / "mlp.onnx", output_names=["out"])
    sess = ort_session(tmp_path / "mlp.onnx", threads=2)
    so = sess.get_session_options()
    assert so.intra_op_num_threads == 2
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert so.get_session_config_entry("session.force_spinning_stop") == "1"
    assert so.get_session_config_entry("session.set_denormal_as_zero") == "1"
    assert keeps_denormals()
    torch.testing.assert_close(ort_runner(sess)(x)[0], model(x), atol=1e-6, rtol=1e-6)
    assert keeps_denormals()

"""``vtfm predict``, ``attention`` and ``grasp`` on inputs that turn NaN or inf after
preprocessing: each such file is named in one line and the others are still answered."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_names
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from test_cli_predict import FIX, TINY_VIT, cls_ckpt, grasp_ckpt, run  # noqa: F401

from vision_tfm.errors import DataError
from vision_tfm.io import atomic_save
from vision_tfm.models import create_model
from vision_tfm.tasks.predict import finite_input


@settings(max_examples=50, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6)),
    bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
    data=st.data(),
)
def test_finite_input_refuses_any_non_finite_value(shape, bad: float, data) -> None:
    x = torch.zeros(shape)
    assert finite_input(x, "a.png") is x
    at = tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    x[at] = bad
    with pytest.raises(DataError, match=r"^a\.png: 1 of \d+ input values are NaN or inf"):
        finite_input(x, "a.png")


@pytest.fixture(scope="module")
def underflowing_ckpt(tmp_path_factory) -> Path:
    """A classifier whose std is positive but underflows float32: every input would be inf."""
    d = tmp_path_factory.mktemp("cls")
    meta = {"task": "cls", "num_classes": 10, "in_chans": 1, "img_size": 28}
    meta |= {"class_names": [f"c{i}" for i in range(10)], "mean": [0.13], "std": [1e-45]}
    ck = {
        "model": create_model("vit_mnist", **TINY_VIT).state_dict(),
        "config": {"model": {"name": "vit_mnist", "kwargs": TINY_VIT}},
        "meta": meta,
    }
    atomic_save(ck, d / "ck.pt")
    return d / "ck.pt"


def test_a_std_that_underflows_is_refused_at_load(underflowing_ckpt: Path, capsys) -> None:
    code, out, err = run(capsys, "predict", FIX / "pcd0100r.png", "--checkpoint",
                         underflowing_ckpt)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out, err
    assert_names(err, underflowing_ckpt, "std")


@pytest.mark.parametrize("cmd", ["predict", "attention"])
def test_each_file_with_non_finite_input_is_named_once(
    cls_ckpt: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
    monkeypatch,
    cmd: str,
) -> None:
    """A fault put into preprocessing (NaN for a black image): that file is named, the other
    is answered."""
    from vision_tfm.tasks import predict

    build = predict.build_eval_transform

    def faulty(cfg):
        t = build(cfg)
        return lambda img: t(img) / float(img.max() > 0)  # black: 0/0 = NaN

    monkeypatch.setattr(predict, "build_eval_transform", faulty)
    for name, value in (("black.png", 0), ("grey.png", 200)):
        Image.fromarray(np.full((28, 28), value, np.uint8)).save(tmp_path / name)
    code, out, err = run(capsys, cmd, tmp_path / "black.png", tmp_path / "grey.png",
                         "--checkpoint", cls_ckpt)  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and "nan" not in out.lower(), err
    assert lines[0].startswith(f"skipped: {tmp_path / 'black.png'}: 784 of 784 input values")
    assert lines[1] == "not ok: 1 of 2 images failed (named above)"
    assert (tmp_path / "grey_attention.png").exists() if cmd == "attention" else "c" in out


def test_grasp_names_a_view_whose_input_is_not_finite(
    grasp_ckpt: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
    monkeypatch,
) -> None:
    """A fault put into preprocessing (NaN for a black view): that view is named, the other
    view in the same batch gets its grasps."""
    from vision_tfm.tasks.grasp import predict

    to_input = predict.to_input

    def faulty(rgb, depth, normalise):
        x = to_input(rgb, depth, normalise)
        return x * float("nan") if rgb.max() == 0 else x

    monkeypatch.setattr(predict, "to_input", faulty)
    views = tmp_path / "views"
    views.mkdir()
    for i in (0, 1):
        shutil.copy(FIX / "pcd0100r.png", views / f"pcd010{i}r.png")
        shutil.copy(FIX / "pcd0100d.tiff", views / f"pcd010{i}d.tiff")
    Image.fromarray(np.zeros((480, 640, 3), np.uint8)).save(views / "pcd0100r.png")
    code, out, err = run(capsys, "grasp", views, "--no-overlay", "--top", "1",
                         "--checkpoint", grasp_ckpt)  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and "nan" not in out.lower(), err
    assert_names(lines[0], views / "pcd0100r.png", views / "pcd0100d.tiff")
    assert "NaN or inf" in lines[0] and f"{views / 'pcd0101r.png'}:" in out

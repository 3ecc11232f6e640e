"""Hostile and broken data files: no code runs, every refusal is one line naming the file."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vision_tfm.data import MAX_ASPECT_RATIO, MAX_IMAGE_PIXELS, load_cifar10, load_image
from vision_tfm.data.grasp import (
    GraspDataError,
    load_depth,
    load_rgb,
    read_cornell_rects,
    read_jacquard_grasps,
)
from vision_tfm.errors import DataError, UnsafeFileError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def _cifar(folder: Path, labels: list | None = None) -> Path:
    folder.mkdir(parents=True)
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        with (folder / name).open("wb") as f:
            pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels or [0, 1]}, f)
    return folder


class _RunsCode:
    """Unpickling this calls os.system: the classic pickle payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_cifar_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    folder = _cifar(tmp_path / "c")
    marker = tmp_path / "pwned"
    with (folder / "data_batch_1").open("wb") as f:
        pickle.dump({b"data": _RunsCode(marker), b"labels": [0]}, f)
    with pytest.raises(UnsafeFileError, match=r"data_batch_1: refused.*system") as e:
        load_cifar10(folder)
    _one_line(e)
    assert not marker.exists()
    pickle.load((folder / "data_batch_1").open("rb"))  # plain pickle would have run it
    assert marker.exists()


def test_cifar_pickle_naming_a_missing_module_is_one_line(tmp_path: Path) -> None:
    folder = _cifar(tmp_path / "c")
    payload = b"\x80\x02cno_such_module\nthing\nq\x00)\x81q\x01."  # GLOBAL no_such_module.thing
    (folder / "batches.meta").write_bytes(payload)
    with pytest.raises(UnsafeFileError, match=r"batches\.meta: refused.*no_such_module") as e:
        load_cifar10(folder)
    _one_line(e)


def test_cifar_string_labels_name_the_file(tmp_path: Path) -> None:
    folder = _cifar(tmp_path / "c", labels=["cat", "dog"])
    with pytest.raises(DataError, match=r"data_batch_1: b'labels' must be a list of integers"):
        load_cifar10(folder)


@pytest.mark.parametrize(
    ("size", "what"),
    [((1, 200_000), f"more than {MAX_ASPECT_RATIO}:1"), ((8001, 8001), "pixel limit")],
)
def test_images_past_the_limits_are_refused_before_decoding(tmp_path, size, what) -> None:
    path = tmp_path / "big.png"
    Image.new("L", size).save(path)  # a few KB on disk; decoding is what would cost
    assert path.stat().st_size < 1_000_000
    for load in (lambda: load_image(path, 3), lambda: load_rgb(path)):
        with pytest.raises(DataError, match=what) as e:
            load()
        assert "big.png" in _one_line(e)


def test_pillow_decompression_bomb_becomes_our_error(tmp_path, monkeypatch) -> None:
    path = tmp_path / "bomb.png"
    Image.new("L", (300, 300)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow now raises inside open()
    with pytest.raises(DataError, match=f"{MAX_IMAGE_PIXELS:,}-pixel limit"):
        load_image(path)


def _cornell(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pcd0100cpos.txt"
    path.write_text(text)
    return path


GOOD = "10 10\n20 10\n20 15\n10 15\n"


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        (GOOD + "1e30 10\n20 10\n20 15\n10 15\n", r"pcd0100cpos\.txt:5: rectangle coordinate"),
        (GOOD + "inf 10\n20 10\n20 15\n10 15\n", r"pcd0100cpos\.txt:5: rectangle coordinate"),
        (GOOD + "10 10\n10 10\n10 10\n10 10\n", r"pcd0100cpos\.txt:5: zero-size rectangle"),
        ("10 10\n20 10\n20 10\n10 10\n", r"pcd0100cpos\.txt:1: zero-size rectangle"),
    ],
)
def test_cornell_impossible_rectangles_name_file_and_line(tmp_path, text, msg) -> None:
    with pytest.raises(GraspDataError, match=msg) as e:
        read_cornell_rects(_cornell(tmp_path, text))
    _one_line(e)


def test_cornell_nan_quirk_is_still_skipped(tmp_path) -> None:
    rects, skipped = read_cornell_rects(_cornell(tmp_path, GOOD + "nan 1\n2 3\n4 5\n6 7\n"))
    assert rects.shape == (1, 4, 2) and skipped == 1


@pytest.mark.parametrize(
    ("row", "msg"),
    [
        ("10;10;0;-50;5", r"_grasps\.txt:2: opening and jaw must be > 0"),
        ("10;10;0;20;0", r"_grasps\.txt:2: opening and jaw must be > 0"),
        ("nan;10;0;20;5", r"_grasps\.txt:2: values must be finite"),
        ("10;10;0;1e30;5", r"_grasps\.txt:2: values must be finite"),
    ],
)
def test_jacquard_bad_rows_name_file_and_line(tmp_path, row, msg) -> None:
    path = tmp_path / "0_x_grasps.txt"
    path.write_text(f"10;10;0;20;5\n{row}\n")
    with pytest.raises(GraspDataError, match=msg) as e:
        read_jacquard_grasps(path)
    _one_line(e)


def test_binary_annotation_files_name_the_file(tmp_path) -> None:
    for name, read in (("0_x_grasps.txt", read_jacquard_grasps), ("c.txt", read_cornell_rects)):
        path = tmp_path / name
        path.write_bytes(bytes(range(256)) * 4)
        with pytest.raises(GraspDataError, match=f"{name}: not a text annotation file"):
            read(path)


def test_all_nan_depth_map_is_refused_naming_the_file(tmp_path) -> None:
    src = next((FIXTURES / "cornell").rglob("pcd*d.tiff"))
    assert load_depth(src).shape  # the real file loads
    path = tmp_path / "pcd0100d.tiff"
    Image.fromarray(np.full((48, 64), np.nan, np.float32)).save(path)
    with pytest.raises(GraspDataError, match=r"pcd0100d\.tiff: depth map has no valid pixel"):
        load_depth(path)
    shutil.copy(src, tmp_path / "ok.tiff")
    assert np.isfinite(load_depth(tmp_path / "ok.tiff")).any()

"""Hostile and broken data files: no code runs, every refusal is one line naming the file."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import raises_naming
from PIL import Image

from vision_tfm.data import MAX_ASPECT_RATIO, load_cifar10, load_image
from vision_tfm.data.grasp import (
    MAX_COORD,
    GraspDataError,
    load_depth,
    load_rgb,
    read_cornell_rects,
    read_jacquard_grasps,
)
from vision_tfm.errors import DataError, UnsafeFileError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


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
    with raises_naming(UnsafeFileError, folder / "data_batch_1", "system"):  # file, callable
        load_cifar10(folder)
    assert not marker.exists()
    pickle.load((folder / "data_batch_1").open("rb"))  # plain pickle would have run it
    assert marker.exists()


def test_cifar_pickle_naming_a_missing_module_is_one_line(tmp_path: Path) -> None:
    folder = _cifar(tmp_path / "c")
    payload = b"\x80\x02cno_such_module\nthing\nq\x00)\x81q\x01."  # GLOBAL no_such_module.thing
    (folder / "batches.meta").write_bytes(payload)
    with raises_naming(UnsafeFileError, folder / "batches.meta", "no_such_module"):
        load_cifar10(folder)


def test_cifar_string_labels_name_the_file(tmp_path: Path) -> None:
    folder = _cifar(tmp_path / "c", labels=["cat", "dog"])
    with raises_naming(DataError, folder / "data_batch_1", "b'labels'"):
        load_cifar10(folder)


@pytest.mark.parametrize(
    ("size", "names"), [((1, 200_000), (200_000, MAX_ASPECT_RATIO)), ((8001, 8001), (8001,))]
)
def test_images_past_the_limits_are_refused_before_decoding(tmp_path, size, names) -> None:
    path = tmp_path / "big.png"
    Image.new("L", size).save(path)  # a few KB on disk; decoding is what would cost
    assert path.stat().st_size < 1_000_000
    for load in (lambda: load_image(path, 3), lambda: load_rgb(path)):
        with raises_naming(DataError, path, *names):  # the size, and the ratio it breaks
            load()


def test_pillow_decompression_bomb_becomes_our_error(tmp_path, monkeypatch) -> None:
    path = tmp_path / "bomb.png"
    Image.new("L", (300, 300)).save(path)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow now raises inside open()
    with raises_naming(DataError, path):  # not Pillow's DecompressionBombError
        load_image(path)


def _cornell(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pcd0100cpos.txt"
    path.write_text(text)
    return path


GOOD = "10 10\n20 10\n20 15\n10 15\n"


@pytest.mark.parametrize(
    ("text", "names"),
    [  # file:line, and the bound a coordinate broke
        (GOOD + "1e30 10\n20 10\n20 15\n10 15\n", ("pcd0100cpos.txt:5", f"{MAX_COORD:g}")),
        (GOOD + "inf 10\n20 10\n20 15\n10 15\n", ("pcd0100cpos.txt:5", f"{MAX_COORD:g}")),
        (GOOD + "10 10\n10 10\n10 10\n10 10\n", ("pcd0100cpos.txt:5",)),  # zero size
        ("10 10\n20 10\n20 10\n10 10\n", ("pcd0100cpos.txt:1",)),
    ],
)
def test_cornell_impossible_rectangles_name_file_and_line(tmp_path, text, names) -> None:
    with raises_naming(GraspDataError, *names):
        read_cornell_rects(_cornell(tmp_path, text))


def test_cornell_nan_quirk_is_still_skipped(tmp_path) -> None:
    rects, skipped = read_cornell_rects(_cornell(tmp_path, GOOD + "nan 1\n2 3\n4 5\n6 7\n"))
    assert rects.shape == (1, 4, 2) and skipped == 1


@pytest.mark.parametrize(
    ("row", "names"),
    [  # the fields at fault, or the bound every value must keep
        ("10;10;0;-50;5", ("opening", "jaw", -50)),
        ("10;10;0;20;0", ("opening", "jaw", 0)),
        ("nan;10;0;20;5", (f"{MAX_COORD:g}",)),
        ("10;10;0;1e30;5", (f"{MAX_COORD:g}",)),
    ],
)
def test_jacquard_bad_rows_name_file_and_line(tmp_path, row, names) -> None:
    path = tmp_path / "0_x_grasps.txt"
    path.write_text(f"10;10;0;20;5\n{row}\n")
    with raises_naming(GraspDataError, f"{path}:2", *names):
        read_jacquard_grasps(path)


def test_binary_annotation_files_name_the_file(tmp_path) -> None:
    for name, read in (("0_x_grasps.txt", read_jacquard_grasps), ("c.txt", read_cornell_rects)):
        path = tmp_path / name
        path.write_bytes(bytes(range(256)) * 4)
        with raises_naming(GraspDataError, path):
            read(path)


def test_all_nan_depth_map_is_refused_naming_the_file(tmp_path) -> None:
    src = next((FIXTURES / "cornell").rglob("pcd*d.tiff"))
    assert load_depth(src).shape  # the real file loads
    path = tmp_path / "pcd0100d.tiff"
    Image.fromarray(np.full((48, 64), np.nan, np.float32)).save(path)
    with raises_naming(GraspDataError, path):
        load_depth(path)
    shutil.copy(src, tmp_path / "ok.tiff")
    assert np.isfinite(load_depth(tmp_path / "ok.tiff")).any()

"""Grasp data integrity: duplicate view ids, rectangles outside the image or not rectangular."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_names, raises_naming
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_tfm.data.grasp import (
    CornellGrasp,
    GraspDataError,
    build_grasp_datasets,
    find_cornell_views,
    find_jacquard_views,
    read_cornell_rects,
    read_jacquard_grasps,
)
from vision_tfm.data.grasp.annotations import not_rectangular, share_inside
from vision_tfm.grasp import params_to_corners

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORNELL = FIXTURES / "cornell"
JACQUARD = FIXTURES / "jacquard"
PROP = settings(max_examples=40, deadline=None, derandomize=True, database=None)
RECT = "253 319.7\n309 324\n307 350\n251 345.7\n"

params = st.tuples(
    st.floats(-100, 700),
    st.floats(-100, 600),
    st.floats(-1.6, 1.6),
    st.floats(2, 200),
    st.floats(2, 200),
)


@PROP
@given(params, st.integers(0, 3), st.booleans())
def test_any_rectangle_is_rectangular(p, roll: int, reverse: bool) -> None:
    """Whatever the start corner and handedness (real Cornell files mix both)."""
    corners = np.roll(params_to_corners(np.array(p)), roll, axis=0)
    corners = corners[::-1] if reverse else corners
    assert not not_rectangular(corners[None])[0]


@PROP
@given(params, st.integers(0, 3), st.floats(0.5, 3), st.floats(0, 6.3))
def test_moved_corner_is_not_rectangular(p, k: int, share: float, angle: float) -> None:
    corners = params_to_corners(np.array(p))
    diag = np.linalg.norm(corners[2] - corners[0])
    corners[k] += share * diag * np.array([np.cos(angle), np.sin(angle)])
    assert not_rectangular(corners[None])[0]


def test_bow_tie_is_not_rectangular() -> None:
    corners = params_to_corners(np.array([50, 50, 0.3, 40, 20]))
    assert not_rectangular(corners[[0, 2, 1, 3]][None])[0]
    assert not_rectangular(corners[[0, 1, 3, 2]][None])[0]


@PROP
@given(params)
def test_share_inside_matches_position(p) -> None:
    corners = params_to_corners(np.array(p))[None]
    share = share_inside(corners, (480, 640))[0]
    assert 0 <= share <= 1 + 1e-9
    lo, hi = corners[0].min(axis=0), corners[0].max(axis=0)
    if (lo >= -0.5).all() and hi[0] <= 639.5 and hi[1] <= 479.5:
        assert share == pytest.approx(1)
    if hi[0] < -0.5 or hi[1] < -0.5 or lo[0] > 639.5 or lo[1] > 479.5:
        assert share == 0


def _view(folder: Path, view_id: str = "pcd0100", cpos: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in ("r.png", "d.tiff"):
        shutil.copy(CORNELL / "01" / f"pcd0100{suffix}", folder / f"{view_id}{suffix}")
    target = folder / f"{view_id}cpos.txt"
    if cpos is None:
        shutil.copy(CORNELL / "01" / "pcd0100cpos.txt", target)
    else:
        target.write_text(cpos)
    return target


def test_duplicate_cornell_view_id_names_both_paths(tmp_path: Path) -> None:
    """pcd0101 in two subfolders would be split into both train and val."""
    _view(tmp_path / "01", "pcd0100")
    _view(tmp_path / "01", "pcd0101")
    _view(tmp_path / "02", "pcd0101")
    with raises_naming(
        GraspDataError,
        "pcd0101",
        tmp_path / "01" / "pcd0101r.png",
        tmp_path / "02" / "pcd0101r.png",
    ):
        find_cornell_views(tmp_path)
    with pytest.raises(GraspDataError):
        build_grasp_datasets("cornell", tmp_path)


def test_duplicate_jacquard_view_id_names_both_paths(tmp_path: Path) -> None:
    src = next(JACQUARD.iterdir())
    shutil.copytree(src, tmp_path / "a" / src.name)
    shutil.copytree(src, tmp_path / "b" / src.name)
    with raises_naming(GraspDataError, "twice", tmp_path / "a", tmp_path / "b"):
        find_jacquard_views(tmp_path)


def test_bad_rectangles_skipped_and_counted_once(tmp_path: Path) -> None:
    """A corner at -500,-500 and a skewed quadrilateral: skipped, one warning naming the file."""
    outside = "-500 -500\n-440 -500\n-440 -470\n-500 -470\n"
    skewed = "100 100\n160 100\n300 400\n100 130\n"
    cpos = _view(tmp_path, cpos=RECT + outside + skewed + "NaN NaN\n" * 4)
    with pytest.warns(UserWarning) as warned:
        ds = CornellGrasp(tmp_path)
    msgs = [str(w.message) for w in warned if str(cpos) in str(w.message)]
    assert len(msgs) == 1
    assert_names(msgs[0], cpos, 3, 4, "outside", "rectangular", "NaN")
    assert ds.skipped_rects == 3 and ds.views[0].rects.shape == (1, 4, 2)


def test_clean_file_warns_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rects, skipped = read_cornell_rects(CORNELL / "01" / "pcd0100cpos.txt", (480, 640))
    assert rects.shape == (4, 4, 2) and skipped == 0


def test_view_left_with_no_rectangle_is_an_error(tmp_path: Path) -> None:
    cpos = _view(tmp_path, cpos="-500 -500\n-440 -500\n-440 -470\n-500 -470\n")
    with raises_naming(GraspDataError, cpos, "outside"):
        CornellGrasp(tmp_path)


def test_jacquard_grasps_outside_image_skipped(tmp_path: Path) -> None:
    path = tmp_path / "0_obj_grasps.txt"
    path.write_text("500;500;0;40;10\n5000;5000;0;40;10\n")
    with pytest.warns(UserWarning, match="1 of 2"):
        rows = read_jacquard_grasps(path, (1024, 1024))
    np.testing.assert_array_equal(rows, [[500, 500, 0, 40, 10]])
    path.write_text("5000;5000;0;40;10\n")
    with raises_naming(GraspDataError, path, "outside"):
        read_jacquard_grasps(path, (1024, 1024))

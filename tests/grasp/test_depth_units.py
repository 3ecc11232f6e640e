"""Depth units: float TIFF is metres, 16-bit PNG/TIFF millimetres (or --depth-scale), 8-bit
refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import raises_naming
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from vision_tfm.config import ConfigError
from vision_tfm.data.grasp import DEPTH_SCALE, GraspDataError, load_depth

CORNELL_DEPTH = Path(__file__).parents[1] / "fixtures" / "cornell" / "01" / "pcd0100d.tiff"


def realsense_png(tiff: Path, out: Path) -> Path:
    """What a RealSense driver writes for the same scene: uint16 millimetres, 0 for holes."""
    metres = np.asarray(Image.open(tiff), dtype=np.float32)
    mm = np.where(np.isfinite(metres), np.rint(metres * 1000), 0).clip(0, 65535)
    Image.fromarray(mm.astype(np.uint16)).save(out)
    return out


@pytest.mark.parametrize("suffix", [".png", ".tiff"])
def test_uint16_millimetres_read_as_metres(tmp_path: Path, suffix: str) -> None:
    png = realsense_png(CORNELL_DEPTH, tmp_path / f"d{suffix}")
    ref = load_depth(CORNELL_DEPTH)
    got = load_depth(png)
    assert got.dtype == np.float32 and got.shape == ref.shape
    ok = np.isfinite(ref) & (ref > 0)
    np.testing.assert_allclose(got[ok], ref[ok], atol=0.5e-3 + 1e-6)  # rounded to the mm


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    arrays(np.uint16, (3, 5), elements=st.integers(0, 65535)),
    st.sampled_from([None, 0.001, 0.0001, 0.00025]),
)
def test_integer_depth_is_units_times_scale(tmp_path_factory, units, scale) -> None:
    units[0, 0] = 1000  # one valid pixel
    path = tmp_path_factory.mktemp("d") / "d.png"
    Image.fromarray(units).save(path)
    s = np.float32(DEPTH_SCALE if scale is None else scale)
    np.testing.assert_array_equal(load_depth(path, scale), units.astype(np.float32) * s)


def test_float_tiff_stays_metres_whatever_the_scale() -> None:
    np.testing.assert_array_equal(load_depth(CORNELL_DEPTH, 0.5), load_depth(CORNELL_DEPTH))


@pytest.mark.parametrize(("mode", "shape"), [("L", (4, 4)), ("RGB", (4, 4, 3))])
def test_8bit_and_colour_depth_are_refused_with_the_units(tmp_path, mode, shape) -> None:
    path = tmp_path / "d.png"
    Image.fromarray(np.full(shape, 100, np.uint8), mode).save(path)
    with raises_naming(GraspDataError, path, "metres", "millimetres"):
        load_depth(path)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scale_is_refused(scale) -> None:
    with raises_naming(ConfigError, "scale"):
        load_depth(CORNELL_DEPTH, scale)

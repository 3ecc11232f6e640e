"""Grasps in metres: the conversion recovers the generator's true geometry, and bad input
is one clear error."""

import math

import numpy as np
import pytest

from vision_tfm.data.grasp.synthetic.render import generate_labelled
from vision_tfm.data.grasp.synthetic.scene import SceneSettings
from vision_tfm.errors import ConfigError, DataError
from vision_tfm.grasp import Grasp
from vision_tfm.grasp.camera import Intrinsics, grasp_in_metres, grasps_in_metres


def test_true_rectangles_back_project_within_a_centimetre():
    """200 generated scenes (their noisy, holed depth), every true rectangle: the median
    centre and opening errors against the generator's geometry are within 1 cm."""
    centre_err, opening_err, yaw_err = [], [], []
    for i in range(200):
        view = generate_labelled(i, SceneSettings(seed=7))
        k = view.extra["intrinsics"]
        for j, rect in enumerate(view.rects):
            m = grasp_in_metres(Grasp.from_corners(rect), view.depth, k)
            if not m.has_depth:
                continue
            centre_err.append(np.linalg.norm(np.array([m.x, m.y, m.z]) - view.extra["centres"][j]))
            opening_err.append(abs(m.opening - view.extra["metres"][j, 1]))
            yaw_err.append(abs((m.yaw + m.pixel.angle + math.pi / 2) % math.pi - math.pi / 2))
    assert len(centre_err) > 1000
    assert np.median(centre_err) <= 0.01
    assert np.median(opening_err) <= 0.01
    assert np.median(yaw_err) < math.radians(10)  # tilted surfaces turn it a little


def test_fronto_parallel_plane_is_exact():
    k = Intrinsics(500.0, 520.0, 320.0, 240.0)
    depth = np.full((480, 640), 0.8, np.float32)
    g = Grasp(400.0, 200.0, math.radians(30), 60.0, 20.0)
    m = grasp_in_metres(g, depth, k)
    assert m.z == pytest.approx(0.8)
    assert m.x == pytest.approx(0.8 * 80 / 500) and m.y == pytest.approx(-0.8 * 40 / 520)
    dx, dy = 60 * math.cos(g.angle) * 0.8 / 500, -60 * math.sin(g.angle) * 0.8 / 520
    assert m.opening == pytest.approx(math.hypot(dx, dy))
    assert m.yaw == pytest.approx(math.atan2(dy, dx))


def test_holes_only_has_no_depth_and_partial_holes_are_skipped():
    k = Intrinsics(500.0, 500.0, 320.0, 240.0)
    g = Grasp(320.0, 240.0, 0.0, 40.0, 20.0)
    depth = np.full((480, 640), np.nan, np.float32)
    depth[:, :200] = 0.0
    m = grasp_in_metres(g, depth, k)
    assert not m.has_depth and m.x is None and m.opening is None
    depth[::2] = 0.6  # every other row a hole
    assert grasp_in_metres(g, depth, k).z == pytest.approx(0.6)


@pytest.mark.parametrize("text", ["500,500,320", "500,,320,240", "a,500,320,240",
                                  "0,500,320,240", "500,-1,320,240", "500,500,nan,240",
                                  "500,500,320,inf"])  # fmt: skip
def test_bad_intrinsics_are_one_line(text):
    with pytest.raises(ConfigError, match="intrinsics"):
        Intrinsics.parse(text)


def test_depth_of_another_size_is_a_data_error():
    k = Intrinsics(500.0, 500.0, 320.0, 240.0)
    with pytest.raises(DataError, match=r"depth map \(240, 320\) does not match"):
        grasps_in_metres([], np.ones((240, 320), np.float32), k, (480, 640))

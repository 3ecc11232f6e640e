"""Grasp rectangle geometry against hand-computed values."""

import math

import numpy as np
import pytest

from vision_tfm.grasp.rect import (
    Grasp,
    corners_to_params,
    params_to_corners,
    polygon_area,
    polygon_intersection,
    polygon_iou,
    rotate_points,
    wrap_angle,
)


def square(cx: float, cy: float, side: float, angle: float = 0.0) -> np.ndarray:
    return params_to_corners(np.array([cx, cy, angle, side, side]))


@pytest.mark.parametrize(
    ("p1", "theta"),
    [
        ((10, 0), 0.0),  # opening to the right
        ((-10, 0), 0.0),  # to the left: same grasp, wrapped from pi
        ((0, -10), -math.pi / 2),  # up on screen: +pi/2 wraps to -pi/2
        ((10, -10), math.pi / 4),  # up-right on screen is counter-clockwise, so positive
        ((10, 10), -math.pi / 4),  # down-right
    ],
)
def test_angle_convention(p1: tuple[float, float], theta: float) -> None:
    x1, y1 = p1
    jaw = np.array([-y1, x1]) * 0.4  # any perpendicular jaw side
    corners = np.array([[0, 0], [x1, y1], [x1 + jaw[0], y1 + jaw[1]], jaw])
    x, y, t, opening, jaw_w = corners_to_params(corners)
    assert t == pytest.approx(theta)
    assert opening == pytest.approx(math.hypot(x1, y1))
    assert jaw_w == pytest.approx(0.4 * math.hypot(x1, y1))
    assert (x, y) == pytest.approx(tuple(corners.mean(0)))


def test_cornell_rectangle_by_hand() -> None:
    # First rectangle of pcd0100cpos.txt.
    corners = np.array([[253, 319.7], [309, 324], [307, 350], [251, 345.7]])
    g = Grasp.from_corners(corners)
    assert g.angle == pytest.approx(-math.atan2(4.3, 56))
    assert g.opening == pytest.approx(math.hypot(56, 4.3))
    assert g.jaw == pytest.approx(math.hypot(2, 26))
    assert (g.x, g.y) == pytest.approx((280.0, 334.85))


def test_params_to_corners_by_hand() -> None:
    c = params_to_corners(np.array([5.0, 2.0, 0.0, 10.0, 4.0]))
    np.testing.assert_allclose(c, [[0, 0], [10, 0], [10, 4], [0, 4]], atol=1e-12)
    c = params_to_corners(np.array([0.0, 0.0, math.pi / 2, 10.0, 4.0]))  # opening points up
    np.testing.assert_allclose(c, [[-2, 5], [-2, -5], [2, -5], [2, 5]], atol=1e-12)


def test_round_trip_and_handedness() -> None:
    rng = np.random.default_rng(0)
    params = np.column_stack(
        [
            rng.uniform(0, 200, 50),
            rng.uniform(0, 200, 50),
            rng.uniform(-math.pi / 2, math.pi / 2, 50),
            rng.uniform(5, 80, 50),
            rng.uniform(5, 40, 50),
        ]
    )
    corners = params_to_corners(params)
    np.testing.assert_allclose(corners_to_params(corners), params, atol=1e-9)
    assert all(polygon_area(c) > 0 for c in corners)
    # Mirror order (what a flip does): corner 0 -> 1 is still the opening.
    mirrored = corners[:, [1, 0, 3, 2]]
    back = corners_to_params(mirrored)
    np.testing.assert_allclose(back[:, [0, 1, 3, 4]], params[:, [0, 1, 3, 4]], atol=1e-9)
    diff = np.abs(wrap_angle(back[:, 2] - params[:, 2]))
    assert diff.max() < 1e-9


def test_rotate_scale_translate() -> None:
    g = Grasp(10.0, 0.0, 0.0, 4.0, 2.0)
    r = g.rotate(math.pi / 2, (0.0, 0.0))  # counter-clockwise on screen: right -> up
    assert (r.x, r.y, r.angle) == pytest.approx((0.0, -10.0, -math.pi / 2))
    np.testing.assert_allclose(
        rotate_points(np.array([[10.0, 0.0], [0.0, 5.0]]), math.pi / 2, (0.0, 0.0)),
        [[0.0, -10.0], [5.0, 0.0]],
        atol=1e-12,
    )
    assert polygon_iou(r.corners(), rotate_points(g.corners(), math.pi / 2, (0, 0))) == (
        pytest.approx(1.0)
    )
    s = Grasp(10.0, 20.0, 0.3, 4.0, 2.0).scale(2.0, centre=(10.0, 10.0))
    assert (s.x, s.y, s.angle, s.opening, s.jaw) == pytest.approx((10.0, 30.0, 0.3, 8.0, 4.0))
    t = g.translate(-3.0, 4.5)
    assert (t.x, t.y, t.opening) == (7.0, 4.5, 4.0)


def test_area_and_intersection_by_hand() -> None:
    assert polygon_area(square(0, 0, 2)) == pytest.approx(4.0)
    assert polygon_area(square(0, 0, 2)[::-1]) == pytest.approx(-4.0)
    inter = polygon_intersection(square(1, 1, 2), square(2, 2, 2))  # unit overlap at (1..2)^2
    assert abs(polygon_area(inter)) == pytest.approx(1.0)
    assert len(polygon_intersection(square(0, 0, 1), square(5, 5, 1))) == 0


@pytest.mark.parametrize(
    ("a", "b", "iou"),
    [
        (square(0, 0, 2), square(0, 0, 2), 1.0),  # identical
        (square(0, 0, 2), square(10, 0, 2), 0.0),  # disjoint
        (square(0, 0, 2), square(2, 0, 2), 0.0),  # touching along an edge
        (square(1, 1, 2), square(2, 1, 2), 1 / 3),  # half overlap: 2 / (4 + 4 - 2)
        (square(0, 0, 1), square(0, 0, 1, math.pi / 4), 1 / math.sqrt(2)),  # octagon 2*sqrt2-2
        (square(0, 0, 4), square(0.5, 0, 2), 4 / 16),  # contained
    ],
)
def test_iou_by_hand(a: np.ndarray, b: np.ndarray, iou: float) -> None:
    assert polygon_iou(a, b) == pytest.approx(iou, abs=1e-12)
    assert polygon_iou(b[::-1], a) == pytest.approx(iou, abs=1e-12)  # either handedness


def test_grasp_iou_uses_geometry_not_angle_sign() -> None:
    # A rectangle and its half-turn are the same grasp.
    a = Grasp(50, 50, 0.4, 30, 10)
    b = Grasp(50, 50, 0.4 - math.pi, 30, 10)
    assert a.iou(b) == pytest.approx(1.0)

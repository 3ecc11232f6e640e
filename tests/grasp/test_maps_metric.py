"""Map encoding/decoding and the rectangle metric."""

import math

import numpy as np
import pytest
import torch
from conftest import raises_naming

from vision_tfm.grasp.maps import MAP_KEYS, WIDTH_SCALE, decode_grasps, encode_grasp_maps
from vision_tfm.grasp.metric import (
    angle_difference,
    batch_grasp_correct,
    grasp_correct,
    grasp_matches,
)
from vision_tfm.grasp.rect import Grasp


def test_encode_axis_aligned_by_hand() -> None:
    # Opening 30 -> centre third 10 long: |dx| <= 5 and jaw 10: |dy| <= 5 -> 11 x 11 pixels.
    maps = encode_grasp_maps([Grasp(50, 40, 0.0, 30, 10)], (100, 120))
    q = maps["quality"]
    assert q.shape == (100, 120) and q.dtype == np.float32
    rows, cols = np.nonzero(q)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (35, 45, 45, 55)
    assert q.sum() == 121
    inside = q > 0
    np.testing.assert_allclose(maps["cos"][inside], 1.0)
    np.testing.assert_allclose(maps["sin"][inside], 0.0, atol=1e-7)
    np.testing.assert_allclose(maps["width"][inside], 30 / WIDTH_SCALE)
    assert all(not maps[k][~inside].any() for k in MAP_KEYS)


def test_encode_rotated_and_corners_input() -> None:
    g = Grasp(30, 30, math.pi / 4, 30, 6)
    maps = encode_grasp_maps(g.corners()[None], (64, 64), width_scale=60.0)
    assert maps["cos"][30, 30] == pytest.approx(0.0, abs=1e-6)  # cos 90 deg
    assert maps["sin"][30, 30] == pytest.approx(1.0)
    assert maps["width"][30, 30] == pytest.approx(0.5)
    # 4.2 px along the opening (up-right on screen) is inside the third; across it, it is not.
    assert maps["quality"][30 - 3, 30 + 3] == 1 and maps["quality"][30 + 3, 30 + 3] == 0


def test_encode_tiny_and_outside() -> None:
    tiny = encode_grasp_maps([Grasp(10.3, 7.6, 0.2, 1.0, 0.5)], (20, 20))
    assert tiny["quality"].sum() == 1 and tiny["quality"][8, 10] == 1  # nearest pixel kept
    gone = encode_grasp_maps([Grasp(-50, -50, 0.0, 20, 10)], (20, 20))
    assert gone["quality"].sum() == 0


@pytest.mark.parametrize("width_scale", [WIDTH_SCALE, 100.0])
def test_encode_decode_round_trip(width_scale: float) -> None:
    truth = Grasp(80.0, 60.0, math.radians(-70), 45.0, 15.0)
    maps = encode_grasp_maps([truth], (160, 160), width_scale=width_scale)
    (g,) = decode_grasps(*maps.values(), width_scale=width_scale)
    assert math.hypot(g.x - truth.x, g.y - truth.y) <= 1.0
    assert math.degrees(angle_difference(g.angle, truth.angle)) < 1.0
    assert g.opening == pytest.approx(45.0, abs=1e-3)
    assert g.jaw == pytest.approx(22.5, abs=1e-3)  # opening / 2 by default
    assert grasp_correct([g], truth.corners()[None])


def test_decode_top_n_peaks_and_threshold() -> None:
    truths = [Grasp(30, 30, 0.0, 30, 12), Grasp(90, 90, 1.0, 30, 12), Grasp(95, 30, -1.0, 30, 12)]
    maps = encode_grasp_maps(truths, (128, 128))
    maps["quality"][:64, 64:] *= 0.5  # third grasp weaker
    grasps = decode_grasps(*maps.values(), num_grasps=5, min_distance=10)
    assert len(grasps) == 3
    assert [round(g.x) for g in grasps[2:]] == [95]  # weakest last
    qualities = [g.quality for g in grasps]
    assert qualities == sorted(qualities, reverse=True)
    assert decode_grasps(*maps.values(), threshold=1.5) == []
    assert len(decode_grasps(*maps.values(), num_grasps=5, threshold=0.8)) == 2


def test_decode_min_distance_on_plateau() -> None:
    maps = encode_grasp_maps([Grasp(40, 40, 0.0, 90, 30)], (80, 80))
    unsmoothed = decode_grasps(*maps.values(), num_grasps=50, quality_sigma=0, min_distance=8)
    pts = np.array([(g.x, g.y) for g in unsmoothed])
    gaps = np.abs(pts[:, None] - pts[None]).max(-1) + np.eye(len(pts)) * 1e9
    assert gaps.min() > 8


def test_decode_without_suppression_keeps_the_max_and_adjacent_peaks() -> None:
    q = np.zeros((20, 20), np.float32)
    q[5, 5:9] = [1.0, 0.9, 0.8, 0.7]  # one touching ramp, not a plateau
    zeros = np.zeros_like(q)
    grasps = decode_grasps(q, zeros, zeros, zeros, num_grasps=3, min_distance=0, quality_sigma=0)
    assert [(g.x, g.y) for g in grasps] == [(5.0, 5.0), (6.0, 5.0), (7.0, 5.0)]
    with raises_naming(ValueError, "min_distance", -1):
        decode_grasps(q, zeros, zeros, zeros, min_distance=-1)


def test_decode_smooths_cos_sin_not_angle() -> None:
    # +85 deg left of the peak, -85 deg right of it: both nearly vertical. Averaging raw angles
    # would give 0 (horizontal); averaging cos 2θ / sin 2θ keeps it vertical.
    q = np.zeros((40, 40), np.float32)
    q[20, 20] = 1.0
    angle = np.where(np.arange(40)[None, :] < 20, math.radians(85), math.radians(-85))
    angle = np.broadcast_to(angle, (40, 40))
    cos, sin, width = np.cos(2 * angle), np.sin(2 * angle), np.full((40, 40), 0.2)
    (g,) = decode_grasps(q, cos, sin, width, quality_sigma=0, angle_sigma=3.0)
    assert math.degrees(angle_difference(g.angle, math.pi / 2)) < 5.0


def test_decode_accepts_torch() -> None:
    maps = encode_grasp_maps([Grasp(20, 20, 0.5, 24, 8)], (48, 48))
    tensors = [torch.from_numpy(m)[None] for m in maps.values()]  # (1, H, W)
    (g,) = decode_grasps(*tensors, jaw=5.0)
    assert (round(g.x), round(g.y), g.jaw) == (20, 20, 5.0)
    with raises_naming(ValueError, "(2, 4, 4)"):  # the shape that is no (H, W) map
        decode_grasps(*(torch.zeros(2, 4, 4) for _ in range(4)))


def test_angle_difference_is_mod_pi() -> None:
    assert math.degrees(angle_difference(math.radians(89), math.radians(-89))) == pytest.approx(2)
    assert angle_difference(0.3, 0.3 + math.pi) == pytest.approx(0.0, abs=1e-12)
    assert math.degrees(angle_difference(0.0, math.radians(120))) == pytest.approx(60)


def test_metric_thresholds() -> None:
    gt = Grasp(50, 50, 0.0, 40, 20)
    assert grasp_matches(Grasp(50, 50, math.radians(30), 40, 20), gt)  # angle <= 30 passes
    assert not grasp_matches(Grasp(50, 50, math.radians(31), 40, 20), gt)
    # Same angle shifted along the opening by d: IoU = (40 - d) / (40 + d); 0.25 at d = 24.
    assert not grasp_matches(Grasp(74, 50, 0.0, 40, 20), gt)  # exactly 0.25 is not enough
    assert grasp_matches(Grasp(73.5, 50, 0.0, 40, 20), gt)


def test_top_n_and_empty() -> None:
    gts = np.stack([Grasp(50, 50, 0.0, 40, 20).corners(), Grasp(150, 50, 1.0, 40, 20).corners()])
    bad = Grasp(100, 100, 0.0, 40, 20)
    good = Grasp(151, 49, 1.1, 38, 19)
    assert not grasp_correct([bad, good], gts)
    assert grasp_correct([bad, good], gts, top_n=2)
    assert not grasp_correct([], gts)


def test_batch_grasp_correct_on_model_like_output() -> None:
    views = [[Grasp(40, 40, 0.3, 30, 10)], [Grasp(20, 50, -1.2, 24, 8), Grasp(60, 20, 0, 24, 8)]]
    per_view = [encode_grasp_maps(v, (80, 80)) for v in views]
    out = {k: torch.from_numpy(np.stack([m[k] for m in per_view]))[:, None] for k in MAP_KEYS}
    gts = [np.stack([g.corners() for g in v]) for v in views]
    assert batch_grasp_correct(out, gts) == [True, True]
    wrong = [gts[1], gts[0]]
    assert batch_grasp_correct(out, wrong, top_n=2) == [False, False]


@pytest.mark.parametrize(
    ("opening", "jaw", "angle"), [(60, 20, 0.0), (150, 60, 0.0), (150, 60, 0.7854)]
)
def test_decoded_centre_of_a_flat_topped_peak_is_its_middle(opening, jaw, angle) -> None:
    """An encoded rectangle's quality map is a plateau of 1.0; its raster-first pixel (the
    top-left corner) used to be taken as the centre, up to 28 px off."""
    maps = encode_grasp_maps([Grasp(112, 112, angle, opening, jaw)], (224, 224))
    (g,) = decode_grasps(*(maps[k] for k in MAP_KEYS))
    assert math.hypot(g.x - 112, g.y - 112) <= 1.0
    assert g.angle == pytest.approx(angle, abs=1e-3) and g.opening == pytest.approx(opening)

"""Generated grasp scenes: labels true to the geometry, seeded bytes, the Cornell pipeline."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import raises_naming

from vision_tfm.config import ConfigError
from vision_tfm.data.grasp import GraspAugment, find_cornell_views, load_depth
from vision_tfm.data.grasp.synthetic import (
    FAMILIES,
    SceneSettings,
    SyntheticGrasp,
    generate_labelled,
    generate_view,
    parse_root,
    save_cornell,
    synthetic_datasets,
)
from vision_tfm.data.grasp.synthetic.scene import _chords
from vision_tfm.grasp import batch_grasp_correct, corners_to_params, encode_grasp_maps

CFG = SceneSettings()


@pytest.fixture(scope="module")
def views():
    return [generate_labelled(i, CFG) for i in range(6)]


def test_same_seed_same_bytes_other_seed_other_scene():
    a, b = generate_view(3, CFG), generate_view(3, CFG)
    for k in ("rgb", "depth", "rects", "negatives", "labels"):
        assert getattr(a, k).tobytes() == getattr(b, k).tobytes(), k
    c = generate_view(3, replace(CFG, seed=1))
    assert a.rgb.tobytes() != c.rgb.tobytes()
    assert generate_view(4, CFG).rgb.tobytes() != a.rgb.tobytes()


def test_views_look_like_cornell_files(views):
    for v in views:
        assert v.rgb.shape == (480, 640, 3) and v.rgb.dtype == np.uint8
        assert v.depth.shape == (480, 640) and v.depth.dtype == np.float32
        valid = ~np.isnan(v.depth)
        assert np.isfinite(v.depth[valid]).all() and (v.depth[valid] > 0.2).all()
        assert 0 < (~valid).mean() < 0.5  # the sensor drops some pixels, not most
        assert 0.3 < np.median(v.depth[valid]) < 3.0  # metres, as Cornell's tiffs
        assert len(v.rects) >= 1 and v.rects.shape[1:] == (4, 2)
        assert len(v.owner) == len(v.cuts) == len(v.rects)


def test_depth_is_smooth_on_the_table_but_noisy_and_quantised():
    clean = generate_view(0, replace(CFG, depth_noise=0, dropout=0))
    noisy = generate_view(0, CFG)
    assert not np.isnan(clean.depth).any()
    diff = (noisy.depth - clean.depth)[~np.isnan(noisy.depth)]
    assert 0 < np.abs(diff).mean() < 0.01  # mm-level noise, far below the object heights


def test_rectangles_lie_on_their_object(views):
    for v in views:
        p = corners_to_params(v.rects)
        for (x, y, theta, _, _), k, cut in zip(p, v.owner, v.cuts):
            assert v.labels[round(y), round(x)] == k  # the centre is on the object
            u = np.array([math.cos(theta), -math.sin(theta)])
            pts = np.array([x, y]) + np.linspace(-0.35, 0.35, 9)[:, None] * cut * u
            on = v.labels[np.round(pts[:, 1]).astype(int), np.round(pts[:, 0]).astype(int)] == k
            assert on.mean() >= 0.75  # and so is the cut between the contacts


def test_openings_are_the_cut_plus_clearance_within_the_gripper(views):
    lo, hi = CFG.clearance
    for v in views:
        p = corners_to_params(v.rects)
        assert (p[:, 3] > v.cuts).all()  # plates outside the contacts, in pixels
        cut, opening, clear, cos_lo, cos_hi = v.extra["metres"].T
        assert ((clear >= lo) & (clear <= hi)).all()
        np.testing.assert_allclose(opening, cut + 2 * clear)  # never more than the clearance
        assert (opening <= CFG.max_opening + 1e-9).all()
        cone = math.cos(math.atan(CFG.friction))  # antipodal: both normals in the cone
        assert (cos_lo >= cone).all() and (cos_hi >= cone).all()


def test_chords_of_a_square_find_opposed_normals():
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    c = np.array([[0.5, 0.5], [0.25, 0.5]])
    d = np.array([[1.0, 0.0], [0.0, 1.0]])
    t_lo, t_hi, n_lo, n_hi = _chords(square, c, d)
    np.testing.assert_allclose(t_lo, [-0.5, -0.5])
    np.testing.assert_allclose(t_hi, [0.5, 0.5])
    np.testing.assert_allclose(n_hi, d)
    np.testing.assert_allclose(n_lo, -d)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_yields_grasps(family):
    cfg = replace(CFG, families=(family,), objects=(1, 1))
    assert sum(len(generate_labelled(i, cfg).rects) for i in range(2)) >= 2


def test_dataset_items_run_through_maps_augmentation_and_the_metric():
    train, val, name = synthetic_datasets(
        "synthetic:10", output_size=64, augment=GraspAugment(seed=0), cache=True
    )
    assert (len(train), len(val)) == (8, 2) and name.startswith("synthetic image-wise")
    assert not set(train.ids) & set(val.ids)
    x, maps, rects = val[0]
    assert tuple(x.shape) == (4, 64, 64) and maps["quality"].sum() > 0
    assert ((rects > -32) & (rects < 96)).all()
    x2, _, rects2 = val[0]  # cached and validation-deterministic
    assert np.array_equal(rects, rects2) and bool((x == x2).all())
    xa, _, ra = train[0]
    assert tuple(xa.shape) == (4, 64, 64) and ra.shape == train[0][2].shape
    # the labels score as true: maps drawn from them decode into a matching grasp
    m = encode_grasp_maps(rects, (64, 64))
    assert batch_grasp_correct({k: v[None] for k, v in m.items()}, [rects], min_distance=2) == [
        True
    ]
    gt = val.recropped("grasps")
    assert isinstance(gt, SyntheticGrasp) and gt.ids == val.ids


def test_saved_views_read_back_as_cornell(tmp_path, views):
    v = views[0]
    save_cornell(v, tmp_path, 7)
    (found,), skipped = find_cornell_views(tmp_path)
    assert found.view_id == "pcd0007" and skipped == 0
    np.testing.assert_allclose(found.rects, v.rects, atol=0.006)
    depth = load_depth(found.depth_path)
    assert np.array_equal(np.isnan(depth), np.isnan(v.depth))
    assert (tmp_path / "pcd0007cneg.txt").is_file()


def test_bad_settings_are_one_line_errors():
    with raises_naming(ConfigError, "'bottle'"):
        SceneSettings(families=("bottle",))
    with raises_naming(ConfigError, "['colour']"):
        SceneSettings.from_dict({"colour": 1})
    with raises_naming(ConfigError, "'synthetic:x'"):
        parse_root("synthetic:x")
    assert parse_root("synthetic:12") == 12 and parse_root("synthetic") == 400

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
from vision_tfm.data.grasp.synthetic.scene import _grasps_for, _object_chords
from vision_tfm.data.grasp.synthetic.shapes import Part, _annulus, _fan, _star, make_object
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
    clean = generate_view(0, replace(CFG, depth_noise=0, dropout=0, holes=0))
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


def test_a_window_renders_that_part_of_the_full_view():
    """The centre crop drawn alone: the same labels and clean depth as the full view's crop,
    its rectangles shifted, its intrinsics' principal point moved by the window's corner."""
    clean = replace(CFG, depth_noise=0, dropout=0, holes=0)
    x0, y0, side = box = (170, 90, 300)
    for i in range(4):
        full, win = generate_view(i, clean), generate_view(i, clean, box)
        crop = np.s_[y0 : y0 + side, x0 : x0 + side]
        assert win.rgb.shape == (side, side, 3)
        assert (win.labels == full.labels[crop]).mean() > 0.999  # edge pixels may round apart
        assert np.median(np.abs(win.depth - full.depth[crop])) < 1e-6
        inside = [r for r in full.rects - [x0, y0] if ((r >= 0) & (r < side)).all()]
        for r in inside:  # every rectangle wholly inside the window is found in it
            assert np.abs(win.rects - r).max(axis=(1, 2)).min() < 0.01
        k, kw = full.extra["intrinsics"], win.extra["intrinsics"]
        assert (kw.cx, kw.cy, kw.fx) == pytest.approx((k.cx - x0, k.cy - y0, k.fx))
    with raises_naming(ConfigError, "(500, 90, 300)", "640x480"):
        generate_view(0, CFG, (500, 90, 300))


def test_chords_of_a_square_find_opposed_normals():
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    c = np.array([[0.5, 0.5], [0.25, 0.5]])
    d = np.array([[1.0, 0.0], [0.0, 1.0]])
    t_lo, t_hi, n_lo, n_hi, _ = _object_chords([Part(square, 0.01)], c, d)
    np.testing.assert_allclose(t_lo, [-0.5, -0.5])
    np.testing.assert_allclose(t_hi, [0.5, 0.5])
    np.testing.assert_allclose(n_hi, d)
    np.testing.assert_allclose(n_lo, -d)


def test_chords_through_pieces_that_share_edges_join_into_one():
    """Two unit squares side by side, and a ring cut into quadrilaterals: the contacts are
    where a line leaves the union (x = 0 and 2; the ring's outer and inner walls)."""
    a = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    pair = [Part(a, 0.02), Part(a + np.array([1.0, 0.0]), 0.05)]
    c, d = np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]])
    t_lo, t_hi, n_lo, n_hi, h = _object_chords(pair, c, d)
    np.testing.assert_allclose([t_lo[0], t_hi[0]], [-0.5, 1.5])
    np.testing.assert_allclose(n_lo[0], [-1, 0], atol=1e-12)
    np.testing.assert_allclose(n_hi[0], [1, 0], atol=1e-12)
    assert h[0] == 0.05  # the chord's midpoint (x = 1) is on the taller piece's edge
    ring = [Part(q, 0.01) for q in _annulus(0.05, 0.04, n=24)]
    c, d = np.array([[0.045, 0.0]]), np.array([[1.0, 0.0]])  # across the wall, outwards
    t_lo, t_hi, *_ = _object_chords(ring, c, d)
    np.testing.assert_allclose([0.045 + t_lo[0], 0.045 + t_hi[0]], [0.04, 0.05], atol=1e-9)
    outside = np.array([[0.0, 0.0]])  # the ring's hole: no piece holds it
    assert np.isnan(_object_chords(ring, outside, d)[0]).all()


def test_star_outlines_are_fans_of_counter_clockwise_triangles():
    rng = np.random.default_rng(0)
    outline = _star(0.05, rng)
    r = np.linalg.norm(outline, axis=1)
    assert r.max() == pytest.approx(0.05) and r.min() >= 0.2 * 0.05 - 1e-12
    for tri in _fan(outline):
        e1, e2 = tri[1] - tri[0], tri[2] - tri[0]
        assert e1[0] * e2[1] - e1[1] * e2[0] > 0  # counter-clockwise, as the clipping needs


@pytest.mark.parametrize("family", ["star", "ring", "handle"])
def test_grasps_on_concave_objects_close_on_the_outside(family):
    """On shapes that are not convex, both plates stay outside the object's union and the
    contact normals lie in the friction cone."""
    cfg = replace(CFG, families=(family,))
    cone = math.cos(math.atan(CFG.friction))
    found = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        parts = make_object(family, rng, 1.0, (0.04, 0.2))
        pos, _ = _grasps_for(0, [parts], rng, cfg)
        for pt, d, t_lo, t_hi, _h, clear, _jaw, cos_lo, cos_hi in pos:
            found += 1
            assert cos_lo >= cone and cos_hi >= cone
            for t in (t_lo - clear, t_hi + clear):  # each plate's contact point
                q = (pt + d * t)[None]
                assert not any(np.all(_cross_in(q, p.poly)) for p in parts)
    assert found >= 6


def _cross_in(q, poly):
    e = np.roll(poly, -1, axis=0) - poly
    rel = q[:, None] - poly[None]
    return (e[None, :, 0] * rel[..., 1] - e[None, :, 1] * rel[..., 0] >= 0).all(axis=1)


def test_parametric_sizes_span_the_extent():
    rng = np.random.default_rng(0)
    sides = []
    for family in ("superellipse", "star", "ring", "handle", "flat"):
        for _ in range(40):
            pts = np.concatenate([p.poly for p in make_object(family, rng, 1.0, (0.02, 0.3))])
            sides.append(float((pts.max(0) - pts.min(0)).max()))
    assert min(sides) < 0.03 and max(sides) > 0.25  # 2 cm to 30 cm, longest side
    flat = make_object("flat", rng, 1.0, (0.02, 0.3))
    assert all(0.002 <= p.h <= 0.008 for p in flat)


def test_sheets_and_holes_never_carry_labels():
    """Distractor sheets are drawn but are no object; sensor blobs are holes in depth only."""
    one = replace(CFG, objects=(1, 1), families=("box",))
    plain = replace(one, distractors=(0, 0), holes=0.0, textures=0.0)
    busy = replace(one, distractors=(6, 6), holes=12.0)
    holes = []
    for i in range(4):
        a, b = generate_labelled(i, plain), generate_labelled(i, busy)
        holes.append(np.isnan(b.depth).mean() - np.isnan(a.depth).mean())
        assert set(np.unique(b.labels)) == {0, 1}  # six sheets drawn, one object labelled
        assert (b.owner == 1).all()
    assert np.mean(holes) > 0.002  # a dozen blobs of a few to 25 pixels


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
    # the labels score as true: maps drawn from them decode into a matching grasp, on all but
    # views whose only objects are a few pixels across at this 64-pixel size
    right = 0
    for ds in (train, val):
        for j in range(len(ds)):
            r = ds[j][2]
            m = {k: v[None] for k, v in encode_grasp_maps(r, (64, 64)).items()}
            right += batch_grasp_correct(m, [r], min_distance=2)[0]
    assert right >= 9
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
    with raises_naming(ConfigError, "extent", "(0.001, 0.3)"):
        SceneSettings(extent=(0.001, 0.3))
    with raises_naming(ConfigError, "size_hw", "(100000, 640)"):
        SceneSettings(size_hw=(100000, 640))
    with raises_naming(ConfigError, "distractors"):
        SceneSettings(distractors=(3, 1))
    with raises_naming(ConfigError, "['colour']"):
        SceneSettings.from_dict({"colour": 1})
    with raises_naming(ConfigError, "'synthetic:x'"):
        parse_root("synthetic:x")
    assert parse_root("synthetic:12") == 12 and parse_root("synthetic") == 400
    for huge in ("synthetic:1000000000", "synthetic:" + "9" * 40):  # refused before any index
        with raises_naming(ConfigError, repr(huge), "10,000,000"):
            parse_root(huge)

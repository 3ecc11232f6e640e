"""Cornell / Jacquard loading, splits, bad inputs and grasp-aware augmentation."""

import math
import shutil
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_names, raises_naming
from torch.utils.data import DataLoader

from vision_tfm.config import ConfigError
from vision_tfm.data.grasp import (
    CornellGrasp,
    GraspAugment,
    GraspDataError,
    JacquardGrasp,
    build_grasp_datasets,
    corners_to_jacquard,
    fewer_train_views,
    fill_depth_holes,
    grasp_collate,
    grasp_datasets_from_config,
    jacquard_to_corners,
    kfold_splits,
    normalise_depth,
    read_cornell_rects,
    read_jacquard_grasps,
    resize_area,
    split_ids,
    to_input,
)
from vision_tfm.errors import InputIndexError, MissingFileError
from vision_tfm.grasp import (
    MAP_KEYS,
    Grasp,
    angle_difference,
    batch_grasp_correct,
    decode_grasps,
    encode_grasp_maps,
    polygon_iou,
)
from vision_tfm.tasks.grasp import GraspDataConfig

FIXTURES = Path(__file__).parents[1] / "fixtures"
CORNELL = FIXTURES / "cornell"
JACQUARD = FIXTURES / "jacquard"


def cornell_copy(tmp_path: Path, cpos: str | None = None, depth: bool = True) -> Path:
    """A one-view Cornell folder built from pcd0100, optionally with a replaced cpos.txt."""
    src = CORNELL / "01"
    shutil.copy(src / "pcd0100r.png", tmp_path)
    if depth:
        shutil.copy(src / "pcd0100d.tiff", tmp_path)
    if cpos is None:
        shutil.copy(src / "pcd0100cpos.txt", tmp_path)
    else:
        (tmp_path / "pcd0100cpos.txt").write_text(cpos)
    return tmp_path


RECT = "253 319.7 \n309 324 \n307 350 \n251 345.7\n"


# --- Annotation files ---------------------------------------------------------------------------


def test_read_cornell_with_trailing_spaces() -> None:
    rects, skipped = read_cornell_rects(CORNELL / "01" / "pcd0100cpos.txt")
    assert rects.shape == (4, 4, 2) and rects.dtype == np.float32 and skipped == 0
    np.testing.assert_allclose(rects[0], [[253, 319.7], [309, 324], [307, 350], [251, 345.7]])


def test_read_cornell_skips_nan_rectangles() -> None:
    rects, skipped = read_cornell_rects(CORNELL / "quirks" / "pcd0132cpos.txt")  # real quirk
    assert rects.shape == (3, 4, 2) and skipped == 2
    assert np.isfinite(rects).all()


def test_read_cornell_skips_nan_rectangles_only(tmp_path: Path) -> None:
    """Cornell ships rectangles with NaN corners (skipped, counted); free text is an error."""
    path = tmp_path / "pcd0001cpos.txt"
    path.write_text(RECT + "1 2\nNaN NaN\n4 5\n6 7\n\n")
    rects, skipped = read_cornell_rects(path)
    assert rects.shape == (1, 4, 2) and skipped == 1
    path.write_text(RECT + "1 2\nabc 3\n4 5\n6 7\n\n")
    with raises_naming(GraspDataError, f"{path}:6", "abc 3"):  # file:line, the bad field
        read_cornell_rects(path)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", ()),  # empty
        (RECT + "1 2\n3 4\n5 6\n", (7, 4)),  # 7 corner lines, not a multiple of 4
        ("1 2 3\n" + RECT, (":1", "1 2 3")),  # the line and its three fields
        ("NaN NaN\n" * 4, ("NaN",)),  # nothing left once NaN rectangles are skipped
    ],
)
def test_read_cornell_malformed(tmp_path: Path, text: str, names: tuple) -> None:
    path = tmp_path / "pcd0001cpos.txt"
    path.write_text(text)
    with raises_naming(GraspDataError, path, *names):
        read_cornell_rects(path)


def test_read_jacquard_crlf_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "0_obj_grasps.txt"
    path.write_bytes(b"10;20;30;40;5\r\n10;20;30;40;5\r\n10;20;30;40;7\r\n1;2;3;4;5\r\n")
    np.testing.assert_array_equal(
        read_jacquard_grasps(path), [[10, 20, 30, 40, 5], [10, 20, 30, 40, 7], [1, 2, 3, 4, 5]]
    )
    fixture = next(JACQUARD.rglob("*_grasps.txt"))
    assert read_jacquard_grasps(fixture).shape == (127, 5)


def test_read_jacquard_wrong_field_count(tmp_path: Path) -> None:
    path = tmp_path / "0_obj_grasps.txt"
    path.write_bytes(b"10;20;30;40;5\r\n\r\n10;20;30;40\r\n")
    with raises_naming(GraspDataError, f"{path}:3", 5, 4):  # 5 fields expected, 4 found
        read_jacquard_grasps(path)
    path.write_bytes(b"10;20;x;40;5\r\n")
    with raises_naming(GraspDataError, f"{path}:1", "10;20;x;40;5"):
        read_jacquard_grasps(path)


def test_jacquard_angle_convention_and_round_trip() -> None:
    # Jacquard's theta turns clockwise on screen: 30 deg opens towards (cos 30, +sin 30) in y-down.
    corners = jacquard_to_corners(np.array([[100.0, 80.0, 30.0, 20.0, 10.0]]))[0]
    np.testing.assert_allclose(corners[1] - corners[0], [20 * math.cos(math.pi / 6), 10], atol=1e-4)
    assert Grasp.from_corners(corners).angle == pytest.approx(-math.pi / 6)
    rows = read_jacquard_grasps(next(JACQUARD.rglob("*_grasps.txt")))
    back = corners_to_jacquard(jacquard_to_corners(rows))
    np.testing.assert_allclose(back[:, [0, 1, 3, 4]], rows[:, [0, 1, 3, 4]], atol=1e-3)
    dtheta = (back[:, 2] - rows[:, 2] + 90) % 180 - 90
    np.testing.assert_allclose(dtheta, 0, atol=1e-3)


# --- Datasets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "chans"), [("rgb", 3), ("depth", 1), ("rgbd", 4)])
def test_cornell_end_to_end(mode: str, chans: int) -> None:
    ds = CornellGrasp(CORNELL, input=mode)
    assert ds.ids == ["pcd0100", "pcd0101", "pcd0102"] and ds.in_chans == chans
    loader = DataLoader(ds, batch_size=3, collate_fn=grasp_collate)
    x, maps, rects = next(iter(loader))
    assert x.shape == (3, chans, 224, 224) and x.dtype == torch.float32
    assert all(maps[k].shape == (3, 1, 224, 224) for k in MAP_KEYS)
    assert torch.isfinite(x).all() and all(maps["quality"][i].sum() > 50 for i in range(3))
    assert [r.shape for r in rects] == [(4, 4, 2), (4, 4, 2), (4, 4, 2)]
    assert all(((r > 0) & (r < 223)).all() for r in rects)  # crop centred on the grasps
    if mode != "rgb":
        assert x[:, -1].mean(dim=(1, 2)).abs().max() < 1e-4  # depth is mean-subtracted
    assert batch_grasp_correct(maps, rects) == [True, True, True]


@pytest.mark.parametrize(
    ("crop", "x0", "y0"),
    [
        ("grasps", 135, 152),  # pcd0100: corner mean (285.125, 301.96) -> GG-CNN's crop
        ("centre", 170, 90),  # 640x480 view: (640 - 300) / 2, (480 - 300) / 2
    ],
)
def test_cornell_crop_maps_rectangles_by_hand(crop: str, x0: int, y0: int) -> None:
    ds = CornellGrasp(CORNELL / "01", ids=["pcd0100"], input="rgb", crop=crop)
    _, _, rects = ds[0]
    s = 224 / 300
    expected = [(253 - x0 + 0.5) * s - 0.5, (319.7 - y0 + 0.5) * s - 0.5]
    np.testing.assert_allclose(rects[0, 0], expected, rtol=1e-5)


def test_jacquard_end_to_end() -> None:
    ds = JacquardGrasp(JACQUARD, input="rgbd")
    assert ds.ids == ["1a9fa4c269cfcc1b738e43095496b061_0"]
    x, maps, rects = ds[0]
    assert x.shape == (4, 224, 224) and rects.shape == (127, 4, 2)
    # Whole 1024 image kept (crop at 0, 0), then resized to 224.
    rows = read_jacquard_grasps(next(JACQUARD.rglob("*_grasps.txt")))
    expected = (jacquard_to_corners(rows) + 0.5) * 224 / 1024 - 0.5
    np.testing.assert_allclose(rects, expected, atol=1e-4)
    assert batch_grasp_correct({k: v[None] for k, v in maps.items()}, [rects]) == [True]


def test_nan_rectangle_skipped_with_count(tmp_path: Path) -> None:
    root = cornell_copy(tmp_path, cpos=RECT + "NaN NaN \n1 2\n3 4\nNaN NaN\n")
    with pytest.warns(UserWarning) as warned:
        ds = CornellGrasp(root)
    assert_names(str(warned[0].message), root, 1)  # the dataset and how many were skipped
    assert ds.skipped_rects == 1 and ds[0][2].shape == (1, 4, 2)


def test_malformed_file_in_dataset(tmp_path: Path) -> None:
    root = cornell_copy(tmp_path, cpos=RECT + "1 2\n")
    with raises_naming(GraspDataError, "pcd0100cpos.txt", 5):  # 5 corner lines
        CornellGrasp(root)


def test_missing_depth(tmp_path: Path) -> None:
    root = cornell_copy(tmp_path, depth=False)
    with raises_naming(MissingFileError, "pcd0100d.tiff", "rgbd"):
        CornellGrasp(root, input="rgbd")
    assert CornellGrasp(root, input="rgb")[0][0].shape == (3, 224, 224)


def test_root_without_views(tmp_path: Path) -> None:
    with raises_naming(MissingFileError, tmp_path, "Cornell"):
        CornellGrasp(tmp_path)
    with raises_naming(MissingFileError, tmp_path, "Jacquard"):
        JacquardGrasp(tmp_path)


def test_image_smaller_than_crop() -> None:
    # caught when the dataset is built (image headers), before any run directory exists
    with raises_naming(GraspDataError, "pcd0100r.png", 640, 480, 500):  # image size, crop
        CornellGrasp(CORNELL, input="rgb", crop_size=500)


# --- Depth and splits ---------------------------------------------------------------------------


def test_depth_holes_and_normalisation() -> None:
    depth = np.full((20, 20), 1.0, np.float32)
    depth[:, 10:] = 2.0
    depth[5, 3], depth[6, 15], depth[0, 0] = np.nan, 0.0, np.inf
    filled = fill_depth_holes(depth)
    assert np.isfinite(filled).all() and filled.min() > 0.9 and filled.max() < 2.1
    assert filled[5, 3] == pytest.approx(1.0, abs=0.05) and filled[6, 15] == pytest.approx(2.0)
    norm = normalise_depth(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), clip=10.0)
    np.testing.assert_allclose(norm, [[-1.5, -0.5], [0.5, 1.5]])
    clipped = normalise_depth(np.array([[0.0, 10.0], [1.0, 1.0]], np.float32), clip=1.0)
    np.testing.assert_allclose(clipped, [[-1.0, 1.0], [-1.0, -1.0]])  # mean 3


def test_per_image_normalisation_by_hand() -> None:
    rgb = np.zeros((2, 2, 3), np.uint8)
    rgb[0] = 200  # half the pixels 200, half 0: mean 100, std 100 over all values
    depth = np.array([[-0.1, 0.1], [-0.1, 0.1]], np.float32)  # already minus its mean
    x = to_input(rgb, depth, "image")
    np.testing.assert_allclose(x[:3, 0].numpy(), 1.0)
    np.testing.assert_allclose(x[:3, 1].numpy(), -1.0)
    np.testing.assert_allclose(x[3].numpy(), [[-1.0, 1.0], [-1.0, 1.0]], rtol=1e-6)
    # lighting (gain and offset) and depth scale drop out per image, not with fixed statistics
    lit = (rgb // 2 + 20).astype(np.uint8)
    torch.testing.assert_close(to_input(lit, depth * 3, "image"), x)
    fixed = to_input(rgb, depth)  # ImageNet RGB, depth untouched
    np.testing.assert_allclose(fixed[0, 1].numpy(), -0.485 / 0.229, rtol=1e-6)
    np.testing.assert_allclose(fixed[3].numpy(), depth)
    ds = CornellGrasp(CORNELL / "01", ids=["pcd0100"], input="rgbd", normalise="image")
    x0 = ds[0][0]
    assert x0[:3].mean().abs() < 1e-4 and (x0[:3].std() - 1).abs() < 1e-3
    assert x0[3].mean().abs() < 1e-4 and (x0[3].std() - 1).abs() < 1e-3
    assert ds.recropped("grasps").normalise == "image"


def test_holes_fill_in_rounds_from_their_valid_neighbours() -> None:
    """The stated rule, exactly: model.json promises it to runtimes without vision_tfm."""
    depth = np.arange(1, 26, dtype=np.float32).reshape(5, 5)
    depth[1:4, 1:4] = 0.0  # a 3x3 hole: its ring fills first, its centre next
    filled = fill_depth_holes(depth)
    assert filled[1, 1] == np.float32((1 + 2 + 3 + 6 + 11) / 5)
    assert filled[1, 2] == np.float32((1 + 2 + 3 + 4 + 5) / 5)  # a neighbour hole is no source
    ring = [filled[r, c] for r in (1, 2, 3) for c in (1, 2, 3) if (r, c) != (2, 2)]
    assert filled[2, 2] == np.float32(np.sum(np.float64(ring)) / 8)
    assert (filled[0] == depth[0]).all() and filled.dtype == np.float32


def test_area_resize_is_opencvs_inter_area_when_shrinking() -> None:
    """The numpy resize replaced cv2.INTER_AREA: trained models see the same inputs."""
    import cv2

    rng = np.random.default_rng(0)
    for shape, size in (((300, 300, 3), 224), ((97, 97), 32), ((1024, 1024), 224)):
        u8 = rng.integers(0, 256, shape, dtype=np.uint8)
        ref = cv2.resize(u8, (size, size), interpolation=cv2.INTER_AREA).astype(int)
        diff = np.abs(resize_area(u8, size).astype(int) - ref)
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, shape
        f32 = rng.random(shape, dtype=np.float32)
        out = resize_area(f32, size)
        ref = cv2.resize(f32, (size, size), interpolation=cv2.INTER_AREA)
        assert out.dtype == np.float32 and np.abs(out - ref).max() < 1e-6, shape
    up = resize_area(np.array([[0.0, 4.0], [8.0, 12.0]], np.float32), 4)
    np.testing.assert_array_equal(up, np.repeat(np.repeat([[0, 4], [8, 12]], 2, 0), 2, 1))


def test_split_ids() -> None:
    ids = [f"pcd{i:04d}" for i in range(100, 170)]
    img = split_ids(ids, "image", 0.8, seed=0)
    assert (len(img.train), len(img.val)) == (56, 14) and "56 train / 14 val" in img.name
    assert sorted(img.train + img.val) == ids and img.train != ids[:56]
    assert split_ids(ids, "image", 0.8, seed=0) == img != split_ids(ids, "image", 0.8, seed=1)
    obj = split_ids(ids[::-1], "object", 0.8)
    assert obj.train == ids[:56] and obj.val == ids[56:] and obj.name.startswith("object-wise")
    grouped = split_ids(ids[:10], "object", 0.5, groups=["a"] * 4 + ["b"] * 3 + ["c"] * 3)
    assert len(grouped.train) == 7  # the cut moves to the end of object "b"
    with raises_naming(ValueError, "random"):
        split_ids(ids, "random")


@pytest.mark.parametrize("split", ["image", "object"])
def test_kfold_splits_are_disjoint_and_cover_every_view(split: str) -> None:
    ids = [f"pcd{i:04d}" for i in range(100, 170)]
    objects = [f"obj{int(i[3:]) // 4}" for i in ids]  # 4 consecutive views per object
    folds = kfold_splits(ids[::-1], 5, split, seed=0, groups=objects[::-1])
    vals = [f.val for f in folds]
    assert sorted(i for v in vals for i in v) == ids  # every view validated exactly once
    for f in folds:
        assert set(f.train).isdisjoint(f.val) and sorted(f.train + f.val) == ids
        assert f"{len(f.train)} train / {len(f.val)} val" in f.name
    if split == "image":
        assert [len(v) for v in vals] == [14] * 5 and vals[0] != ids[:14]
        assert kfold_splits(ids, 5, seed=1)[0].val != vals[0]
    else:  # whole objects: no object on both sides of any fold
        obj = dict(zip(ids, objects))
        for f in folds:
            assert {obj[i] for i in f.train}.isdisjoint({obj[i] for i in f.val})
        assert all(
            v == sorted(v) and ids.index(v[-1]) - ids.index(v[0]) == len(v) - 1 for v in vals
        )
    with raises_naming(ValueError, 4, 3):  # 4 folds of 3 views
        kfold_splits(ids[:3], 4)


def test_fewer_train_views_grow_by_adding_views_and_keep_validation() -> None:
    ids = [f"pcd{i:04d}" for i in range(100, 170)]
    fold = kfold_splits(ids, 5, seed=0)[0]
    kept = [fewer_train_views(fold, n, seed=0) for n in (7, 14, 28, 56)]
    for n, k in zip((7, 14, 28, 56), kept):
        assert len(k.train) == len(set(k.train)) == n and k.train == sorted(k.train)
        assert k.val == fold.val and set(k.train) <= set(fold.train)
        assert f"{n} of 56 train / 14 val" in k.name or n == 56
    assert kept[-1] == fold  # all of them: the split itself
    for small, large in pairwise(kept):
        assert set(small.train) < set(large.train)  # nested: views are added, never swapped
    assert fewer_train_views(fold, 7, seed=1).train != kept[0].train
    for n in (0, 57):
        with raises_naming(ValueError, "train_views", 56, n):
            fewer_train_views(fold, n)


def test_train_views_setting_trains_on_a_subset() -> None:
    d = GraspDataConfig(root=str(CORNELL), input="rgb", folds=3, fold=0, train_views=1)
    train, val, name = grasp_datasets_from_config(d, seed=0)
    full, val_all, _ = grasp_datasets_from_config(replace(d, train_views=0), seed=0)
    assert len(train.ids) == 1 and set(train.ids) < set(full.ids)
    assert val.ids == val_all.ids and "1 of 2 train / 1 val" in name
    with raises_naming(ConfigError, "data.train_views"):  # checked where the setting enters
        GraspDataConfig(train_views=-1)


def test_build_grasp_datasets_fold_and_crops() -> None:
    got = [build_grasp_datasets("cornell", CORNELL, folds=3, fold=k, input="rgb") for k in range(3)]
    assert sorted(v.ids[0] for _, v, _ in got) == ["pcd0100", "pcd0101", "pcd0102"]
    train, val, name = got[0]
    assert "fold 1/3: 2 train / 1 val" in name and val.crop == "centre"
    assert train.crop == "centre" and val.recropped("grasps").crop == "grasps"
    with raises_naming(ValueError, "data.fold", 3):  # checked where the setting enters
        GraspDataConfig(folds=3, fold=3)


def test_build_grasp_datasets() -> None:
    train, val, name = build_grasp_datasets("cornell", CORNELL, train_frac=0.67, input="rgb")
    assert (len(train), len(val)) == (2, 1) and name.startswith("cornell image-wise")
    assert train.augment is not None and val.augment is None
    assert set(train.ids).isdisjoint(val.ids)


def test_datasets_from_config_read_every_data_setting() -> None:
    d = GraspDataConfig(
        root=str(CORNELL), input="rgb", split="object", folds=3, fold=1, output_size=64,
        crop_size=200, normalise="image", width_scale=90.0,
    )  # fmt: skip
    train, val, name = grasp_datasets_from_config(d, seed=0, repeat=2)
    assert name.startswith("cornell object-wise") and "fold 2/3" in name
    assert (len(train), val.ids) == (4, ["pcd0101"])
    for ds in (train, val):
        assert (ds.input, ds.output_size, ds.crop_size) == ("rgb", 64, 200)
        assert (ds.normalise, ds.width_scale, ds.augment) == ("image", 90.0, None)


def test_repeat_serves_each_training_view_several_times_freshly_augmented() -> None:
    train, val, _ = build_grasp_datasets(
        "cornell", CORNELL, train_frac=0.67, input="rgb", repeat=3, output_size=64
    )
    assert (len(train), len(val)) == (6, 1) and len(train.ids) == 2  # ids name views, once
    a, _, ra = train[0]
    b, _, rb = train[2]  # same view, second pass
    assert ra.shape == rb.shape and not torch.equal(a, b)
    with raises_naming(InputIndexError, 6):  # an IndexError too: iteration stops there
        train[6]


def test_cached_views_match_decoding_and_stay_unchanged_under_augmentation() -> None:
    plain = CornellGrasp(CORNELL, input="rgbd", output_size=64)
    cached = CornellGrasp(CORNELL, input="rgbd", output_size=64, cache=True)
    for _ in range(2):  # the second pass is served from the cache
        for i in range(len(plain)):
            (x, maps, rects), (xc, mapsc, rectsc) = plain[i], cached[i]
            assert torch.equal(x, xc) and np.array_equal(rects, rectsc)
            assert all(torch.equal(maps[k], mapsc[k]) for k in MAP_KEYS)
    cached.augment = GraspAugment(seed=0)
    before = [tuple(None if a is None else a.copy() for a in v) for v in cached.cache.values()]
    for i in range(len(cached)):
        cached[i]
    after = list(cached.cache.values())
    for b, a in zip(before, after):
        assert all(np.array_equal(u, v) for u, v in zip(b, a))  # augmentation never writes back


# --- Augmentation -------------------------------------------------------------------------------


def fixed(**kwargs: object) -> GraspAugment:
    options = dict(rotate=(0, 0), zoom=(1, 1), translate=0, hflip=0, vflip=0, color_jitter=0)
    return GraspAugment(**{**options, "depth_noise": 0, **kwargs}, seed=0)


def marked_view() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A 64x64 view with a bright pixel on corner (40, 30) of the rectangle."""
    rgb = np.zeros((64, 64, 3), np.uint8)
    rgb[30, 40] = 255
    depth = np.zeros((64, 64), np.float32)
    depth[30, 40] = 1.0
    rects = np.array([[[40, 30], [50, 30], [50, 36], [40, 36]]], np.float32)
    return rgb, depth, rects


def test_augment_rotate_90_by_hand() -> None:
    rgb, depth, rects = marked_view()
    rgb, depth, out = fixed(rotate=(90, 90))(rgb, depth, rects)
    # About the centre (31.5, 31.5), counter-clockwise on screen: (x, y) -> (y, 63 - x).
    np.testing.assert_allclose(out[0], [[30, 23], [30, 13], [36, 13], [36, 23]], atol=1e-4)
    assert rgb[23, 30, 0] == 255 and depth[23, 30] == pytest.approx(1.0)
    g = Grasp.from_corners(out[0])
    assert g.angle == pytest.approx(-math.pi / 2) and g.opening == pytest.approx(10)


def test_augment_hflip_by_hand() -> None:
    rgb, depth, rects = marked_view()
    rgb, depth, out = fixed(hflip=1.0)(rgb, depth, rects)
    np.testing.assert_allclose(out[0], [[23, 30], [13, 30], [13, 36], [23, 36]])
    assert rgb[30, 23, 0] == 255 and depth[30, 23] == 1.0
    tilted = Grasp(30, 30, 0.4, 20, 6)
    (flipped,) = fixed(hflip=1.0)(rgb, depth, tilted.corners()[None])[2]
    g = Grasp.from_corners(flipped)  # handedness reversed, angle mirrored
    assert (g.x, g.angle, g.opening) == pytest.approx((33, -0.4, 20), abs=1e-4)


def test_colour_jitter_rgb_only_depth_noise_depth_only() -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
    depth = rng.normal(0, 0.1, (32, 32)).astype(np.float32)
    rects = np.zeros((1, 4, 2), np.float32)
    rgb2, depth2, _ = fixed(color_jitter=0.5, color_p=1.0)(rgb, depth, rects)
    assert not np.array_equal(rgb2, rgb)
    np.testing.assert_array_equal(depth2, depth)
    rgb3, depth3, _ = fixed(depth_noise=0.01)(rgb, depth, rects)
    np.testing.assert_array_equal(rgb3, rgb)
    assert 0.005 < np.std(depth3 - depth) < 0.02
    assert GraspAugment(seed=0)(None, depth, rects)[0] is None


def test_augment_then_encode_decode_round_trip() -> None:
    truth = Grasp(100.0, 90.0, math.radians(20), 60.0, 20.0)
    rgb = np.zeros((224, 224, 3), np.uint8)
    aug = fixed(rotate=(37, 37), zoom=(1.1, 1.1), hflip=1.0)
    _, _, rects = aug(rgb, None, truth.corners()[None])
    centre = (111.5, 111.5)
    expected = truth.rotate(math.radians(37), centre).scale(1.1, centre)
    expected = Grasp(223 - expected.x, expected.y, -expected.angle, expected.opening, expected.jaw)
    assert polygon_iou(rects[0], expected.corners()) == pytest.approx(1.0, abs=1e-5)
    (g,) = decode_grasps(*encode_grasp_maps(rects, (224, 224)).values())
    assert math.hypot(g.x - expected.x, g.y - expected.y) <= 1.0
    assert math.degrees(angle_difference(g.angle, expected.angle)) <= 1.0
    assert g.opening == pytest.approx(66.0, abs=1.0)


def test_dataset_with_augmentation_stays_consistent() -> None:
    ds = CornellGrasp(CORNELL, input="rgbd", augment=GraspAugment(seed=1))
    x, maps, rects = ds[2]
    assert x.shape == (4, 224, 224) and rects.shape == (4, 4, 2)
    assert batch_grasp_correct({k: v[None] for k, v in maps.items()}, [rects]) == [True]

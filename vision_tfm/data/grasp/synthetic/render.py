"""One generated view: table, shadows, z-buffered objects, the depth sensor's faults, and the
labels projected from the geometry and kept where they can be seen."""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from vision_tfm.errors import ConfigError
from vision_tfm.grasp.rect import params_to_corners

from .scene import (
    Camera,
    Part,
    SceneSettings,
    SyntheticView,
    _grasp_rect,
    _grasps_for,
    _make_object,
    _moved,
    grasp_centre,
)


def _colour(rng: np.random.Generator, dark: float = 0.25) -> np.ndarray:
    """An object colour in RGB 0-255: saturated, pale or (with probability ``dark``) dark."""
    hsv = np.array(
        [[[rng.uniform(0, 180), rng.uniform(0.2, 1.0) * 255, rng.uniform(0.45, 1.0) * 255]]],
        np.uint8,
    )
    if rng.random() < dark:
        hsv[..., 2] = rng.uniform(25, 70)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float32)


def _fill(shape: tuple[int, int], polys: Sequence[np.ndarray], off: np.ndarray) -> np.ndarray:
    m = np.zeros(shape, np.uint8)
    for p in polys:
        cv2.fillConvexPoly(m, np.round((p - off) * 4).astype(np.int32), 1, cv2.LINE_8, 2)
    return m.astype(bool)


_BANK: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
_PAD = 64


def _noise(rng: np.random.Generator, H: int, W: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal and uniform ``(H, W)`` float32 fields: windows at a seeded offset into
    fixed banks drawn once per process, since drawing 300k normals per view would cost more
    than rendering it (the offsets come from the view's own generator: same bytes per seed)."""
    if (H, W) not in _BANK:
        bank = np.random.default_rng(12345)
        _BANK[H, W] = (
            bank.standard_normal((H + _PAD, W + _PAD), dtype=np.float32),
            bank.random((H + _PAD, W + _PAD), dtype=np.float32),
        )
    normal, uniform = _BANK[H, W]
    (a, b), (c, d) = rng.integers(0, _PAD, (2, 2))
    return normal[a : a + H, b : b + W], uniform[c : c + H, d : d + W]


def generate_view(index: int, settings: SceneSettings | None = None) -> SyntheticView:
    """Render view ``index`` of ``settings.seed``: the same bytes for the same pair."""
    cfg = settings or SceneSettings()
    rng = np.random.default_rng([cfg.seed, index])
    H, W = cfg.size_hw
    cam = Camera(
        float(rng.uniform(540, 600)),
        W / 2 + float(rng.uniform(-10, 10)),
        H / 2 + float(rng.uniform(-10, 10)),
        float(rng.uniform(*cfg.tilt)),
        float(rng.uniform(*cfg.distance)),
    )
    rows = np.arange(H, dtype=np.float32)[:, None]
    cols = np.arange(W, dtype=np.float32)[None]
    # --- scene layout, in table metres
    n_obj = int(rng.integers(cfg.objects[0], cfg.objects[1] + 1))
    objects: list[list[Part]] = []
    placed: list[tuple[np.ndarray, float]] = []
    spread = 0.07 + 0.03 * n_obj
    for _ in range(n_obj):
        parts = _make_object(str(rng.choice(cfg.families)), rng, cfg.size)
        pts = np.concatenate([p.poly for p in parts])
        centre = (pts.max(0) + pts.min(0)) / 2
        radius = float(np.linalg.norm(pts - centre, axis=1).max())
        for _try in range(20):
            at = rng.uniform(-spread, spread, 2) - centre
            if all(np.linalg.norm(at + centre - c) > radius + r + 0.01 for c, r in placed):
                placed.append((at + centre, radius))
                objects.append(_moved(parts, *at))
                break
    # --- table, floor and background: the table's Y depends on the row alone, its X bounds
    # are a column interval per row, so nothing here needs per-pixel table coordinates
    ext = rng.uniform([-0.75, -0.4, 0.35, 0.45], [-0.35, -0.25, 0.75, 0.9])  # x0, y0, x1, y1
    z_table = cam.plane_depth(rows, 0.0)  # (H, 1)
    y_row = cam.back_project(np.full_like(rows, cam.cx), rows, 0.0)[..., 1]
    on_table = (
        (cols > cam.cx + cam.f * ext[0] / z_table) & (cols < cam.cx + cam.f * ext[2] / z_table)
        & (y_row > ext[1]) & (y_row < ext[3])
    )  # fmt: skip
    floor = 0.72
    depth = np.where(on_table, z_table, cam.plane_depth(rows, -floor)).astype(np.float32)
    kind = rng.integers(3)
    table_rgb = [
        rng.uniform(205, 245, 3) * [1, 0.99, 0.97],  # white board
        np.array([205, 170, 125]) * rng.uniform(0.85, 1.1),  # light wood
        rng.uniform(140, 185) * np.array([1, 1, 1.02]),  # grey
    ][kind].astype(np.float32)
    floor_rgb = (np.array([95, 80, 65]) * rng.uniform(0.6, 1.3)).astype(np.float32)
    low = rng.normal(0, 1, (6, 8)).astype(np.float32)  # slow lighting variation
    light = 1 + 0.08 * cv2.resize(low, (W, H), interpolation=cv2.INTER_CUBIC)
    # colour is planar (3, H, W) until the end: per-pixel factors broadcast over whole rows
    rgb = np.where(on_table, table_rgb[:, None, None], floor_rgb[:, None, None])
    if kind == 1:  # wood grain along the table's X
        xs = ((cols - cam.cx) / cam.f * z_table).astype(np.float32)
        rgb += 8 * np.sin(xs * np.float32(rng.uniform(150, 400)))
    # --- shadows: each part's footprint swept along the light's direction
    sun = rng.uniform(0, 2 * math.pi)
    sweep = np.array([math.cos(sun), math.sin(sun)]) * rng.uniform(0.2, 0.8)
    shadow = np.zeros((H, W), np.uint8)
    for parts in objects:
        for p in parts:
            hull = cv2.convexHull(np.concatenate([p.poly, p.poly + sweep * p.h]).astype(np.float32))
            px = cam.project(hull[:, 0].astype(np.float64), 0.0)
            cv2.fillConvexPoly(shadow, np.round(px * 4).astype(np.int32), 255, cv2.LINE_8, 2)
    shadow = cv2.GaussianBlur(shadow, (0, 0), 2.5).astype(np.float32) / 255
    rgb *= light * (1 - rng.uniform(0.3, 0.5) * shadow * on_table)
    # --- objects: z-buffered prisms, top face lit, walls darker
    labels = np.zeros((H, W), np.uint8)
    for k, parts in enumerate(objects, start=1):
        colour = _colour(rng)
        stripes = rng.random() < 0.3
        period, phase = rng.uniform(0.01, 0.03), rng.uniform(0, 2 * math.pi)
        for p in parts:
            base, top = cam.project(p.poly, 0.0), cam.project(p.poly, p.h)
            allpx = np.concatenate([base, top])
            x0, y0 = np.floor(allpx.min(0)).astype(int) - 1
            x1, y1 = np.ceil(allpx.max(0)).astype(int) + 2
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, W), min(y1, H)
            if x1 <= x0 or y1 <= y0:
                continue
            off = np.array([x0, y0], np.float64)
            shape = (y1 - y0, x1 - x0)
            hull = cv2.convexHull(allpx.astype(np.float32))[:, 0].astype(np.float64)
            sil = _fill(shape, [hull], off)
            r = rows[y0:y1]
            u, v = np.broadcast_arrays(cols[:, x0:x1], r)
            if p.lying is not None:  # height and normal across the cylinder's axis
                axis, rad = p.lying
                xy = cam.back_project(u, v, rad)
                mid = p.poly.mean(0)
                across = (xy - mid) @ np.array([-math.sin(axis), math.cos(axis)])
                along = np.abs((xy - mid) @ np.array([math.cos(axis), math.sin(axis)]))
                half = np.linalg.norm(p.poly[1] - p.poly[0]) / 2
                inside = (np.abs(across) < rad) & (along < half)
                up = np.sqrt(np.clip(1 - (across / rad) ** 2, 0, 1))  # the normal's up part
                z = cam.plane_depth(v, np.where(inside, rad * (1 + up), rad)).astype(np.float32)
                shade = np.where(inside, 0.55 + 0.45 * up, 0.5)
                sil &= inside | _fill(shape, [top], off)
            else:
                topm = _fill(shape, [top], off)
                z = np.where(topm, cam.plane_depth(v, p.h), cam.plane_depth(v, p.h / 2))
                z = z.astype(np.float32)
                shade = np.where(topm, rng.uniform(0.9, 1.0), rng.uniform(0.55, 0.75))
            win = depth[y0:y1, x0:x1]
            draw = sil & (z < win)
            col = colour[:, None, None] * (shade * light[y0:y1, x0:x1])
            if stripes:
                t = (u * math.cos(phase) + v * math.sin(phase)) / (period * cam.f)
                col = col * (0.8 + 0.2 * (np.sin(t * 2 * math.pi) > 0))
            win[draw] = z[draw]
            rgb[:, y0:y1, x0:x1][:, draw] = np.broadcast_to(col, (3, *shape))[:, draw]
            labels[y0:y1, x0:x1][draw] = k
    normal, uniform = _noise(rng, H, W)
    rgb += np.ascontiguousarray(normal[::-1, ::-1]) * np.float32(2.5)  # not the depth's noise
    rgb_u8 = cv2.merge(list(np.clip(rgb, 0, 255, out=rgb).astype(np.uint8)))  # (H, W, 3)
    # --- the depth sensor: noise ~ z^2, disparity quantisation, missing pixels
    clean = depth
    z2 = clean * clean
    sigma = np.float32(cfg.depth_noise * rng.uniform(0.0008, 0.002))
    z = clean + sigma * z2 * normal
    if cfg.depth_noise > 0:
        step = np.float32(0.0025) * z2
        z = np.round(z / step) * step
    if cfg.dropout > 0:
        grad = np.zeros_like(clean)  # |d/dy| + |d/dx|, zero on the first row and column
        grad[1:] = np.abs(clean[1:] - clean[:-1])
        grad[:, 1:] += np.abs(clean[:, 1:] - clean[:, :-1])
        edge = cv2.dilate((grad > 0.008).astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
        lum = cv2.cvtColor(rgb_u8, cv2.COLOR_RGB2GRAY)
        # four cases (edge, dark): look the chance up instead of computing it per pixel
        e, k = np.array([0, 0, 1, 1], np.float32), np.array([0, 1, 0, 1], np.float32)
        chance = np.float32(cfg.dropout) * (
            np.float32(0.5) * e + np.float32(0.35) * k + np.float32(0.002)
        )
        p_miss = chance[(edge.view(np.uint8) << 1) | (lum < 55).view(np.uint8)]
        z[uniform < p_miss] = np.nan
    # --- labels from the geometry, kept where they can be seen
    params, cuts, owner, neg_params, metres, centres = [], [], [], [], [], []
    for k in range(len(objects)):
        pos, neg = _grasps_for(k, objects, rng, cfg)
        for g in pos:
            pr, cut = _grasp_rect(cam, g)
            x, y = round(pr[0]), round(pr[1])
            if 0 <= x < W and 0 <= y < H and labels[y, x] == k + 1:
                params.append(pr)
                cuts.append(cut)
                owner.append(k + 1)
                metres.append((g[3] - g[2], g[3] - g[2] + 2 * g[5], g[5], g[7], g[8]))
                centres.append(grasp_centre(cam, g))
        neg_params += [_grasp_rect(cam, g)[0] for g in neg]
    rects = params_to_corners(np.array(params).reshape(-1, 5)).astype(np.float32)
    negs = params_to_corners(np.array(neg_params).reshape(-1, 5)).astype(np.float32)
    return SyntheticView(
        f"syn{cfg.seed}_{index:05d}",
        rgb_u8,
        z,
        rects,
        negs,
        labels,
        np.array(owner, np.uint8),
        np.array(cuts, np.float32),
        {
            "metres": np.array(metres, np.float64).reshape(-1, 5),
            "centres": np.array(centres, np.float64).reshape(-1, 3),
            "intrinsics": cam.intrinsics,
        },
    )


def generate_labelled(index: int, settings: SceneSettings) -> SyntheticView:
    """:func:`generate_view`, skipping to the next draw while a view has no positive grasp
    (all of its objects too wide or hidden): every view a dataset serves has a label."""
    for attempt in range(50):
        view = generate_view(index + attempt * 1_000_003, settings)
        if len(view.rects):
            view.view_id = f"syn{settings.seed}_{index:05d}"
            return view
    raise ConfigError(f"synthetic view {index}: no graspable object in 50 draws; widen max_opening")

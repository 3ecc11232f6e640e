"""One generated view: table, sheets, shadows, z-buffered objects with procedural textures,
the depth sensor's faults, and the labels projected from the geometry and kept where they
can be seen."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from vision_tfm.errors import ConfigError
from vision_tfm.grasp.rect import params_to_corners

from .scene import Camera, SceneSettings, SyntheticView, _grasp_rect, _grasps_for, grasp_centre
from .shapes import Part, _superellipse, _turn, make_object, moved

Texture = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""Pixel columns and rows (broadcast arrays) -> a brightness factor of the same shape."""


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


def _texture(rng: np.random.Generator, grain: np.ndarray, scale: float) -> Texture | None:
    """A procedural texture in image space (seamless across an object's pieces), or None for
    a plain surface: stripes, checks, smooth blotches or fine grain. ``scale``: pixels per
    centimetre on the surface, so that patterns keep a physical size."""
    kind = int(rng.integers(4))
    period = float(rng.uniform(0.4, 4.0)) * scale
    a = float(rng.uniform(0, math.pi))
    c, s, depth = math.cos(a), math.sin(a), float(rng.uniform(0.15, 0.4))
    if kind == 0:  # stripes
        return lambda u, v: 1 - depth * (np.sin((u * c + v * s) * (2 * math.pi / period)) > 0)
    if kind == 1:  # checks

        def checks(u: np.ndarray, v: np.ndarray) -> np.ndarray:
            p, q = (u * c + v * s) / period, (v * c - u * s) / period
            return 1 - depth * ((np.floor(p) + np.floor(q)) % 2)

        return checks
    if kind == 2:  # blotches: a coarse random grid, cubic-interpolated at every pixel
        grid = rng.uniform(1 - depth, 1, (8, 8)).astype(np.float32)
        cell = period * 2

        def blotches(u: np.ndarray, v: np.ndarray) -> np.ndarray:
            mu, mv = np.broadcast_arrays(u, v)
            mu = ((mu / cell) % 8).astype(np.float32)  # the grid wraps: no seams
            mv = ((mv / cell) % 8).astype(np.float32)
            return cv2.remap(grid, mu, mv, cv2.INTER_CUBIC, borderMode=cv2.BORDER_WRAP)

        return blotches
    amp = np.float32(depth * 0.5)  # grain: the bank's noise at those pixels
    return lambda u, v: 1 + amp * grain[v.astype(int), u.astype(int)]


@dataclass
class _Look:
    """How one object is drawn: its colour, the shades of its top and walls, a texture."""

    colour: np.ndarray
    top: float
    wall: float
    texture: Texture | None


def _camera(rng: np.random.Generator, cfg: SceneSettings) -> Camera:
    H, W = cfg.size_hw
    return Camera(
        float(rng.uniform(540, 600)),
        W / 2 + float(rng.uniform(-10, 10)),
        H / 2 + float(rng.uniform(-10, 10)),
        float(rng.uniform(*cfg.tilt)),
        float(rng.uniform(*cfg.distance)),
    )


def _layout(rng: np.random.Generator, cfg: SceneSettings) -> list[list[Part]]:
    """Objects placed on the table without touching, in table metres."""
    n_obj = int(rng.integers(cfg.objects[0], cfg.objects[1] + 1))
    objects: list[list[Part]] = []
    placed: list[tuple[np.ndarray, float]] = []
    for _ in range(n_obj):
        parts = make_object(str(rng.choice(cfg.families)), rng, cfg.size, cfg.extent)
        pts = np.concatenate([p.poly for p in parts])
        centre = (pts.max(0) + pts.min(0)) / 2
        radius = float(np.linalg.norm(pts - centre, axis=1).max())
        spread = 0.07 + 0.03 * n_obj + 0.5 * radius
        for _try in range(20):
            at = rng.uniform(-spread, spread, 2) - centre
            if all(np.linalg.norm(at + centre - c) > radius + r + 0.01 for c, r in placed):
                placed.append((at + centre, radius))
                objects.append(moved(parts, *at))
                break
    return objects


def _sheets(rng: np.random.Generator, cfg: SceneSettings) -> list[Part]:
    """Distractors: flat sheets half a millimetre thick, anywhere on the table."""
    n = int(rng.integers(cfg.distractors[0], cfg.distractors[1] + 1))
    out = []
    for _ in range(n):
        a = float(rng.uniform(0.02, 0.12))  # half the long side: labels to A4 sheets
        poly = _superellipse(a, a * float(rng.uniform(0.3, 1.0)), float(rng.uniform(0.05, 1.0)))
        at = rng.uniform(-0.3, 0.3, 2)
        out.append(Part(_turn(poly, float(rng.uniform(0, math.pi))) + at, 0.0005))
    return out


def _table(
    rng: np.random.Generator, cam: Camera, cfg: SceneSettings, grain: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Table, floor and their light: ``(rgb (3, H, W), depth, on_table, light)`` over the
    image ``grain`` covers. The table's Y depends on the row alone and its X bounds are a
    column interval per row, so nothing here needs per-pixel table coordinates."""
    H, W = grain.shape
    rows = np.arange(H, dtype=np.float32)[:, None]
    cols = np.arange(W, dtype=np.float32)[None]
    ext = rng.uniform([-0.75, -0.4, 0.35, 0.45], [-0.35, -0.25, 0.75, 0.9])  # x0, y0, x1, y1
    z_table = cam.plane_depth(rows, 0.0)  # (H, 1)
    y_row = cam.back_project(np.full_like(rows, cam.cx), rows, 0.0)[..., 1]
    on_table = (
        (cols > cam.cx + cam.f * ext[0] / z_table) & (cols < cam.cx + cam.f * ext[2] / z_table)
        & (y_row > ext[1]) & (y_row < ext[3])
    )  # fmt: skip
    depth = np.where(on_table, z_table, cam.plane_depth(rows, -0.72)).astype(np.float32)
    kind = rng.integers(4)
    table_rgb = [
        rng.uniform(205, 245, 3) * [1, 0.99, 0.97],  # white board
        np.array([205, 170, 125]) * rng.uniform(0.85, 1.1),  # light wood
        rng.uniform(140, 185) * np.array([1, 1, 1.02]),  # grey
        _colour(rng, dark=0.15),  # a coloured cloth or mat
    ][kind].astype(np.float32)
    floor_rgb = (np.array([95, 80, 65]) * rng.uniform(0.6, 1.3)).astype(np.float32)
    low = rng.normal(0, 1, (6, 8)).astype(np.float32)  # slow lighting variation
    swing = float(rng.uniform(0.04, 0.2))
    light = 1 + swing * cv2.resize(low, (W, H), interpolation=cv2.INTER_CUBIC)
    light *= np.float32(rng.uniform(0.75, 1.2))  # exposure
    cast = rng.uniform(0.92, 1.08, 3).astype(np.float32)  # white balance
    table_rgb, floor_rgb = table_rgb * cast, floor_rgb * cast
    # colour is planar (3, H, W) until the end: per-pixel factors broadcast over whole rows
    rgb = np.where(on_table, table_rgb[:, None, None], floor_rgb[:, None, None])
    if kind == 1:  # wood grain along the table's X
        xs = ((cols - cam.cx) / cam.f * z_table).astype(np.float32)
        rgb += 8 * np.sin(xs * np.float32(rng.uniform(150, 400)))
    if rng.random() < cfg.textures:
        tex = _texture(rng, grain, cam.f / float(cam.q[2]) / 100)
        u, v = np.broadcast_arrays(cols, rows)
        rgb = np.where(on_table, rgb * tex(u, v).astype(np.float32), rgb)
    return rgb.astype(np.float32, copy=False), depth, on_table, light


def _shadows(
    rng: np.random.Generator, cam: Camera, objects: list[list[Part]], hw: tuple[int, int]
) -> np.ndarray:
    """Soft shadows: each part's footprint swept along the light's direction, in [0, 1]."""
    sun = rng.uniform(0, 2 * math.pi)
    sweep = np.array([math.cos(sun), math.sin(sun)]) * rng.uniform(0.2, 0.8)
    shadow = np.zeros(hw, np.uint8)
    for parts in objects:
        for p in parts:
            hull = cv2.convexHull(np.concatenate([p.poly, p.poly + sweep * p.h]).astype(np.float32))
            px = cam.project(hull[:, 0].astype(np.float64), 0.0)
            cv2.fillConvexPoly(shadow, np.round(px * 4).astype(np.int32), 255, cv2.LINE_8, 2)
    return cv2.GaussianBlur(shadow, (0, 0), 2.5).astype(np.float32) / 255


def _part_depth(
    cam: Camera,
    p: Part,
    u: np.ndarray,
    v: np.ndarray,
    sil: np.ndarray,
    top: np.ndarray,
    look: _Look,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A part's z and shade over its window, and its silhouette trimmed to what it covers."""
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
        return z, np.where(inside, 0.55 + 0.45 * up, 0.5), sil & (inside | top)
    z = np.where(top, cam.plane_depth(v, p.h), cam.plane_depth(v, p.h / 2)).astype(np.float32)
    return z, np.where(top, look.top, look.wall), sil


def _draw_part(
    cam: Camera, p: Part, look: _Look, buffers: tuple[np.ndarray, ...], label: int
) -> None:
    """Z-buffer one prism into ``(rgb, depth, labels, light)``: top face lit, walls darker."""
    rgb, depth, labels, light = buffers
    H, W = depth.shape
    base, top = cam.project(p.poly, 0.0), cam.project(p.poly, p.h)
    allpx = np.concatenate([base, top])
    x0, y0 = np.floor(allpx.min(0)).astype(int) - 1
    x1, y1 = np.ceil(allpx.max(0)).astype(int) + 2
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, W), min(y1, H)
    if x1 <= x0 or y1 <= y0:
        return
    off = np.array([x0, y0], np.float64)
    shape = (y1 - y0, x1 - x0)
    hull = cv2.convexHull(allpx.astype(np.float32))[:, 0].astype(np.float64)
    u, v = np.meshgrid(np.arange(x0, x1, dtype=np.float32), np.arange(y0, y1, dtype=np.float32))
    sil, topm = _fill(shape, [hull], off), _fill(shape, [top], off)
    z, shade, sil = _part_depth(cam, p, u, v, sil, topm, look)
    win = depth[y0:y1, x0:x1]
    draw = sil & (z < win)
    col = look.colour[:, None, None] * (shade * light[y0:y1, x0:x1])
    if look.texture is not None:
        col = col * look.texture(u, v)
    win[draw] = z[draw]
    rgb[:, y0:y1, x0:x1][:, draw] = np.broadcast_to(col, (3, *shape))[:, draw]
    labels[y0:y1, x0:x1][draw] = label


def _sensor(
    rng: np.random.Generator,
    cfg: SceneSettings,
    clean: np.ndarray,
    rgb_u8: np.ndarray,
    normal: np.ndarray,
    uniform: np.ndarray,
) -> np.ndarray:
    """The depth sensor: noise ~ z^2, disparity quantisation, missing pixels at edges and on
    dark surfaces, and blobs it cannot see at all; NaN where nothing came back."""
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
    H, W = clean.shape
    blobs = np.zeros((H, W), np.uint8)
    for _ in range(int(rng.poisson(cfg.holes))):
        centre = (int(rng.integers(W)), int(rng.integers(H)))
        axes = (int(rng.uniform(2, 25)), int(rng.uniform(2, 12)))
        cv2.ellipse(blobs, centre, axes, float(rng.uniform(0, 180)), 0, 360, 1, -1)
    z[blobs > 0] = np.nan
    return z


def _labels(
    rng: np.random.Generator,
    cfg: SceneSettings,
    cam: Camera,
    objects: list[list[Part]],
    labels: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, list, list, list, list]:
    """Grasps from the geometry, kept where their centre is seen on their own object."""
    H, W = labels.shape
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
    return rects, negs, cuts, owner, metres, centres


def generate_view(
    index: int, settings: SceneSettings | None = None, window: tuple[int, int, int] | None = None
) -> SyntheticView:
    """Render view ``index`` of ``settings.seed``: the same bytes for the same arguments.

    ``window = (x0, y0, side)`` renders only that square of the full view (the scene and
    its labels are the same; pixels, rectangles and intrinsics are the window's), so a
    dataset that crops the centre draws a third of the pixels.
    """
    cfg = settings or SceneSettings()
    rng = np.random.default_rng([cfg.seed, index])
    H, W = cfg.size_hw
    if window is not None:
        x0, y0, side = window
        if not (0 <= x0 <= W - side and 0 <= y0 <= H - side and side > 0):
            raise ConfigError(f"synthetic window {window} is not inside the {W}x{H} view")
        H = W = side
    normal, uniform = _noise(rng, H, W)
    cam = _camera(rng, cfg)
    if window is not None:
        cam = cam.window(window[0], window[1])
    objects, sheets = _layout(rng, cfg), _sheets(rng, cfg)
    rgb, depth, on_table, light = _table(rng, cam, cfg, normal)
    rgb *= light * (1 - rng.uniform(0.3, 0.5) * _shadows(rng, cam, objects, (H, W)) * on_table)
    labels = np.zeros((H, W), np.uint8)
    scale = cam.f / float(cam.q[2]) / 100  # pixels per centimetre at the image centre
    buffers = (rgb, depth, labels, light)
    for p in sheets:
        tex = _texture(rng, normal, scale) if rng.random() < 0.5 else None
        _draw_part(cam, p, _Look(_colour(rng, 0.1), 1.0, 1.0, tex), buffers, 0)
    for k, parts in enumerate(objects, start=1):
        tex = _texture(rng, normal, scale) if rng.random() < cfg.textures else None
        top, wall = float(rng.uniform(0.9, 1.0)), float(rng.uniform(0.55, 0.75))
        look = _Look(_colour(rng), top, wall, tex)
        for p in parts:
            _draw_part(cam, p, look, buffers, k)
    rgb += np.ascontiguousarray(normal[::-1, ::-1]) * np.float32(2.5)  # not the depth's noise
    rgb_u8 = cv2.merge(list(np.clip(rgb, 0, 255, out=rgb).astype(np.uint8)))  # (H, W, 3)
    z = _sensor(rng, cfg, depth, rgb_u8, normal, uniform)
    rects, negs, cuts, owner, metres, centres = _labels(rng, cfg, cam, objects, labels)
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


def generate_labelled(
    index: int, settings: SceneSettings, window: tuple[int, int, int] | None = None
) -> SyntheticView:
    """:func:`generate_view`, skipping to the next draw while a view (or its ``window``) has
    no positive grasp (all of its objects too wide or hidden): every view a dataset serves
    has a label."""
    for attempt in range(50):
        view = generate_view(index + attempt * 1_000_003, settings, window)
        if len(view.rects):
            view.view_id = f"syn{settings.seed}_{index:05d}"
            return view
    raise ConfigError(f"synthetic view {index}: no graspable object in 50 draws; widen max_opening")

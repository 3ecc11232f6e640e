"""Procedural RGB-D tabletop grasp scenes in the Cornell conventions: data with no download.

A pinhole camera looks down at a table at an oblique angle, as Cornell's Kinect does; 1-3
objects stand on it, drawn from a few families (boxes, upright and lying cylinders, L and T
shapes, tools with a handle, mugs, thin sticks), each a union of convex prisms extruded from
the table plane. Everything is seeded: view ``i`` of seed ``s`` is the same bytes on every
machine, whichever views are drawn before it.

Why these choices:

- **Geometry first, pixels second.** Objects live in metres on the table plane; the camera
  projects them. Grasps are found on that geometry (antipodal contacts whose normals lie in
  the friction cone, an opening the gripper has, jaws that hit nothing), then projected, so
  every label is right by construction rather than drawn by hand.
- **The sensor's faults, not a clean z-buffer.** Depth noise grows with the square of the
  distance, values are quantised (disparity steps), and pixels go missing at depth edges and
  on dark surfaces; missing pixels are NaN, which the loaders' hole filling already handles.
- **Cheap enough to regenerate.** Parts are rasterised in their bounding boxes with OpenCV's
  polygon fill and a z-buffer; a 640x480 view takes a few ms on one core, so a dataset is
  generated on the fly (and cached in memory with ``data.cache``) rather than shipped.

``python -m vision_tfm.data.grasp.synthetic OUT --views 4`` writes Cornell-style files
(``pcdXXXXr.png``, ``d.tiff``, ``cpos.txt``, ``cneg.txt``) for ``vtfm grasp`` and the loaders.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

from vision_tfm.errors import ConfigError
from vision_tfm.files import atomic_write
from vision_tfm.grasp.rect import params_to_corners

from .annotations import GraspView, split_ids
from .dataset import GraspDataset, _options, grasp_datasets_from_config
from .images import crop_box, crop_resize, crop_to_output

SYNTHETIC = "synthetic"
DEFAULT_VIEWS = 400
FAMILIES = ("box", "cylinder", "lying", "L", "T", "tool", "mug", "stick")


@dataclass(frozen=True)
class SceneSettings:
    """What the generator draws from; the defaults mimic Cornell's views and labels.

    Attributes:
        seed: Generator seed (independent of the training seed: the data stays put while
            the run's seed changes).
        families: Object families to draw from (:data:`FAMILIES`).
        objects: Fewest and most objects per view.
        size: Scale on every object dimension.
        tilt: Camera pitch below the horizon, degrees (90: straight down; Cornell ~35-45).
        distance: Depth of the table point at the image centre, metres.
        friction: Friction coefficient; contact normals must lie within ``atan(friction)``
            of the closing direction.
        max_opening: The gripper's largest opening, metres.
        clearance: Each plate's gap to its contact at release, metres (range).
        jaw: Plate width, metres (range).
        grasps: Most positive rectangles per object.
        negatives: Negative rectangles per object (failed antipodal tests).
        depth_noise: Scale of the distance-squared depth noise (0: none).
        dropout: Scale of the missing-pixel rates at edges and on dark surfaces (0: none).
        size_hw: Image ``(H, W)``.
    """

    seed: int = 0
    families: tuple[str, ...] = FAMILIES
    objects: tuple[int, int] = (1, 3)
    size: float = 1.0
    tilt: tuple[float, float] = (35.0, 75.0)
    distance: tuple[float, float] = (0.7, 1.15)
    friction: float = 0.4
    max_opening: float = 0.10
    clearance: tuple[float, float] = (0.004, 0.012)
    jaw: tuple[float, float] = (0.02, 0.045)
    grasps: int = 8
    negatives: int = 3
    depth_noise: float = 1.0
    dropout: float = 1.0
    size_hw: tuple[int, int] = (480, 640)

    def __post_init__(self) -> None:
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise ConfigError(f"synthetic families {bad} unknown; expected some of {FAMILIES}")
        lo, hi = self.objects
        if not 1 <= lo <= hi <= 6:
            raise ConfigError(f"synthetic objects must be 1 <= min <= max <= 6, got {self.objects}")
        if not 10.0 <= self.tilt[0] <= self.tilt[1] <= 90.0:
            raise ConfigError(f"synthetic tilt must be within [10, 90] degrees, got {self.tilt}")
        if not 0.2 <= self.distance[0] <= self.distance[1] <= 5.0:
            raise ConfigError(f"synthetic distance must be within [0.2, 5] m, got {self.distance}")
        for name in ("size", "friction", "max_opening"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"synthetic {name} must be > 0, got {getattr(self, name)}")
        if self.grasps < 1 or self.negatives < 0 or self.depth_noise < 0 or self.dropout < 0:
            raise ConfigError("synthetic grasps must be >= 1; negatives, depth_noise, dropout >= 0")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SceneSettings:
        """Settings from a config mapping (``data.synthetic``); unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"unknown data.synthetic keys {unknown}; valid: {sorted(names)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


@dataclass
class SyntheticView:
    """One generated view: what the Cornell files hold, plus the geometry behind the labels.

    Attributes:
        view_id: ``syn<seed>_<index>``.
        rgb: ``(H, W, 3)`` uint8.
        depth: ``(H, W)`` float32 metres; NaN where the sensor returned nothing.
        rects: float32 ``(K, 4, 2)`` positive rectangles, opening along corner 0 -> 1.
        negatives: float32 ``(M, 4, 2)`` rectangles that fail the antipodal test.
        labels: ``(H, W)`` uint8 object index + 1 per visible pixel (0: table or floor).
        owner: ``(K,)`` object index + 1 of each positive rectangle.
        cuts: ``(K,)`` the object's cut along each rectangle's opening (contact to contact),
            in pixels; the opening is the cut plus the two plates' clearance.
        extra: ``metres``: ``(K, 5)`` per rectangle, on the table: cut, opening, clearance,
            and the cosines between each contact's normal and the closing line.
    """

    view_id: str
    rgb: np.ndarray
    depth: np.ndarray
    rects: np.ndarray
    negatives: np.ndarray
    labels: np.ndarray
    owner: np.ndarray
    cuts: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Camera
# ---------------------------------------------------------------------------------------------


class Camera:
    """Pinhole camera pitched ``tilt`` below the horizon over a table plane.

    Camera frame: x right, y down, z forward. Table frame: X right, Y away from the camera
    (up the image), h up from the table, origin where the optical axis meets the table.
    """

    def __init__(self, f: float, cx: float, cy: float, tilt_deg: float, distance: float) -> None:
        a = math.radians(tilt_deg)
        self.f, self.cx, self.cy = f, cx, cy
        self.sin, self.cos = math.sin(a), math.cos(a)
        self.height = distance * self.sin  # camera above the table
        self.q = np.array([0.0, 0.0, distance])
        self.e2 = np.array([0.0, -self.sin, self.cos])  # table Y in the camera frame
        self.up = np.array([0.0, -self.cos, -self.sin])

    def project(self, xy: np.ndarray, h: float | np.ndarray) -> np.ndarray:
        """Table points ``(..., 2)`` at height ``h`` -> pixels ``(..., 2)`` (x, y)."""
        X, Y = xy[..., 0], xy[..., 1]
        py = -Y * self.sin - h * self.cos
        pz = self.q[2] + Y * self.cos - h * self.sin
        return np.stack([self.f * X / pz + self.cx, self.f * py / pz + self.cy], axis=-1)

    def plane_depth(self, rows: np.ndarray, h: float | np.ndarray) -> np.ndarray:
        """z-depth of the horizontal plane at height ``h`` seen through pixel rows ``rows``."""
        den = self.sin + self.cos * (rows - self.cy) / self.f
        return (self.height - h) / np.maximum(den, 1e-3)

    def back_project(self, u: np.ndarray, v: np.ndarray, h: float) -> np.ndarray:
        """Pixels -> table ``(X, Y)`` on the plane at height ``h``, ``(..., 2)``."""
        u, v = np.broadcast_arrays(u, v)
        z = self.plane_depth(v, h)
        x, y = z * (u - self.cx) / self.f, z * (v - self.cy) / self.f
        Y = (y - h * self.up[1]) * self.e2[1] + (z - self.q[2] - h * self.up[2]) * self.e2[2]
        return np.stack([x, Y], axis=-1)


# ---------------------------------------------------------------------------------------------
# Objects: unions of convex prisms
# ---------------------------------------------------------------------------------------------


@dataclass
class Part:
    """A convex prism: footprint ``poly`` (N, 2) counter-clockwise in table metres, height
    ``h``; ``lying`` (axis angle, radius) makes it a cylinder lying along that axis."""

    poly: np.ndarray
    h: float
    lying: tuple[float, float] | None = None


def _rect(cx: float, cy: float, length: float, width: float, angle: float) -> np.ndarray:
    """Rectangle footprint, ``length`` along ``angle`` (radians, counter-clockwise)."""
    c, s = math.cos(angle), math.sin(angle)
    u, v = np.array([c, s]) * length / 2, np.array([-s, c]) * width / 2
    ctr = np.array([cx, cy])
    return np.stack([ctr - u - v, ctr + u - v, ctr + u + v, ctr - u + v])


def _disc(cx: float, cy: float, r: float, n: int = 24) -> np.ndarray:
    t = np.arange(n) * (2 * math.pi / n)
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=-1)


def _make_object(family: str, rng: np.random.Generator, k: float) -> list[Part]:
    """Parts of one object of ``family`` centred at the origin (``k``: size scale)."""
    U = lambda a, b: float(rng.uniform(a, b)) * k  # noqa: E731
    phi = float(rng.uniform(0, math.pi))
    if family == "box":
        return [Part(_rect(0, 0, U(0.04, 0.15), U(0.025, 0.08), phi), U(0.02, 0.09))]
    if family == "cylinder":
        return [Part(_disc(0, 0, U(0.015, 0.04)), U(0.04, 0.13))]
    if family == "lying":
        r = U(0.012, 0.035)
        return [Part(_rect(0, 0, U(0.08, 0.2), 2 * r, phi), 2 * r, (phi, r))]
    if family == "stick":
        w = U(0.006, 0.014)
        return [Part(_rect(0, 0, U(0.12, 0.24), w, phi), w)]
    if family in ("L", "T"):
        a, h = U(0.02, 0.04), U(0.012, 0.04)
        l1, l2 = U(0.07, 0.14), U(0.06, 0.12)
        c, s = math.cos(phi), math.sin(phi)
        u, v = np.array([c, s]), np.array([-s, c])
        bar = Part(_rect(0, 0, l1, a, phi), h)
        off = (l1 - a) / 2 * u if family == "L" else np.zeros(2)
        mid = off + v * (l2 / 2 - a / 2)  # the stem starts inside the bar, at one end (L)
        stem = Part(_rect(*mid, l2, a, phi + math.pi / 2), h)  # or in its middle (T)
        return [bar, stem]
    if family == "tool":
        hl, hw = U(0.08, 0.15), U(0.016, 0.028)
        c, s = math.cos(phi), math.sin(phi)
        u = np.array([c, s])
        handle = Part(_rect(0, 0, hl, hw, phi), U(0.014, 0.026))
        hd_l, hd_w = U(0.025, 0.05), U(0.05, 0.09)
        head_c = u * (hl / 2 + hd_l / 2 - 0.004 * k)
        head = Part(_rect(*head_c, hd_l, hd_w, phi), U(0.018, 0.045))
        return [handle, head]
    if family == "mug":
        r, h = U(0.03, 0.045), U(0.07, 0.11)
        c, s = math.cos(phi), math.sin(phi)
        u = np.array([c, s])
        hc = u * (r + 0.012 * k)
        return [Part(_disc(0, 0, r), h), Part(_rect(*hc, 0.03 * k, 0.01 * k, phi), 0.75 * h)]
    raise ConfigError(f"unknown synthetic family {family!r}")


def _moved(parts: list[Part], dx: float, dy: float) -> list[Part]:
    d = np.array([dx, dy])
    return [Part(p.poly + d, p.h, p.lying) for p in parts]


# ---------------------------------------------------------------------------------------------
# Grasps on the geometry
# ---------------------------------------------------------------------------------------------


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Which ``(M, 2)`` points lie inside the counter-clockwise convex ``poly``."""
    e = np.roll(poly, -1, axis=0) - poly  # (E, 2)
    return (_cross(e[None], points[:, None] - poly[None]) >= 0).all(axis=1)


def _chords(poly: np.ndarray, c: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where lines ``c + t d`` (M of them, through points inside ``poly``) leave it.

    Returns ``(t_min < 0, t_max > 0, outward normal at t_min, at t_max)``.
    """
    p = poly[None]  # (1, E, 2)
    e = np.roll(poly, -1, axis=0)[None] - p
    den = _cross(d[:, None], e)  # (M, E)
    ok = np.abs(den) > 1e-12
    den = np.where(ok, den, 1.0)
    t = _cross(p - c[:, None], e) / den
    s = _cross(p - c[:, None], d[:, None]) / den
    ok &= (s >= -1e-9) & (s <= 1 + 1e-9)
    t_hi = np.where(ok & (t > 0), t, np.inf)
    t_lo = np.where(ok & (t < 0), t, -np.inf)
    i_hi, i_lo = t_hi.argmin(axis=1), t_lo.argmax(axis=1)
    normals = np.stack([e[0, :, 1], -e[0, :, 0]], axis=-1)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    rows = np.arange(len(c))
    return t_lo[rows, i_lo], t_hi[rows, i_hi], normals[i_lo], normals[i_hi]


def _grasps_for(
    obj: int,
    objects: list[list[Part]],
    rng: np.random.Generator,
    cfg: SceneSettings,
    n_candidates: int = 48,
) -> tuple[list[tuple], list[tuple]]:
    """Antipodal grasps on object ``obj``: ``(centre, direction, t_lo, t_hi, h, clearance, jaw,
    cos of each contact normal to the closing line)`` tuples, positives (diverse, up to
    ``cfg.grasps``) and negatives."""
    cone = math.cos(math.atan(cfg.friction))
    others = [p.poly for parts in objects for p in parts]
    pos, neg = [], []
    for part in objects[obj]:
        lo, hi = part.poly.min(0), part.poly.max(0)
        pts = rng.uniform(lo, hi, size=(n_candidates * 3, 2))
        pts = pts[_inside(pts, part.poly)][:n_candidates]
        if not len(pts):
            continue
        # half the closing directions at random, half along a random edge's normal (within
        # the cone): most antipodal pairs of a thin part lie there, and random angles miss them
        e = np.roll(part.poly, -1, axis=0) - part.poly
        normal_ang = np.arctan2(-e[:, 0], e[:, 1])
        ang = rng.uniform(0, math.pi, len(pts))
        half = len(pts) // 2
        jitter = rng.uniform(-1, 1, half) * math.atan(cfg.friction)
        ang[:half] = normal_ang[rng.integers(0, len(e), half)] + jitter
        d = np.stack([np.cos(ang), np.sin(ang)], axis=-1)
        t_lo, t_hi, n_lo, n_hi = _chords(part.poly, pts, d)
        good = np.isfinite(t_lo) & np.isfinite(t_hi)
        friction = ((n_hi * d).sum(-1) >= cone) & ((-n_lo * d).sum(-1) >= cone)
        clear = rng.uniform(*cfg.clearance, len(pts))
        jaw = rng.uniform(*cfg.jaw, len(pts))
        fits = (t_hi - t_lo) + 2 * clear <= cfg.max_opening
        # the plates, beyond each contact, must touch no part of any object (this one's
        # other parts included: a contact inside the union is no contact)
        perp = np.stack([-d[:, 1], d[:, 0]], axis=-1)
        probes = []  # 12 points per candidate: 2 plates x 2 depths x 3 across the jaw
        for t, sgn in ((t_hi, 1.0), (t_lo, -1.0)):
            for a in (0.5, 1.0):
                for b in (-0.5, 0.0, 0.5):
                    tt = np.where(np.isfinite(t), t, 0.0) + sgn * a * clear
                    probes.append(pts + d * tt[:, None] + perp * (b * jaw)[:, None])
        q = np.concatenate(probes)  # (12 M, 2)
        hit = np.zeros(len(q), bool)
        for poly in others:
            hit |= _inside(q, poly)
        free = ~hit.reshape(len(probes), len(pts)).any(axis=0)
        ok = good & friction & fits & free
        cos_lo, cos_hi = (-n_lo * d).sum(-1), (n_hi * d).sum(-1)
        rows = [
            (pts[i], d[i], t_lo[i], t_hi[i], part.h, clear[i], jaw[i], cos_lo[i], cos_hi[i])
            for i in range(len(pts))
            if good[i]
        ]
        pos += [r for r, o in zip(rows, ok[good]) if o]
        neg += [r for r, o, f in zip(rows, ok[good], free[good]) if not o and f]
    chosen: list[tuple] = []
    for g in pos:  # greedy: a new centre or a new angle, so labels spread over the object
        if all(
            np.linalg.norm(g[0] - c[0]) > 0.015 or abs(g[1] @ c[1]) < math.cos(math.radians(30))
            for c in chosen
        ):
            chosen.append(g)
        if len(chosen) == cfg.grasps:
            break
    k = min(cfg.negatives, len(neg))
    picks = rng.choice(len(neg), k, replace=False) if k else []
    return chosen, [neg[i] for i in picks]


def _grasp_rect(cam: Camera, g: tuple) -> tuple[np.ndarray, float]:
    """Project one grasp (on the plane of its part's top) -> ``((5,) params, cut in px)``."""
    c, d, t_lo, t_hi, h, clear, jaw = g[:7]
    perp = np.array([-d[1], d[0]])
    pts = np.stack([
        c + d * (t_lo - clear), c + d * (t_hi + clear),  # plates
        c + d * t_lo, c + d * t_hi,  # contacts
        c + d * (t_lo + t_hi) / 2 - perp * jaw / 2, c + d * (t_lo + t_hi) / 2 + perp * jaw / 2,
    ])  # fmt: skip
    px = cam.project(pts, h)
    a, b = px[0], px[1]
    theta = math.atan2(-(b[1] - a[1]), b[0] - a[0])
    opening = float(np.linalg.norm(b - a))
    jaw_px = float(np.linalg.norm(px[5] - px[4]))
    cut = float(np.linalg.norm(px[3] - px[2]))
    ctr = (a + b) / 2
    return np.array([ctr[0], ctr[1], theta, opening, jaw_px]), cut


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


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
        gy, gx = (
            np.abs(np.diff(clean, axis=0, prepend=clean[:1])),
            np.abs(np.diff(clean, axis=1, prepend=clean[:, :1])),
        )
        edge = cv2.dilate(((gx + gy) > 0.008).astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
        lum = cv2.cvtColor(rgb_u8, cv2.COLOR_RGB2GRAY)
        # four cases (edge, dark): look the chance up instead of computing it per pixel
        e, k = np.array([0, 0, 1, 1], np.float32), np.array([0, 1, 0, 1], np.float32)
        chance = np.float32(cfg.dropout) * (
            np.float32(0.5) * e + np.float32(0.35) * k + np.float32(0.002)
        )
        p_miss = chance[(edge.view(np.uint8) << 1) | (lum < 55).view(np.uint8)]
        z[uniform < p_miss] = np.nan
    # --- labels from the geometry, kept where they can be seen
    params, cuts, owner, neg_params, metres = [], [], [], [], []
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
        {"metres": np.array(metres, np.float64).reshape(-1, 5)},
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


# ---------------------------------------------------------------------------------------------
# Files and datasets
# ---------------------------------------------------------------------------------------------


def _rect_lines(rects: np.ndarray) -> str:
    return "".join(f"{x:.2f} {y:.2f}\n" for x, y in rects.reshape(-1, 2))


def save_cornell(view: SyntheticView, folder: str | Path, number: int) -> Path:
    """Write a view as Cornell's ``pcd<number>r.png``, ``d.tiff``, ``cpos.txt``, ``cneg.txt``
    (each file written whole or not at all); returns the RGB path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"pcd{number:04d}"
    rgb = Path(f"{stem}r.png")
    atomic_write(lambda f: Image.fromarray(view.rgb).save(f, format="PNG"), rgb, "file")
    depth = Image.fromarray(view.depth.astype(np.float32), mode="F")
    atomic_write(lambda f: depth.save(f, format="TIFF"), Path(f"{stem}d.tiff"), "file")
    for suffix, rects in (("cpos", view.rects), ("cneg", view.negatives)):
        text = _rect_lines(rects).encode()
        atomic_write(lambda f, t=text: f.write(t), Path(f"{stem}{suffix}.txt"), "file")
    return rgb


def parse_root(root: str) -> int:
    """``"synthetic"`` or ``"synthetic:N"`` -> N views (:data:`DEFAULT_VIEWS` when absent)."""
    m = re.fullmatch(rf"{SYNTHETIC}(?::(\d+))?", str(root).strip())
    if m is None or (m.group(1) is not None and int(m.group(1)) < 2):
        raise ConfigError(
            f"synthetic data must be 'synthetic' or 'synthetic:N' (N >= 2), got {root!r}"
        )
    return int(m.group(1)) if m.group(1) else DEFAULT_VIEWS


def is_synthetic_root(root: str | Path | None) -> bool:
    """Whether a ``--data`` value names generated scenes rather than a folder."""
    return root is not None and re.fullmatch(rf"{SYNTHETIC}(:.*)?", str(root).strip()) is not None


class SyntheticGrasp(GraspDataset):
    """Generated views served like Cornell's: the same crop, maps and rectangles.

    The views exist only as indices; each is rendered when first asked for (and kept with
    ``cache``), so ``len`` costs nothing and a worker renders its own items.
    """

    def __init__(
        self,
        indices: Sequence[int],
        settings: SceneSettings | None = None,
        *,
        crop_size: int | None = 300,
        **kwargs: Any,
    ) -> None:
        """``indices`` of ``settings``' views; ``kwargs`` are :class:`GraspDataset` options."""
        self.settings = settings or SceneSettings()
        super().__init__([], crop_size=crop_size, **kwargs)  # no files to check
        H, W = self.settings.size_hw
        if crop_size and crop_size > min(H, W):
            raise ConfigError(f"synthetic views are {W}x{H}: smaller than the {crop_size} crop")
        self.index = {f"syn{self.settings.seed}_{i:05d}": int(i) for i in indices}
        none = np.zeros((0, 4, 2), np.float32)  # rendered with the view, see _load
        self.views = [
            GraspView(v, v, Path(SYNTHETIC, v), Path(SYNTHETIC, v), none) for v in self.index
        ]

    def subset(self, ids: Sequence[str], **opts: Any) -> SyntheticGrasp:
        """The views ``ids`` with other :class:`GraspDataset` options."""
        merged = {**_options(self), **opts}
        return SyntheticGrasp([self.index[i] for i in ids], self.settings, **merged)

    def recropped(self, crop: str) -> SyntheticGrasp:
        return self.subset(self.ids, crop=crop, cache=self.cache is not None)

    def _load(self, view: GraspView) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        scene = generate_labelled(self.index[view.view_id], self.settings)
        rgb = scene.rgb if self.input != "depth" else None
        depth = scene.depth if self.input != "rgb" else None
        H, W = scene.rgb.shape[:2]
        centre = scene.rects.reshape(-1, 2).mean(axis=0) if self.crop == "grasps" else None
        box = crop_box((H, W), self.crop_size or min(H, W), centre)
        S = self.output_size
        rgb, depth = crop_resize(rgb, depth, box, S)
        return rgb, depth, crop_to_output(scene.rects, box, S)


def synthetic_datasets(
    root: str,
    *,
    settings: SceneSettings | None = None,
    split: str = "image",
    train_frac: float = 0.8,
    seed: int = 0,
    folds: int = 0,
    fold: int = 0,
    augment: Any = False,
    train_crop: str = "centre",
    repeat: int = 1,
    cache: bool = False,
    **kwargs: Any,
) -> tuple[SyntheticGrasp, SyntheticGrasp, str]:
    """Train and validation sets of ``root`` = ``synthetic:N`` generated views, cut as
    :func:`~vision_tfm.data.grasp.build_grasp_datasets` cuts a folder (every view is its own
    object, so image- and object-wise agree); arguments as that function takes them."""
    from .annotations import kfold_splits

    n = parse_root(root)
    full = SyntheticGrasp(range(n), settings, **kwargs, crop="centre", cache=False)
    if folds:
        cut = kfold_splits(full.ids, folds, split, seed)[fold]
    else:
        cut = split_ids(full.ids, split, train_frac, seed)
    if augment is True:
        from .images import GraspAugment

        augment = GraspAugment()
    train = full.subset(cut.train, crop=train_crop)
    train.augment, train.repeat = augment or None, repeat
    train.cache = {} if cache else None
    val = full.subset(cut.val, cache=cache)
    return train, val, f"{SYNTHETIC} {cut.name}"


def datasets_from_config(
    d: Any, seed: int, root: str | Path | None = None, **train_options: Any
) -> tuple[GraspDataset, GraspDataset, str]:
    """:func:`~vision_tfm.data.grasp.grasp_datasets_from_config` that also serves
    ``dataset: synthetic`` (generated views, with ``d.synthetic`` as the generator settings)."""
    if d.dataset != SYNTHETIC:
        return grasp_datasets_from_config(d, seed, root, **train_options)
    return synthetic_datasets(
        str(root or d.root),
        settings=SceneSettings.from_dict(d.synthetic),
        split=d.split,
        train_frac=d.train_frac,
        seed=seed,
        folds=d.folds,
        fold=d.fold,
        input=d.input,
        output_size=d.output_size,
        crop_size=d.crop_size or None,
        normalise=d.normalise,
        width_scale=d.width_scale,
        **{"augment": False, **train_options},
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Write generated views as Cornell files (``pcd0000r.png`` ...) into a folder."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("out", help="folder to write into")
    p.add_argument("--views", type=int, default=4, help="how many views")
    p.add_argument("--seed", type=int, default=0, help="generator seed")
    p.add_argument("--first", type=int, default=0, help="index of the first view")
    args = p.parse_args(argv)
    cfg = replace(SceneSettings(), seed=args.seed)
    for i in range(args.first, args.first + args.views):
        print(save_cornell(generate_labelled(i, cfg), args.out, i))


if __name__ == "__main__":
    main()

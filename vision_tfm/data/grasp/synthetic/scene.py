"""The scene's pieces in table metres: settings, the camera, and the antipodal grasps found
on the objects' geometry (before any pixel is drawn); the objects are in :mod:`.shapes`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from vision_tfm.errors import ConfigError
from vision_tfm.grasp.camera import Intrinsics

from .shapes import FAMILIES, Part


@dataclass(frozen=True)
class SceneSettings:
    """What the generator draws from; the defaults mimic Cornell's views and labels.

    Attributes:
        seed: Generator seed (independent of the training seed: the data stays put while
            the run's seed changes).
        families: Object families to draw from (:data:`~.shapes.FAMILIES`: Cornell-like
            ones and parametric shape spaces).
        objects: Fewest and most objects per view.
        size: Scale on every object dimension.
        extent: Shortest and longest side of a parametric family's object, metres (drawn
            log-uniformly between them).
        distractors: Fewest and most flat sheets (paper, labels, mats) per view: seen in
            colour, nearly nothing in depth, never graspable.
        textures: Chance that an object or the table carries a procedural texture (noise,
            stripes, checks, grain) instead of a plain colour.
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
        holes: Mean number of blobs where the sensor returns nothing (glare, absorbing
            patches), per view.
        size_hw: Image ``(H, W)``, 32 to 4096 pixels a side.
    """

    seed: int = 0
    families: tuple[str, ...] = FAMILIES
    objects: tuple[int, int] = (1, 3)
    size: float = 1.0
    extent: tuple[float, float] = (0.02, 0.30)
    distractors: tuple[int, int] = (0, 3)
    textures: float = 0.5
    tilt: tuple[float, float] = (30.0, 90.0)
    distance: tuple[float, float] = (0.55, 1.3)
    friction: float = 0.4
    max_opening: float = 0.10
    clearance: tuple[float, float] = (0.004, 0.012)
    jaw: tuple[float, float] = (0.02, 0.045)
    grasps: int = 8
    negatives: int = 3
    depth_noise: float = 1.0
    dropout: float = 1.0
    holes: float = 1.0
    size_hw: tuple[int, int] = (480, 640)

    def __post_init__(self) -> None:
        self._check_ranges()
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

    def _check_ranges(self) -> None:
        """The settings added for wide scenes, each checked before a pixel is allocated."""
        if not 0.005 <= self.extent[0] <= self.extent[1] <= 0.5:
            raise ConfigError(f"synthetic extent must be within [0.005, 0.5] m, got {self.extent}")
        if not 0 <= self.distractors[0] <= self.distractors[1] <= 8:
            raise ConfigError(
                f"synthetic distractors must be 0 <= min <= max <= 8, got {self.distractors}"
            )
        if not 0 <= self.textures <= 1 or not 0 <= self.holes <= 20:
            raise ConfigError(
                f"synthetic textures must be within [0, 1] and holes within [0, 20], got "
                f"{self.textures} and {self.holes}"
            )
        if len(self.size_hw) != 2 or not all(32 <= int(n) <= 4096 for n in self.size_hw):
            raise ConfigError(f"synthetic size_hw: 2 sides in [32, 4096], got {self.size_hw}")

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
            and the cosines between each contact's normal and the closing line;
            ``centres``: ``(K, 3)`` each rectangle's true centre in the camera frame, metres
            (:func:`grasp_centre`); ``intrinsics``: the camera's :class:`Intrinsics`.
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
        self.tilt_deg, self.distance = tilt_deg, distance
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

    def window(self, x0: int, y0: int) -> Camera:
        """The same camera seen through an image cut at ``(x0, y0)``: only the principal
        point moves, so a window renders exactly that part of the full view."""
        return Camera(self.f, self.cx - x0, self.cy - y0, self.tilt_deg, self.distance)

    @property
    def intrinsics(self) -> Intrinsics:
        """The pinhole intrinsics the views are drawn with (square pixels)."""
        return Intrinsics(self.f, self.f, self.cx, self.cy)

    def to_camera(self, xy: np.ndarray, h: float | np.ndarray) -> np.ndarray:
        """Table points ``(..., 2)`` at height ``h`` -> camera-frame points ``(..., 3)`` (m)."""
        X, Y = xy[..., 0], xy[..., 1]
        y, z = -Y * self.sin - h * self.cos, self.q[2] + Y * self.cos - h * self.sin
        return np.stack([X, y, z], -1)

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
# Grasps on the geometry
# ---------------------------------------------------------------------------------------------


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Which ``(M, 2)`` points lie inside the counter-clockwise convex ``poly``."""
    e = np.roll(poly, -1, axis=0) - poly  # (E, 2)
    return (_cross(e[None], points[:, None] - poly[None]) >= 0).all(axis=1)


def _clip(poly: np.ndarray, c: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where lines ``c + t d`` (M of them) enter and leave the counter-clockwise convex
    ``poly`` (Cyrus-Beck): ``(t_in, t_out, outward unit normal at t_in, at t_out)``; a line
    that misses has ``t_in > t_out``."""
    e = np.roll(poly, -1, axis=0) - poly
    n = np.stack([e[:, 1], -e[:, 0]], axis=-1)  # outward edge normals
    num = ((poly[None] - c[:, None]) * n[None]).sum(-1)  # (M, E): inside is t * den <= num
    den = d @ n.T
    par = np.abs(den) < 1e-12
    t = num / np.where(par, 1.0, den)
    t_in = np.where(den < -1e-12, t, -np.inf)
    t_out = np.where(den > 1e-12, t, np.inf)
    i_in, i_out = t_in.argmax(axis=1), t_out.argmin(axis=1)
    rows = np.arange(len(c))
    lo, hi = t_in[rows, i_in], t_out[rows, i_out]
    lo = np.where((par & (num < 0)).any(axis=1), np.inf, lo)  # parallel, outside an edge
    unit = n / np.linalg.norm(n, axis=-1, keepdims=True)
    return lo, hi, unit[i_in], unit[i_out]


def _object_chords(parts: list[Part], c: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where lines ``c + t d`` through points of an object leave the union of its parts:
    pieces that overlap or touch along the line join, so the contacts are where the line
    leaves the whole object.

    Returns ``(t_lo, t_hi, normal at t_lo, normal at t_hi, top height at the chord's
    midpoint)``; lines that start outside every part get ``t_lo = t_hi = nan``.
    """
    clips = [_clip(p.poly, c, d) for p in parts]
    T_in = np.stack([k[0] for k in clips])  # (P, M)
    T_out = np.stack([k[1] for k in clips])
    hit = T_in <= T_out
    N_in = np.stack([k[2] for k in clips])  # (P, M, 2)
    N_out = np.stack([k[3] for k in clips])
    start = hit & (T_in <= 1e-12) & (T_out >= -1e-12)  # pieces holding the line's point
    bad = ~start.any(0)
    lo = np.where(start, T_in, np.inf).min(0)
    hi = np.where(start, T_out, -np.inf).max(0)
    lo[bad], hi[bad] = 0.0, 0.0
    for _ in parts:  # join pieces until nothing touches the chord from outside
        touch = hit & (T_in <= hi + 1e-9) & (T_out >= lo - 1e-9)
        lo2 = np.where(bad, 0.0, np.where(touch, T_in, np.inf).min(0))
        hi2 = np.where(bad, 0.0, np.where(touch, T_out, -np.inf).max(0))
        if np.array_equal(lo2, lo) and np.array_equal(hi2, hi):
            break
        lo, hi = lo2, hi2
    rows = np.arange(len(c))
    touch = hit & (T_in <= hi + 1e-9) & (T_out >= lo - 1e-9)
    p_lo = np.where(touch, T_in, np.inf).argmin(0)
    p_hi = np.where(touch, T_out, -np.inf).argmax(0)
    mid = (lo + hi) / 2
    heights = np.array([p.h for p in parts])[:, None]
    h = np.where(hit & (T_in <= mid) & (T_out >= mid), heights, 0.0).max(0)
    lo, hi = np.where(bad, np.nan, lo), np.where(bad, np.nan, hi)
    return lo, hi, N_in[p_lo, rows], N_out[p_hi, rows], h


def _candidates(
    part: Part, rng: np.random.Generator, n: int, friction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Points inside ``part`` and closing directions: half at random, half along a random
    edge's normal (within the friction cone), where most antipodal pairs of a thin part
    lie and random angles miss them."""
    lo, hi = part.poly.min(0), part.poly.max(0)
    pts = rng.uniform(lo, hi, size=(n * 3, 2))
    pts = pts[_inside(pts, part.poly)][:n]
    e = np.roll(part.poly, -1, axis=0) - part.poly
    normal_ang = np.arctan2(-e[:, 0], e[:, 1])
    ang = rng.uniform(0, math.pi, len(pts))
    half = len(pts) // 2
    jitter = rng.uniform(-1, 1, half) * math.atan(friction)
    ang[:half] = normal_ang[rng.integers(0, len(e), half)] + jitter
    return pts, np.stack([np.cos(ang), np.sin(ang)], axis=-1)


def _plates_free(
    pts: np.ndarray,
    d: np.ndarray,
    ends: tuple[np.ndarray, np.ndarray],
    clear: np.ndarray,
    jaw: np.ndarray,
    polys: list[np.ndarray],
) -> np.ndarray:
    """Whether both plates, beyond each contact, touch no part of any object (a contact
    inside an object's own union is no contact): 12 probes per candidate, 2 plates x 2
    depths x 3 across the jaw."""
    perp = np.stack([-d[:, 1], d[:, 0]], axis=-1)
    probes = []
    for t, sgn in ((ends[1], 1.0), (ends[0], -1.0)):
        for a in (0.5, 1.0):
            for b in (-0.5, 0.0, 0.5):
                tt = np.where(np.isfinite(t), t, 0.0) + sgn * a * clear
                probes.append(pts + d * tt[:, None] + perp * (b * jaw)[:, None])
    q = np.concatenate(probes)  # (12 M, 2)
    hit = np.zeros(len(q), bool)
    for poly in polys:
        hit |= _inside(q, poly)
    return ~hit.reshape(len(probes), len(pts)).any(axis=0)


def _spread(pos: list[tuple], most: int) -> list[tuple]:
    """Greedy: keep a grasp with a new centre or a new angle, so labels cover the object."""
    chosen: list[tuple] = []
    for g in pos:
        if all(
            np.linalg.norm(g[0] - c[0]) > 0.015 or abs(g[1] @ c[1]) < math.cos(math.radians(30))
            for c in chosen
        ):
            chosen.append(g)
        if len(chosen) == most:
            break
    return chosen


def _grasps_for(
    obj: int,
    objects: list[list[Part]],
    rng: np.random.Generator,
    cfg: SceneSettings,
    n_candidates: int = 48,
) -> tuple[list[tuple], list[tuple]]:
    """Antipodal grasps on object ``obj``: ``(point, direction, t_lo, t_hi, h, clearance,
    jaw, cos of each contact normal to the closing line)`` tuples, positives (diverse, up to
    ``cfg.grasps``) and negatives. The contacts are where the closing line leaves the
    object's union of parts, and ``h`` is the object's top at the grasp's centre."""
    cone = math.cos(math.atan(cfg.friction))
    parts = objects[obj]
    polys = [p.poly for o in objects for p in o]
    per_part = max(6, n_candidates // len(parts))
    drawn = [_candidates(part, rng, per_part, cfg.friction) for part in parts]
    pts, d = np.concatenate([c[0] for c in drawn]), np.concatenate([c[1] for c in drawn])
    if not len(pts):
        return [], []
    t_lo, t_hi, n_lo, n_hi, h = _object_chords(parts, pts, d)  # every candidate at once
    good = np.isfinite(t_lo) & np.isfinite(t_hi)
    cos_lo, cos_hi = (-n_lo * d).sum(-1), (n_hi * d).sum(-1)
    clear = rng.uniform(*cfg.clearance, len(pts))
    jaw = rng.uniform(*cfg.jaw, len(pts))
    fits = (t_hi - t_lo) + 2 * clear <= cfg.max_opening
    free = _plates_free(pts, d, (t_lo, t_hi), clear, jaw, polys)
    ok = good & (cos_lo >= cone) & (cos_hi >= cone) & fits & free
    pos, neg = [], []
    for i in np.flatnonzero(good):
        row = (pts[i], d[i], t_lo[i], t_hi[i], h[i], clear[i], jaw[i], cos_lo[i], cos_hi[i])
        if ok[i]:
            pos.append(row)
        elif free[i]:
            neg.append(row)
    k = min(cfg.negatives, len(neg))
    picks = rng.choice(len(neg), k, replace=False) if k else []
    return _spread(pos, cfg.grasps), [neg[i] for i in picks]


def grasp_centre(cam: Camera, g: tuple) -> np.ndarray:
    """A grasp's true centre (midway between the plates, on its part's top) in the camera
    frame, metres: the geometry a metric conversion of its rectangle should recover."""
    c, d, t_lo, t_hi, h = g[:5]
    return cam.to_camera(c + d * (t_lo + t_hi) / 2, h)


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

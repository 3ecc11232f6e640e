"""The scene's pieces in table metres: settings, the camera, objects as unions of convex
prisms, and the antipodal grasps found on their geometry (before any pixel is drawn)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from vision_tfm.errors import ConfigError
from vision_tfm.grasp.camera import Intrinsics

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

"""Grasps in metres: a pixel grasp, the depth map and pinhole intrinsics -> the grasp in the
camera's optical frame (x right, y down, z forward, as ROS's ``*_optical_frame``).

The jaws close on the surface under the grasp: the valid depth (holes, 0 or NaN, excluded)
under the rectangle's core is fitted by a plane, on the pixels within ``band`` of its
``percentile``-th depth (the nearest surface, not the table beside the object). The centre
and both plate ends are the rays through their pixels met with that plane, so a tilted view
of a tilted surface keeps its true opening; a plane the rays graze falls back to the
fronto-parallel plane at the percentile depth. A rectangle over holes only has no depth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, DataError
from .rect import Grasp, grasp_axes

DEPTH_PERCENTILE = 10.0
"""The robust depth of the surface under a grasp: this percentile of the valid core depths."""
SURFACE_BAND_M = 0.02
"""Metres beyond that depth still counted as the surface the jaws close on."""
CORE = 0.5
"""Share of the opening, about the centre, whose pixels are read (the plates' ends lie off
the object, on the table)."""
MIN_RAY_COS = 0.2
"""A fitted plane is used only where every ray meets it at a cosine above this; a plane the
rays graze would throw the ends far away."""


@dataclass(frozen=True)
class Intrinsics:
    """Pinhole intrinsics in pixels of the view the depth map belongs to."""

    fx: float
    fy: float
    cx: float
    cy: float

    def __post_init__(self) -> None:
        for name in ("fx", "fy", "cx", "cy"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ConfigError(f"intrinsics {name} must be a finite number > 0, got {v!r}")

    @classmethod
    def parse(cls, text: str) -> Intrinsics:
        """``"fx,fy,cx,cy"`` (``--intrinsics``) -> intrinsics; anything else is one line."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 4 or not all(parts):
            raise ConfigError(f"--intrinsics takes fx,fy,cx,cy (4 numbers), got {text!r}")
        try:
            values = [float(p) for p in parts]
        except ValueError:
            raise ConfigError(f"--intrinsics takes fx,fy,cx,cy (4 numbers), got {text!r}") from None
        return cls(*values)

    def ray(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Pixels -> rays ``(..., 3)`` with z = 1."""
        u, v = np.broadcast_arrays(np.asarray(u, np.float64), np.asarray(v, np.float64))
        return np.stack([(u - self.cx) / self.fx, (v - self.cy) / self.fy, np.ones_like(u)], -1)


@dataclass
class MetricGrasp:
    """One grasp in the camera's optical frame.

    Attributes:
        pixel: The grasp in the view's pixels it came from.
        has_depth: False when no valid depth lies under the rectangle; the metric fields
            are then None, never NaN.
        x, y, z: Centre in metres (z: the depth the jaws close at).
        yaw: Rotation of the opening direction about the optical axis (+z), right-handed, in
            ``[-pi/2, pi/2)``; ``-pixel.angle`` when fx = fy and the surface faces the camera.
        opening: Distance between the plates in metres.
    """

    pixel: Grasp
    has_depth: bool
    x: float | None = None
    y: float | None = None
    z: float | None = None
    yaw: float | None = None
    opening: float | None = None


def _core_pixels(g: Grasp, shape: tuple[int, int], core: float) -> tuple[np.ndarray, ...]:
    """Rows and columns of the pixels (centres at whole coordinates) within the middle ``core``
    of the opening and the full jaw, and always the pixel nearest the centre: a rule a client
    repeats with numpy alone."""
    u, v = grasp_axes(np.float64(g.angle))
    half_o, half_j = 0.5 * core * g.opening, 0.5 * g.jaw
    reach = np.abs(u) * half_o + np.abs(v) * half_j  # half extent along x and y
    H, W = shape
    cols = np.arange(max(0, math.ceil(g.x - reach[0])), min(W - 1, math.floor(g.x + reach[0])) + 1)
    rows = np.arange(max(0, math.ceil(g.y - reach[1])), min(H - 1, math.floor(g.y + reach[1])) + 1)
    r, c = np.meshgrid(rows, cols, indexing="ij")
    dx, dy = c - g.x, r - g.y
    keep = (np.abs(dx * u[0] + dy * u[1]) <= half_o) & (np.abs(dx * v[0] + dy * v[1]) <= half_j)
    keep |= (c == math.floor(g.x + 0.5)) & (r == math.floor(g.y + 0.5))
    return r[keep], c[keep]


def _surface(pts: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Least-squares plane ``n . p = c`` through 3D points, or None when they are degenerate."""
    if len(pts) < 3:
        return None
    mean = pts.mean(0)
    _, s, vt = np.linalg.svd(pts - mean, full_matrices=False)
    if s[1] < 1e-9:
        return None
    n = vt[-1]
    return n, float(n @ mean)


def grasp_in_metres(
    g: Grasp,
    depth: np.ndarray,
    intrinsics: Intrinsics,
    *,
    percentile: float = DEPTH_PERCENTILE,
    band: float = SURFACE_BAND_M,
    core: float = CORE,
) -> MetricGrasp:
    """One pixel grasp -> :class:`MetricGrasp` on ``depth`` (metres, the view's own size).

    Args:
        g: A grasp in the pixels of the view ``depth`` belongs to (``vtfm grasp``'s output).
        depth: ``(H, W)`` depth in metres; 0, negative and non-finite values are holes.
        intrinsics: The view's pinhole intrinsics.
        percentile: The robust statistic: this percentile of the valid core depths.
        band: Metres beyond that depth still counted as the surface the jaws close on.
        core: Share of the opening, about the centre, whose pixels are read.
    """
    rows, cols = _core_pixels(g, depth.shape, core)
    d = depth[rows, cols].astype(np.float64)
    ok = np.isfinite(d) & (d > 0)
    if not ok.any():
        return MetricGrasp(g, False)
    rows, cols, d = rows[ok], cols[ok], d[ok]
    z0 = float(np.percentile(d, percentile))
    near = d <= z0 + band
    pts = intrinsics.ray(cols[near], rows[near]) * d[near, None]
    half = 0.5 * g.opening * np.array([math.cos(g.angle), -math.sin(g.angle)])
    px = np.array([[g.x, g.y], [g.x - half[0], g.y - half[1]], [g.x + half[0], g.y + half[1]]])
    rays = intrinsics.ray(px[:, 0], px[:, 1])  # centre, plate a, plate b
    plane = _surface(pts)
    if plane is not None and np.all(
        np.abs(rays @ plane[0]) > MIN_RAY_COS * np.linalg.norm(rays, axis=1)
    ):
        p = rays * (plane[1] / (rays @ plane[0]))[:, None]
        if not np.all(p[:, 2] > 0):
            p = rays * z0
    else:
        p = rays * z0
    dx, dy = p[2, 0] - p[1, 0], p[2, 1] - p[1, 1]
    yaw = (math.atan2(dy, dx) + math.pi / 2) % math.pi - math.pi / 2
    x, y, z = (float(v) for v in p[0])
    return MetricGrasp(g, True, x, y, z, yaw, float(np.linalg.norm(p[2] - p[1])))


def grasps_in_metres(
    grasps: list[Grasp], depth: np.ndarray, intrinsics: Intrinsics, image_hw: tuple[int, int]
) -> list[MetricGrasp]:
    """:func:`grasp_in_metres` for each grasp of one view of size ``image_hw`` (H, W); a depth
    map of another size is a :class:`DataError` (the intrinsics are the view's)."""
    if depth.ndim != 2 or tuple(depth.shape) != tuple(image_hw):
        raise DataError(
            f"depth map {tuple(depth.shape)} does not match the view {tuple(image_hw)} (H, W)"
        )
    return [grasp_in_metres(g, depth, intrinsics) for g in grasps]

"""Grasp rectangles: corner <-> parameter conversion, transforms and exact polygon IoU.

Conventions (used by the whole ``vision_tfm.grasp`` package):

* Image coordinates: x to the right, y down, in pixels. The centre of pixel ``[row, col]`` is the
  point ``(x, y) = (col, row)``; this matches Cornell's corner files, numpy indexing and
  albumentations' ``"xy"`` keypoints.
* Corners are an array ``(4, 2)`` of ``(x, y)``. The opening (the line the gripper closes along)
  runs from corner 0 to corner 1; corner 1 -> 2 spans the jaw width. :func:`params_to_corners`
  emits them with a positive shoelace area, but real Cornell files mix both handednesses (three of
  the four rectangles of pcd0100 run the other way) and a flip reverses it, so nothing here relies
  on the handedness: only corner 0 -> 1 defines the angle and the opening.
* Angle ``theta`` is in radians, ``theta = atan2(-(y1 - y0), x1 - x0)`` wrapped into
  ``[-pi/2, pi/2)`` (GG-CNN convention): 0 is a horizontal opening and positive angles turn
  counter-clockwise *as seen on screen*. A grasp is symmetric under a half turn, hence the wrap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np


def wrap_angle(theta: float | np.ndarray) -> float | np.ndarray:
    """Wrap angles into ``[-pi/2, pi/2)``: a parallel gripper is symmetric under a half turn."""
    return (theta + math.pi / 2) % math.pi - math.pi / 2


def grasp_axes(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors along the opening (u) and the jaw (v) in image coordinates, shape (..., 2)."""
    c, s = np.cos(theta), np.sin(theta)
    # y points down, so a screen-counter-clockwise angle has a negative y component.
    u = np.stack([c, -s], axis=-1)
    v = np.stack([s, c], axis=-1)  # u turned a quarter towards +y
    return u, v


def params_to_corners(params: np.ndarray) -> np.ndarray:
    """Convert ``(..., 5)`` rows of ``(x, y, theta, opening, jaw)`` into ``(..., 4, 2)`` corners.

    Corner 0 -> 1 is the opening, 1 -> 2 the jaw; the shoelace area is positive.
    """
    params = np.asarray(params, dtype=np.float64)
    centre = params[..., None, 0:2]  # (..., 1, 2)
    u, v = grasp_axes(params[..., 2])
    half_open = (params[..., 3, None] / 2 * u)[..., None, :]  # (..., 1, 2)
    half_jaw = (params[..., 4, None] / 2 * v)[..., None, :]
    signs_u = np.array([-1.0, 1.0, 1.0, -1.0])[:, None]  # (4, 1)
    signs_v = np.array([-1.0, -1.0, 1.0, 1.0])[:, None]
    return centre + signs_u * half_open + signs_v * half_jaw


def corners_to_params(corners: np.ndarray) -> np.ndarray:
    """Convert ``(..., 4, 2)`` corners into ``(..., 5)`` rows of ``(x, y, theta, opening, jaw)``.

    The centre is the mean of the corners, theta and the opening come from corner 0 -> 1 and the jaw
    from corner 1 -> 2, so the result does not depend on the corners' handedness.
    """
    corners = np.asarray(corners, dtype=np.float64)
    centre = corners.mean(axis=-2)
    d01 = corners[..., 1, :] - corners[..., 0, :]
    d12 = corners[..., 2, :] - corners[..., 1, :]
    theta = wrap_angle(np.arctan2(-d01[..., 1], d01[..., 0]))
    opening = np.linalg.norm(d01, axis=-1)
    jaw = np.linalg.norm(d12, axis=-1)
    return np.concatenate([centre, theta[..., None], opening[..., None], jaw[..., None]], axis=-1)


def rotate_points(points: np.ndarray, angle: float, centre: tuple[float, float]) -> np.ndarray:
    """Rotate ``(..., 2)`` points by ``angle`` radians, screen-counter-clockwise, about ``centre``.

    Same sense as the grasp angle and as albumentations' positive ``rotate``.
    """
    points = np.asarray(points, dtype=np.float64)
    c, s = math.cos(angle), math.sin(angle)
    d = points - np.asarray(centre, dtype=np.float64)
    x = c * d[..., 0] + s * d[..., 1]
    y = -s * d[..., 0] + c * d[..., 1]
    return np.stack([x, y], axis=-1) + np.asarray(centre, dtype=np.float64)


@dataclass(frozen=True)
class Grasp:
    """One oriented grasp rectangle; see the module docstring for the conventions.

    Attributes:
        x: Centre column in pixels.
        y: Centre row in pixels.
        angle: Opening direction in radians, in ``[-pi/2, pi/2)``.
        opening: Gripper opening (rectangle length along the angle) in pixels.
        jaw: Jaw (plate) width in pixels.
        quality: Predicted quality; 1.0 for ground truth.
    """

    x: float
    y: float
    angle: float
    opening: float
    jaw: float
    quality: float = 1.0

    @classmethod
    def from_corners(cls, corners: np.ndarray, quality: float = 1.0) -> Grasp:
        """Build a grasp from ``(4, 2)`` corners whose corner 0 -> 1 is the opening."""
        x, y, theta, opening, jaw = corners_to_params(corners).tolist()
        return cls(x, y, theta, opening, jaw, quality)

    def params(self) -> np.ndarray:
        """Return ``(x, y, angle, opening, jaw)`` as a float64 array of shape (5,)."""
        return np.array([self.x, self.y, self.angle, self.opening, self.jaw])

    def corners(self) -> np.ndarray:
        """Return the ``(4, 2)`` corners, opening along corner 0 -> 1."""
        return params_to_corners(self.params())

    def rotate(self, angle: float, centre: tuple[float, float]) -> Grasp:
        """Rotate by ``angle`` radians (screen-counter-clockwise) about ``centre``."""
        ((x, y),) = rotate_points(np.array([[self.x, self.y]]), angle, centre)
        return replace(self, x=float(x), y=float(y), angle=float(wrap_angle(self.angle + angle)))

    def scale(self, factor: float, centre: tuple[float, float] = (0.0, 0.0)) -> Grasp:
        """Scale position and size by ``factor`` about ``centre`` (e.g. after a resize)."""
        cx, cy = centre
        return replace(
            self,
            x=cx + (self.x - cx) * factor,
            y=cy + (self.y - cy) * factor,
            opening=self.opening * factor,
            jaw=self.jaw * factor,
        )

    def translate(self, dx: float, dy: float) -> Grasp:
        """Shift the centre by ``(dx, dy)`` pixels (e.g. after a crop, with negative offsets)."""
        return replace(self, x=self.x + dx, y=self.y + dy)

    def iou(self, other: Grasp) -> float:
        """Exact intersection over union of the two rectangles."""
        return polygon_iou(self.corners(), other.corners())


def polygon_area(poly: np.ndarray) -> float:
    """Signed shoelace area of ``(N, 2)`` polygon (positive in :func:`params_to_corners` order)."""
    poly = np.asarray(poly, dtype=np.float64)
    if len(poly) < 3:
        return 0.0
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(np.roll(x, -1), y))


def _positive(poly: np.ndarray) -> np.ndarray:
    """Return the polygon in positive-area order so the clipping half-plane test has one sign."""
    return poly if polygon_area(poly) >= 0 else poly[::-1]


def polygon_intersection(subject: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """Clip a convex polygon by another (Sutherland-Hodgman); returns ``(M, 2)``, maybe empty.

    Both inputs must be convex; either handedness is accepted.
    """
    output = _positive(np.asarray(subject, dtype=np.float64))
    clip = _positive(np.asarray(clip, dtype=np.float64))
    for a, b in zip(clip, np.roll(clip, -1, axis=0)):
        if len(output) == 0:
            break
        edge = b - a
        # Cross product > 0: the point lies on the interior side of edge a -> b.
        side = edge[0] * (output[:, 1] - a[1]) - edge[1] * (output[:, 0] - a[0])
        kept = []
        for i in range(len(output)):
            j = (i + 1) % len(output)
            p, q, sp, sq = output[i], output[j], side[i], side[j]
            if sp >= 0:
                kept.append(p)
            if (sp >= 0) != (sq >= 0):  # the edge p -> q crosses the clip line
                kept.append(p + (q - p) * (sp / (sp - sq)))
        output = np.array(kept, dtype=np.float64).reshape(-1, 2)
    return output


def polygon_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Exact IoU of two convex polygons given as ``(N, 2)`` vertex arrays."""
    area_a = abs(polygon_area(a))
    area_b = abs(polygon_area(b))
    inter = abs(polygon_area(polygon_intersection(a, b)))
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0

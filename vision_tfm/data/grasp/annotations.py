"""Grasp annotations: Cornell and Jacquard parsers and view discovery (splits: :mod:`.splits`).

Bad data policy: a rectangle holding NaN values (a quirk of the real Cornell files), lying mostly
outside its image, or far from rectangular is skipped, and the skipped ones are counted in one
warning per annotation file; a view left with no rectangle is an error. Every other problem
(empty file, line count not a multiple of 4, wrong number of fields, other non-numeric text,
missing file, no views, a view id found twice) raises a one-line error naming the file.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vision_tfm.data.datasets import open_image
from vision_tfm.errors import DataError, MissingFileError
from vision_tfm.files import read_bytes
from vision_tfm.grasp.rect import (
    corners_to_params,
    params_to_corners,
    polygon_area,
    polygon_intersection,
)


class GraspDataError(DataError):
    """Malformed grasp data; the message starts with the offending file."""


MAX_COORD = 1e5
"""Largest corner coordinate, opening or jaw (pixels) an annotation may hold; anything beyond
is a corrupt file, not an image (it would encode to empty maps and train to nothing)."""


MIN_INSIDE = 0.5
"""Smallest share of a rectangle's area that must lie within its image; a rectangle mostly
outside it cannot be learnt from the view (its maps would be cut off) and is a labelling slip."""

RECT_TOLERANCE = 0.1
"""How far four corners may be from a rectangle, as a share of its diagonal: the gap between the
two diagonals' midpoints and the difference of their lengths (both 0 for a rectangle, whatever
its corner order or handedness). The Cornell test views are within 0.01."""


def _read_lines(path: Path) -> list[str]:
    """An annotation file's lines; a binary file is a one-line error naming it."""
    try:
        return read_bytes(path).decode().splitlines()
    except UnicodeDecodeError:
        raise GraspDataError(f"{path}: not a text annotation file (binary data)") from None


def _check_rect(corners: np.ndarray, path: Path, lineno: int) -> None:
    """A rectangle must lie within :data:`MAX_COORD` and have a non-zero opening and jaw."""
    if np.abs(corners).max() > MAX_COORD:
        raise GraspDataError(f"{path}:{lineno}: rectangle coordinate beyond {MAX_COORD:g} pixels")
    sides = np.linalg.norm(np.diff(corners[:3], axis=0), axis=1)  # opening, jaw
    if not (sides > 1e-6).all():
        raise GraspDataError(f"{path}:{lineno}: zero-size rectangle (opening or jaw is 0)")


def not_rectangular(rects: np.ndarray, tolerance: float = RECT_TOLERANCE) -> np.ndarray:
    """Which of ``(K, 4, 2)`` corner sets are further than ``tolerance`` from a rectangle.

    Four points in order form a rectangle exactly when the diagonals share their midpoint and
    length; a crossed (bow-tie) order or a skewed quadrilateral fails one or the other.
    """
    r = np.asarray(rects, dtype=np.float64).reshape(-1, 4, 2)
    d02, d13 = r[:, 2] - r[:, 0], r[:, 3] - r[:, 1]
    n02, n13 = np.linalg.norm(d02, axis=1), np.linalg.norm(d13, axis=1)
    scale = np.maximum(np.maximum(n02, n13), 1e-9)
    mid_gap = np.linalg.norm((r[:, 0] + r[:, 2]) - (r[:, 1] + r[:, 3]), axis=1) / 2
    return (mid_gap > tolerance * scale) | (np.abs(n02 - n13) > tolerance * scale)


def share_inside(rects: np.ndarray, image_hw: tuple[int, int]) -> np.ndarray:
    """Share of each ``(K, 4, 2)`` rectangle's area inside an ``(H, W)`` image.

    The image spans ``[-0.5, W - 0.5] x [-0.5, H - 0.5]`` (pixel centres at integers).
    """
    H, W = image_hw
    box = np.array([[-0.5, -0.5], [W - 0.5, -0.5], [W - 0.5, H - 0.5], [-0.5, H - 0.5]])
    out = []
    for corners in np.asarray(rects, dtype=np.float64).reshape(-1, 4, 2):
        area = abs(polygon_area(corners))
        inside = abs(polygon_area(polygon_intersection(corners, box)))
        out.append(inside / area if area > 0 else 0.0)
    return np.array(out)


def _keep_sound(
    rects: np.ndarray, path: Path, image_hw: tuple[int, int] | None, nan: np.ndarray
) -> np.ndarray:
    """Which rectangles to keep; the skipped ones are counted, by reason, in one warning naming
    ``path``, and a file left with none is an error. ``nan`` marks rows already known bad."""
    skew = ~nan & not_rectangular(np.nan_to_num(rects))
    outside = np.zeros_like(nan)
    if image_hw is not None:
        ok = ~nan & ~skew
        outside[ok] = share_inside(rects[ok], image_hw) < MIN_INSIDE
    keep = ~(nan | skew | outside)
    reasons = [
        f"{int(m.sum())} {why}"
        for m, why in [
            (nan, "with NaN values"),
            (outside, f"mostly outside the {image_hw[1]}x{image_hw[0]} image" if image_hw else ""),
            (skew, "far from rectangular"),
        ]
        if m.any()
    ]
    if not keep.any():
        raise GraspDataError(f"{path}: no usable rectangle ({', '.join(reasons)})")
    if reasons:
        warnings.warn(
            f"{path}: skipped {len(rects) - int(keep.sum())} of {len(rects)} rectangles "
            f"({', '.join(reasons)})",
            stacklevel=3,
        )
    return keep


def image_hw(path: str | Path) -> tuple[int, int]:
    """An image's ``(H, W)`` from its header alone (nothing is decoded)."""
    with open_image(path) as im:
        w, h = im.size
    return h, w


# ---------------------------------------------------------------------------------------------
# Annotation files
# ---------------------------------------------------------------------------------------------


def read_cornell_rects(
    path: str | Path, image_hw: tuple[int, int] | None = None
) -> tuple[np.ndarray, int]:
    """Read a Cornell ``pcdXXXXcpos.txt``: 4 lines of ``x y`` per rectangle.

    Blank lines and trailing spaces are ignored. Rectangles holding NaN values (a known Cornell
    quirk), further than :data:`RECT_TOLERANCE` from a rectangle, or (given the image's
    ``(H, W)``) less than :data:`MIN_INSIDE` inside the image are dropped and counted in one
    warning; any other non-numeric text is an error.

    Returns:
        ``(rects, skipped)``: float32 ``(K, 4, 2)`` corners and the number of dropped rectangles.

    Raises:
        GraspDataError: Empty or binary file, a line without exactly two numbers, a rectangle
            beyond :data:`MAX_COORD` or of zero size (each naming file and line), a line count
            that is not a multiple of 4, or no usable rectangle left.
    """
    path = Path(path)
    rows, linenos = [], []
    for lineno, line in enumerate(_read_lines(path), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise GraspDataError(f"{path}:{lineno}: expected 'x y', got {line.strip()!r}")
        rows.append(_numbers(fields, path, lineno, line))
        linenos.append(lineno)
    if not rows:
        raise GraspDataError(f"{path}: empty annotation file")
    if len(rows) % 4:
        raise GraspDataError(f"{path}: {len(rows)} corner lines, not a multiple of 4")
    rects = np.array(rows, dtype=np.float64).reshape(-1, 4, 2)
    nan = np.isnan(rects).any(axis=(1, 2))  # NaN: the known quirk; inf is checked below
    for k in np.flatnonzero(~nan):
        _check_rect(rects[k], path, linenos[4 * k])
    keep = _keep_sound(rects, path, image_hw, nan)
    return rects[keep].astype(np.float32), int((~keep).sum())


def _numbers(fields: list[str], path: Path, lineno: int, line: str) -> list[float]:
    """Parse one annotation line; a literal NaN parses (callers decide), free text is an error."""
    try:
        return [float(f) for f in fields]
    except ValueError:
        raise GraspDataError(f"{path}:{lineno}: non-numeric field in {line.strip()!r}") from None


def read_jacquard_grasps(path: str | Path, image_hw: tuple[int, int] | None = None) -> np.ndarray:
    """Read a Jacquard ``*_grasps.txt``: ``x;y;theta_deg;opening;jaw`` per line (CRLF tolerated).

    Exact duplicate rows are removed, keeping file order. Rows that differ only in the jaw size
    are distinct rectangles and are kept. Given the image's ``(H, W)``, rows less than
    :data:`MIN_INSIDE` inside it are dropped and counted in one warning.

    Returns:
        float64 ``(K, 5)`` rows in Jacquard's own units (see :func:`jacquard_to_corners`).

    Raises:
        GraspDataError: A line without 5 finite numbers, with an opening or jaw <= 0 or a value
            beyond :data:`MAX_COORD` (naming file and line), or no usable grasp at all.
    """
    path = Path(path)
    rows = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.strip().split(";")
        if len(fields) != 5:
            raise GraspDataError(
                f"{path}:{lineno}: expected 5 ';'-separated fields (x;y;theta;opening;jaw), "
                f"got {len(fields)}"
            )
        row = _numbers(fields, path, lineno, line)
        opening, jaw = row[3:]
        if not all(abs(v) <= MAX_COORD for v in row):  # also NaN and inf
            raise GraspDataError(f"{path}:{lineno}: values must be finite, within {MAX_COORD:g}")
        if opening <= 0 or jaw <= 0:
            raise GraspDataError(
                f"{path}:{lineno}: opening and jaw must be > 0, got {opening:g} and {jaw:g}"
            )
        rows.append(row)
    if not rows:
        raise GraspDataError(f"{path}: empty annotation file")
    _, first = np.unique(np.array(rows), axis=0, return_index=True)
    rows = np.array(rows)[np.sort(first)]
    keep = _keep_sound(jacquard_to_corners(rows), path, image_hw, np.zeros(len(rows), bool))
    return rows[keep]


def jacquard_to_corners(grasps: np.ndarray) -> np.ndarray:
    """Convert Jacquard rows ``(x, y, theta_deg, opening, jaw)`` into ``(K, 4, 2)`` corners.

    Jacquard measures theta in degrees clockwise as seen on screen (the opening points along
    ``(cos t, sin t)`` with y down), so our angle is ``-radians(theta)``; the opening becomes
    corner 0 -> 1. Checked on the samples: the plates then straddle the object (GG-CNN negates too).
    """
    grasps = np.asarray(grasps, dtype=np.float64).reshape(-1, 5)
    params = grasps.copy()
    params[:, 2] = -np.radians(grasps[:, 2])
    return params_to_corners(params).astype(np.float32)


def corners_to_jacquard(corners: np.ndarray) -> np.ndarray:
    """Inverse of :func:`jacquard_to_corners`; theta comes back in ``(-90, 90]`` degrees."""
    params = corners_to_params(np.asarray(corners).reshape(-1, 4, 2))
    params[:, 2] = -np.degrees(params[:, 2])
    return params


# ---------------------------------------------------------------------------------------------
# Finding views
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraspView:
    """One annotated view: file paths and ground truth in source-image pixels.

    Attributes:
        view_id: Unique id, e.g. ``pcd0100`` or ``<object>_<view>`` for Jacquard.
        object_id: Object the view shows (the view id for Cornell, which has no object labels).
        rgb_path: Colour image.
        depth_path: Float32 depth TIFF in metres, or None when absent.
        rects: float32 ``(K, 4, 2)`` corners.
    """

    view_id: str
    object_id: str
    rgb_path: Path
    depth_path: Path | None
    rects: np.ndarray


def _existing(path: Path) -> Path | None:
    return path if path.is_file() else None


def _required(path: Path, what: str) -> Path:
    if not path.is_file():
        raise MissingFileError(f"{path}: missing {what}")
    return path


def _unique_ids(named: list[tuple[str, Path]]) -> None:
    """A view id found twice would land in both train and validation (validating on a training
    view, with every figure inflated), so it is an error naming both files."""
    seen: dict[str, Path] = {}
    for view_id, path in named:
        if view_id in seen:
            raise GraspDataError(
                f"view id {view_id!r} found twice: {seen[view_id]} and {path}; keep one copy"
            )
        seen[view_id] = path


def find_cornell_views(root: str | Path) -> tuple[list[GraspView], int]:
    """Find ``pcdXXXXr.png`` views under ``root/*/`` or directly in ``root``.

    Returns:
        ``(views sorted by id, rectangles skipped)`` (see :func:`read_cornell_rects`).

    Raises:
        MissingFileError: No view under ``root``, or a view without its ``cpos.txt``.
        GraspDataError: A view id found twice (naming both files), or a bad annotation file.
    """
    root = Path(root)
    images = sorted([*root.glob("pcd*r.png"), *root.glob("*/pcd*r.png")], key=lambda p: p.name)
    if not images:
        raise MissingFileError(f"{root}: no Cornell views (pcdXXXXr.png) here or one level down")
    _unique_ids([(rgb.name[: -len("r.png")], rgb) for rgb in images])
    views, skipped = [], 0
    for rgb in images:
        view_id = rgb.name[: -len("r.png")]
        cpos = _required(rgb.with_name(f"{view_id}cpos.txt"), "annotations")
        rects, n = read_cornell_rects(cpos, image_hw(rgb))
        depth = _existing(rgb.with_name(f"{view_id}d.tiff"))
        views.append(GraspView(view_id, view_id, rgb, depth, rects))
        skipped += n
    return views, skipped


def find_jacquard_views(root: str | Path) -> list[GraspView]:
    """Find ``<object>/<view>_<object>_RGB.png`` views anywhere under ``root``, sorted by object.

    Raises:
        MissingFileError: No view under ``root``, or a view without its ``_grasps.txt``.
        GraspDataError: A view id found twice (naming both files), or a bad grasps file.
    """
    root = Path(root)
    images = sorted(root.rglob("*_RGB.png"))
    if not images:
        raise MissingFileError(f"{root}: no Jacquard views (*_RGB.png) found")
    named = []
    for rgb in images:
        view, _, obj = rgb.name[: -len("_RGB.png")].partition("_")
        named.append((f"{obj}_{view}", rgb))
    _unique_ids(named)
    views = []
    for rgb in images:
        stem = rgb.name[: -len("_RGB.png")]
        view, _, obj = stem.partition("_")
        txt = _required(rgb.with_name(f"{stem}_grasps.txt"), "grasps")
        grasps = read_jacquard_grasps(txt, image_hw(rgb))
        depth = _existing(rgb.with_name(f"{stem}_perfect_depth.tiff"))
        views.append(GraspView(f"{obj}_{view}", obj, rgb, depth, jacquard_to_corners(grasps)))
    return sorted(views, key=lambda v: v.view_id)

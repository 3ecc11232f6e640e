"""The objects a generated scene stands on the table: unions of convex prisms, from a few
Cornell-like families and from parametric spaces wide enough that no real object is far.

Every object is a list of :class:`Part` s centred at the origin of the table plane. Shapes
that are not convex (star outlines, rings, handles) are split into convex pieces that share
edges; the grasp search treats the pieces of one object as one solid, so a chord may cross
any number of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vision_tfm.errors import ConfigError

CORNELL_FAMILIES = ("box", "cylinder", "lying", "L", "T", "tool", "mug", "stick")
"""Hand-picked families shaped after Cornell's objects (the generator's first version)."""
PARAMETRIC_FAMILIES = ("superellipse", "star", "ring", "handle", "flat")
"""Families drawn from continuous shape spaces, each sized by ``SceneSettings.extent``."""
FAMILIES = CORNELL_FAMILIES + PARAMETRIC_FAMILIES


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


def _turn(poly: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return poly @ np.array([[c, s], [-s, c]])


def _fan(outline: np.ndarray) -> list[np.ndarray]:
    """A star-shaped outline about the origin (counter-clockwise) as triangles from the origin:
    convex pieces whose union is the outline's inside."""
    nxt = np.roll(outline, -1, axis=0)
    return [np.stack([np.zeros(2), a, b]) for a, b in zip(outline, nxt)]


def _superellipse(a: float, b: float, e: float, n: int = 28) -> np.ndarray:
    """``|x/a|^(2/e) + |y/b|^(2/e) = 1``: a box for small ``e``, an ellipse at 1, a diamond at
    2; convex for every ``e`` in (0, 2]."""
    t = np.arange(n) * (2 * math.pi / n)
    c, s = np.cos(t), np.sin(t)
    return np.stack([a * np.sign(c) * np.abs(c) ** e, b * np.sign(s) * np.abs(s) ** e], -1)


def _star(r: float, rng: np.random.Generator, n: int = 32) -> np.ndarray:
    """A random star-shaped outline of mean radius ``r``: a radius that varies with the angle
    as a few random harmonics (lobes, dents, flat sides), never below a fifth of ``r``."""
    t = np.arange(n) * (2 * math.pi / n)
    rad = np.ones(n)
    for k in rng.choice(np.arange(2, 7), size=int(rng.integers(1, 4)), replace=False):
        rad += rng.uniform(0.05, 0.45) * np.cos(k * t + rng.uniform(0, 2 * math.pi))
    rad = r * np.maximum(rad / rad.max(), 0.2)
    return np.stack([rad * np.cos(t), rad * np.sin(t)], -1)


def _annulus(r_out: float, r_in: float, n: int = 20) -> list[np.ndarray]:
    """A ring's footprint as ``n`` convex quadrilaterals, counter-clockwise."""
    t = np.arange(n + 1) * (2 * math.pi / n)
    out = np.stack([np.cos(t), np.sin(t)], -1)
    return [np.stack([out[i] * r_in, out[i] * r_out, out[i + 1] * r_out, out[i + 1] * r_in])
            for i in range(n)]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------


def _cornell(family: str, rng: np.random.Generator, k: float) -> list[Part]:
    """The hand-picked families, at their own sizes times ``k``."""
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
    u = np.array([math.cos(phi), math.sin(phi)])
    if family in ("L", "T"):
        a, h = U(0.02, 0.04), U(0.012, 0.04)
        l1, l2 = U(0.07, 0.14), U(0.06, 0.12)
        v = np.array([-u[1], u[0]])
        bar = Part(_rect(0, 0, l1, a, phi), h)
        off = (l1 - a) / 2 * u if family == "L" else np.zeros(2)
        mid = off + v * (l2 / 2 - a / 2)  # the stem starts inside the bar, at one end (L)
        return [bar, Part(_rect(*mid, l2, a, phi + math.pi / 2), h)]  # or in its middle (T)
    if family == "tool":
        hl, hw = U(0.08, 0.15), U(0.016, 0.028)
        handle = Part(_rect(0, 0, hl, hw, phi), U(0.014, 0.026))
        hd_l, hd_w = U(0.025, 0.05), U(0.05, 0.09)
        head_c = u * (hl / 2 + hd_l / 2 - 0.004 * k)
        return [handle, Part(_rect(*head_c, hd_l, hd_w, phi), U(0.018, 0.045))]
    # mug
    r, h = U(0.03, 0.045), U(0.07, 0.11)
    hc = u * (r + 0.012 * k)
    return [Part(_disc(0, 0, r), h), Part(_rect(*hc, 0.03 * k, 0.01 * k, phi), 0.75 * h)]


def _superellipse_part(rng: np.random.Generator, size: float, h: float) -> list[Part]:
    aspect = float(rng.uniform(0.12, 1.0))
    poly = _superellipse(size / 2, size * aspect / 2, float(rng.uniform(0.1, 2.0)))
    return [Part(_turn(poly, float(rng.uniform(0, math.pi))), h)]


def _star_parts(rng: np.random.Generator, size: float, h: float) -> list[Part]:
    outline = _star(size / 2, rng) * [1.0, float(rng.uniform(0.4, 1.0))]  # squashed, often
    return [Part(p, h) for p in _fan(_turn(outline, float(rng.uniform(0, math.pi))))]


def _ring_parts(rng: np.random.Generator, size: float, h: float) -> list[Part]:
    """Tape rolls, bracelets, tori lying flat: a wall 4-35% of the radius thick."""
    r_out = size / 2
    r_in = r_out * (1 - float(rng.uniform(0.04, 0.35)))
    height = min(h, float(rng.uniform(0.3, 1.5)) * (r_out - r_in) + 0.004)
    return [Part(p, height) for p in _annulus(r_out, r_in)]


def _handle_parts(rng: np.random.Generator, size: float, h: float) -> list[Part]:
    """A body with one or two bars or loops sticking out of it: pans, mugs, scissors, tools."""
    body = _superellipse_part(rng, size * float(rng.uniform(0.35, 0.7)), h)[0]
    parts = [body]
    for _ in range(int(rng.integers(1, 3))):
        ang = float(rng.uniform(0, 2 * math.pi))
        u = np.array([math.cos(ang), math.sin(ang)])
        reach = float(np.max(body.poly @ u))  # the body's edge in that direction
        length, width = size * float(rng.uniform(0.25, 0.6)), size * float(rng.uniform(0.04, 0.1))
        at = u * (reach + length / 2 - 0.3 * width)
        hh = h * float(rng.uniform(0.3, 1.0))
        if rng.random() < 0.5:  # a straight bar
            parts.append(Part(_rect(*at, length, width, ang), hh))
        else:  # a loop: two rails and a cross bar, the hole between them
            v, gap = np.array([-u[1], u[0]]), float(rng.uniform(1.5, 4.0)) * width
            for side in (-1, 1):
                parts.append(Part(_rect(*(at + side * v * gap / 2), length, width, ang), hh))
            end = at + u * (length / 2 - width / 2)
            parts.append(Part(_rect(*end, width, gap + width, ang), hh))
    return parts


def _flat_parts(rng: np.random.Generator, size: float, h: float) -> list[Part]:
    """Thin objects (cards, rulers, plates, flat tools): 2-8 mm tall, any outline."""
    thin = float(rng.uniform(0.002, 0.008))
    maker = _star_parts if rng.random() < 0.4 else _superellipse_part
    return [Part(p.poly, thin) for p in maker(rng, size, thin)]


_PARAMETRIC: dict[str, Callable[[np.random.Generator, float, float], list[Part]]] = {
    "superellipse": _superellipse_part,
    "star": _star_parts,
    "ring": _ring_parts,
    "handle": _handle_parts,
    "flat": _flat_parts,
}


def make_object(
    family: str, rng: np.random.Generator, k: float, extent: tuple[float, float]
) -> list[Part]:
    """Parts of one object of ``family`` centred at the origin. ``k`` scales every size; the
    parametric families draw their longest side log-uniformly within ``extent`` (metres) and
    a height up to that side."""
    if family in CORNELL_FAMILIES:
        return _cornell(family, rng, k)
    if family not in _PARAMETRIC:
        raise ConfigError(f"unknown synthetic family {family!r}; expected one of {FAMILIES}")
    size = k * math.exp(rng.uniform(math.log(extent[0]), math.log(extent[1])))
    h = k * float(rng.uniform(0.01, 0.12)) * min(1.0, size / 0.06) + 0.004
    return _PARAMETRIC[family](rng, size, min(h, size))


def moved(parts: list[Part], dx: float, dy: float) -> list[Part]:
    """The same parts shifted by ``(dx, dy)`` metres on the table."""
    d = np.array([dx, dy])
    return [Part(p.poly + d, p.h, p.lying) for p in parts]

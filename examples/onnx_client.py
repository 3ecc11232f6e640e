"""Classify images, or find grasps on an RGB-D pair, with an exported model. Uses only
onnxruntime, numpy and Pillow: copy this file and the files model.json lists to the device.

    vtfm export --checkpoint runs/<run>/best.pt          # prints the files to ship
    python examples/onnx_client.py runs/<run>/model.onnx photo.jpg --topk 5
    python examples/onnx_client.py runs/<grasp run>/model.onnx pcd0100r.png --depth pcd0100d.tiff

What a runtime needs besides the graph is in ``model.json``: the files to ship (with sha256),
class names, and under ``preprocess.steps`` the ordered steps of ``vtfm predict``'s (or
``vtfm grasp``'s) preprocessing, each linking the section of docs/deployment.md that states
its rules; for grasp models, ``postprocess.steps`` turn the one ``maps`` output into grasps.
Before anything runs it checks ``model.json`` against the contract (which steps, in which
order, each key and its type: ``ORDERS`` and ``STEP_KEYS``), then runs the steps in that
order and prints what ``vtfm predict`` / ``vtfm grasp`` print. tests/export/test_export.py
holds it to 1e-5 in probability on gray, RGB, 16-bit, palette, RGBA, upscaled and non-square
images, and to vtfm grasp's top grasp within 1e-4 px and 1e-5 rad. Nothing here imports
torch, OpenCV or vision_tfm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
from PIL import Image

CONTRACT = "vision_tfm.cls.preprocess/2"  # the preprocessing this client implements
GRASP_CONTRACT = "vision_tfm.grasp.preprocess/4"
NEIGHBOURS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx]  # raster order
MAX_SIDE = 16384  # the longest side model.json may ask for (a resize, a crop, the input)
MAX_PIXELS = 2**26  # the largest image a resize may make: a step past it would exhaust memory
ORT_ERRORS = tuple(  # what onnxruntime raises on a file it cannot load (not a builtin type)
    e for e in vars(ort_state).values() if isinstance(e, type) and issubclass(e, Exception)
)


class InputError(Exception):
    """A file, model.json or model this client refuses: printed as one line, exit code 2."""


def decode(path: str | Path) -> Image.Image:
    """The ``decode`` step: the file's pixels as 8-bit samples (docs: decoding an image file)."""
    try:
        with Image.open(path) as im:
            im.load()
    except Image.DecompressionBombError as e:
        raise InputError(f"{path}: {e}") from None
    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.asarray(im, dtype=np.int64)
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise InputError(f"{path}: {im.mode} pixels outside 0..65535")
        if im.mode == "I" and (not a.size or a.max() <= 255):
            return Image.fromarray(a.astype(np.uint8), "L")
        return Image.fromarray(((a + 128) // 257).astype(np.uint8), "L")  # 65535 -> 255
    if im.mode not in ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK"):
        raise InputError(f"{path}: mode {im.mode} is outside the decoding contract")
    return im  # Pillow itself reads 16-bit colour PNGs by their high byte


def convert(im: Image.Image, mode: str) -> np.ndarray:
    """The ``convert`` step: HWC uint8 in ``mode`` ("L" or "RGB"), alpha dropped; Pillow's
    ``convert("L")`` is the contract's integer luma."""
    arr = np.asarray(im.convert(mode))
    return arr[:, :, None] if arr.ndim == 2 else arr


def cubic_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output index: 4 edge-clamped source indices and their weights x 2048 as ints."""
    f = ((np.arange(n_out) + 0.5) * (1.0 / (n_out / n_in)) - 0.5).astype(np.float32)
    base = np.floor(f)
    t = f - base
    a, one = np.float32(-0.75), np.float32(1.0)
    t1, u = t + one, one - t
    w0 = ((a * t1 - np.float32(5) * a) * t1 + np.float32(8) * a) * t1 - np.float32(4) * a
    w1 = ((a + np.float32(2)) * t - (a + np.float32(3))) * t * t + one
    w2 = ((a + np.float32(2)) * u - (a + np.float32(3))) * u * u + one
    w3 = one - w0 - w1 - w2
    weights = np.rint(np.stack([w0, w1, w2, w3], axis=1) * np.float32(2048)).astype(np.int64)
    idx = base.astype(np.int64)[:, None] + np.arange(-1, 3)
    return np.clip(idx, 0, n_in - 1), weights


def resize(img: np.ndarray, short_side: int) -> np.ndarray:
    """The ``resize_short_side`` step: the contract's integer bicubic (not cv2.resize)."""
    h, w, _ = img.shape
    scale = short_side / min(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if nh * nw > MAX_PIXELS:  # a thin image resized by its short side
        raise InputError(f"a {w}x{h} image resized to {nw}x{nh} is over {MAX_PIXELS:,} pixels")
    if (nh, nw) == (h, w):
        return img
    xi, xw = cubic_taps(w, nw)
    yi, yw = cubic_taps(h, nh)
    rows = (img.astype(np.int64)[:, xi] * xw[None, :, :, None]).sum(2)  # (h, nw, C)
    out = (rows[yi] * yw[:, :, None, None]).sum(1)  # (nh, nw, C)
    return np.clip((out + (1 << 21)) >> 22, 0, 255).astype(np.uint8)


def check_contract(pre: dict, contract: str) -> None:
    if pre.get("contract") != contract:
        raise InputError(
            f"model.json states preprocessing {_shown(pre.get('contract'))}; this client follows "
            f"{contract!r}"
        )


def run_steps(steps: list[dict], files: dict[str, str | None]) -> tuple[np.ndarray, dict]:
    """Run ``preprocess.steps`` in the order listed on the named ``files`` ("image"; or "rgb"
    and "depth"). Returns the ``(1, C, H, W)`` float32 input and the crop box, where there is
    one. A step without ``applies_to`` works on "image"."""
    with np.errstate(all="ignore"):  # a NaN or inf is refused once, at to_tensor
        return _run_steps(steps, files)


def _run_steps(steps: list[dict], files: dict[str, str | None]) -> tuple[np.ndarray, dict]:
    arrays: dict[str, np.ndarray] = {}
    box: dict = {}
    for step in steps:
        op, on = step["op"], step.get("applies_to", DEFAULTS["applies_to"])
        if op == "decode":
            arrays[step["file"]] = decode(files[step["file"]])
        elif op == "convert":
            arrays[on[0]] = convert(arrays[on[0]], step["to"])
        elif op == "resize_short_side":
            arrays["image"] = resize(arrays["image"], step["size"])
        elif op == "center_crop":
            img, (ch, cw) = arrays["image"], step["size"]  # [H, W]
            if ch > img.shape[0] or cw > img.shape[1]:  # slicing would return less, silently
                raise InputError(
                    f"model.json: center_crop size {[ch, cw]} is larger than the resized "
                    f"image ({img.shape[0]}x{img.shape[1]})"
                )
            top, left = (img.shape[0] - ch) // 2, (img.shape[1] - cw) // 2
            arrays["image"] = img[top : top + ch, left : left + cw]
        elif op == "normalize":
            mean = np.asarray(step["mean"], np.float32) * np.float32(255)
            inv_std = np.reciprocal(np.asarray(step["std"], np.float32) * np.float32(255))
            arrays["image"] = (arrays["image"].astype(np.float32) - mean) * inv_std
        elif op == "decode_depth":
            scale = step.get("integer_scale", DEFAULTS["integer_scale"])
            arrays["depth"] = decode_depth(files["depth"], arrays.get("rgb"), scale)
        elif op == "center_crop_square":
            H, W = arrays[on[0]].shape[:2]
            side = min(step["size"] or min(H, W), H, W)
            box = {"x0": (W - side) // 2, "y0": (H - side) // 2, "side": side}
            for k in on:
                arrays[k] = arrays[k][box["y0"] : box["y0"] + side, box["x0"] : box["x0"] + side]
        elif op == "fill_depth_holes":
            arrays["depth"] = fill_holes(arrays["depth"])
        elif op == "resize_area":
            box["size"] = step["size"][0]
            for k in on:
                arrays[k] = resize_area(arrays[k], box["size"])
        elif op == "center_depth":
            d, clip = arrays["depth"], np.float32(step["clip"])
            arrays["depth"] = np.clip(d - np.float32(d.mean(dtype=np.float64)), -clip, clip)
        elif op == "normalize_rgb":
            mean, std = (np.asarray(step[k], np.float32) for k in ("mean", "std"))
            arrays["rgb"] = (arrays["rgb"].astype(np.float32) / np.float32(255) - mean) / std
        elif op == "standardise":
            for k in on:
                x = arrays[k].astype(np.float32)
                arrays[k] = (x - x.mean()) / max(float(x.std()), step["min_std"])
        elif op == "to_tensor":
            parts = [arrays[k].astype(np.float32) for k in ("image", "rgb", "depth") if k in arrays]
            chw = [p.transpose(2, 0, 1) if p.ndim == 3 else p[None] for p in parts]
            x = np.ascontiguousarray(np.concatenate(chw)[None])
            bad = int(x.size - np.isfinite(x).sum())
            if bad:  # the model would give NaN scores without a word
                raise InputError(
                    f"{', '.join(str(f) for f in files.values() if f)}: {bad} input values "
                    "are NaN or inf after preprocessing"
                )
            return x, box
        else:
            raise InputError(f"model.json: step {op!r} is unknown to this client")
    raise InputError("model.json: the preprocessing steps end without to_tensor")


def preprocess(path: str | Path, meta: dict) -> np.ndarray:
    """One image file -> the ``(1, C, H, W)`` float32 input the graph was exported for."""
    pre = meta["preprocess"]
    check_contract(pre, CONTRACT)
    return run_steps(pre["steps"], {"image": str(path)})[0]


def classify(sess: ort.InferenceSession, image: str | Path, meta: dict) -> np.ndarray:
    """Class probabilities of one image."""
    (logits,) = sess.run(None, {meta["inputs"][0]["name"]: preprocess(image, meta)})
    z = logits[0].astype(np.float64)
    if z.shape != (len(meta["class_names"]),):
        raise InputError(
            f"the model gives {z.shape[-1] if z.ndim else 1} scores but model.json has "
            f"{len(meta['class_names'])} class names"
        )
    if not np.isfinite(z).all():
        raise InputError(f"{image}: the model gave NaN or inf scores")
    e = np.exp(z - z.max())
    return e / e.sum()


# --- grasps --------------------------------------------------------------------------------


def area_weights(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` overlap of each output pixel's span with each input pixel, over k."""
    k = n_in / n_out
    d = np.arange(n_out, dtype=np.float64)[:, None]
    s = np.arange(n_in, dtype=np.float64)[None]
    return np.clip(np.minimum((d + 1) * k, s + 1) - np.maximum(d * k, s), 0, None) / k


def resize_area(img: np.ndarray, size: int) -> np.ndarray:
    """The contract's area resize of an (H, W) or (H, W, C) image to size x size."""
    H, W = img.shape[:2]
    if H == W == size:
        return img
    x = img.astype(np.float64).reshape(H, W, -1)
    C = x.shape[2]
    rows = (area_weights(H, size) @ x.reshape(H, W * C)).reshape(size, W, C)
    cols = area_weights(W, size) @ rows.transpose(1, 0, 2).reshape(W, size * C)
    out = cols.reshape(size, size, C).transpose(1, 0, 2).reshape(size, size, *img.shape[2:])
    if img.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out.astype(np.float32)


def fill_holes(depth: np.ndarray) -> np.ndarray:
    """The contract's hole filling: rounds of 8-neighbour means until no hole is left."""
    valid = np.isfinite(depth) & (depth > 0)
    if valid.all():
        return depth
    if not valid.any():
        return np.zeros_like(depth)
    H, W = depth.shape
    vals = np.where(valid, depth, 0).astype(np.float64)
    while not valid.all():
        pv, pm = np.pad(vals, 1), np.pad(valid, 1).astype(np.int64)
        total = sum(pv[1 + dy : 1 + dy + H, 1 + dx : 1 + dx + W] for dy, dx in NEIGHBOURS)
        count = sum(pm[1 + dy : 1 + dy + H, 1 + dx : 1 + dx + W] for dy, dx in NEIGHBOURS)
        new = ~valid & (count > 0)
        vals[new] = (total[new] / count[new]).astype(np.float32)
        valid = valid | new
    return vals.astype(np.float32)


def decode_depth(path: str | None, rgb: np.ndarray | None, scale: float = 0.001) -> np.ndarray:
    """The ``decode_depth`` step: float32 metres, (H, W) as the RGB image. A float image is
    metres; a 16-bit (or 32-bit integer) one is multiplied by ``integer_scale`` (millimetres,
    as RealSense and Kinect write); 8-bit or colour images hold no depth."""
    if path is None:
        raise InputError("this grasp model takes depth: pass --depth")
    with Image.open(path) as im:
        if im.mode == "F":
            depth = np.asarray(im, dtype=np.float32)
        elif im.mode.startswith("I;16") or im.mode == "I":
            depth = np.asarray(im).astype(np.float32) * np.float32(scale)
        else:
            raise InputError(
                f"{path}: a {im.mode} image is not a depth map; expected a float32 TIFF in "
                "metres or a 16-bit PNG/TIFF in millimetres"
            )
    if rgb is not None and depth.shape != rgb.shape[:2]:
        raise InputError(f"depth {depth.shape} does not match image {rgb.shape[:2]}: {path}")
    return depth


def grasp_input(rgb_path: str, depth_path: str | None, meta: dict) -> tuple[np.ndarray, dict]:
    """An RGB-D pair -> ``((1, C, S, S) float32 input, crop box {x0, y0, side, size})``."""
    pre = meta["preprocess"]
    check_contract(pre, GRASP_CONTRACT)
    return run_steps(pre["steps"], {"rgb": rgb_path, "depth": depth_path})


def gaussian(m: np.ndarray, sigma: float) -> np.ndarray:
    """OpenCV's GaussianBlur(m, (0, 0), sigma) on a float32 map, border reflect-101."""
    if sigma <= 0:
        return m
    n = int(np.rint(sigma * 8 + 1)) | 1
    g = np.exp(-0.5 / sigma**2 * (np.arange(n) - (n - 1) * 0.5) ** 2).astype(np.float32)
    g = (g * (1 / g.astype(np.float64).sum())).astype(np.float32).astype(np.float64)
    r = n // 2
    p = np.pad(m.astype(np.float64), r, mode="reflect")  # numpy's reflect is reflect-101
    H, W = m.shape
    rows = sum(g[i] * p[:, i : i + W] for i in range(n))
    return sum(g[i] * rows[i : i + H] for i in range(n)).astype(np.float32)


def local_peaks(q: np.ndarray, dist: int, threshold: float, num: int) -> list[tuple[int, int]]:
    """The contract's peak rule: window maxima, plateaus to one pixel, greedy thinning."""
    H, W = q.shape
    pad = np.pad(q, dist, constant_values=-np.inf)
    window = np.max(
        [pad[dy : dy + H, dx : dx + W] for dy in range(2 * dist + 1) for dx in range(2 * dist + 1)],
        axis=0,
    )
    mask = (q >= window) & (q >= threshold)
    rows, cols = np.nonzero(mask)
    if dist > 0 and len(rows):
        big = H * W
        lab = np.where(mask, np.arange(big).reshape(H, W), big)
        while True:  # each group takes the raster index of its first pixel
            p = np.pad(lab, 1, constant_values=big)
            low = np.min([p[1 + dy : 1 + dy + H, 1 + dx : 1 + dx + W] for dy, dx in NEIGHBOURS], 0)
            new = np.where(mask, np.minimum(lab, low), big)
            if (new == lab).all():
                break
            lab = new
        _, group = np.unique(lab[rows, cols], return_inverse=True)
        count = np.bincount(group)
        cy, cx = np.bincount(group, rows) / count, np.bincount(group, cols) / count
        near = np.lexsort(((rows - cy[group]) ** 2 + (cols - cx[group]) ** 2, group))
        first = near[np.r_[True, group[near][1:] != group[near][:-1]]]
        rows, cols = rows[first], cols[first]
    peaks: list[tuple[int, int]] = []
    for i in np.argsort(-q[rows, cols], kind="stable"):
        r, c = int(rows[i]), int(cols[i])
        if all(max(abs(r - pr), abs(c - pc)) > dist for pr, pc in peaks):
            peaks.append((r, c))
            if len(peaks) == num:
                break
    return peaks


def find_grasps(
    sess: ort.InferenceSession, rgb: str, depth: str | None, meta: dict, top: int
) -> list[dict]:
    """The best ``top`` grasps on the raw image, as ``vtfm grasp`` finds them: the
    ``postprocess.steps`` in the order listed."""
    x, box = grasp_input(rgb, depth, meta)
    post = meta["postprocess"]
    keys = post["maps"]["channels"]  # quality, cos, sin, width: the channels of "maps"
    S, side, out = box["size"], box["side"], []

    def run(v: np.ndarray) -> dict[str, np.ndarray]:
        (maps,) = sess.run(None, {meta["inputs"][0]["name"]: v})  # (1, 4, H, W)
        if maps.ndim != 4 or maps.shape[1] != len(keys) or not np.isfinite(maps).all():
            raise InputError(f"the model gave maps {maps.shape}, not {len(keys)} finite channels")
        return {k: maps[:, i : i + 1] for i, k in enumerate(keys)}

    maps, peaks = run(x), []
    for step in post["steps"]:
        op = step["op"]
        if op == "flip_average" and step["enabled"]:
            for axis in (3, 2):
                m = run(np.ascontiguousarray(np.flip(x, axis)))
                for k in maps:
                    maps[k] = maps[k] + (-1 if k == "sin" else 1) * np.flip(m[k], axis)
            maps = {k: v / np.float32(3) for k, v in maps.items()}
        elif op == "gaussian_filter":
            maps = {k: gaussian(maps[k][0, 0], step["sigma"][k]) for k in keys}
        elif op == "peaks":
            peaks = local_peaks(maps["quality"], step["min_distance"], step["threshold"], top)
        elif op == "grasps":
            for r, c in peaks:
                a = 0.5 * math.atan2(maps["sin"][r, c], maps["cos"][r, c])
                opening = float(maps["width"][r, c]) * step["width_scale"]
                out.append(
                    {
                        "row": r,
                        "col": c,
                        "angle": (a + math.pi / 2) % math.pi - math.pi / 2,
                        "opening": opening,
                        "jaw": opening * 0.5,
                        "quality": float(maps["quality"][r, c]),
                    }
                )
        elif op == "to_image":
            scale, half = np.float32(S / side), np.float32(0.5)
            for g in out:
                r, c = g.pop("row"), g.pop("col")
                g["x"] = float((np.float32(c) + half) / scale - half + box["x0"])
                g["y"] = float((np.float32(r) + half) / scale - half + box["y0"])
                g["opening"] *= side / S
                g["jaw"] *= side / S
        elif op != "flip_average":
            raise InputError(f"model.json: postprocess step {op!r} is unknown to this client")
    keep = ("x", "y", "angle", "opening", "jaw", "quality")
    return [{k: g[k] for k in keep} for g in out]


def in_metres(g: dict, depth: np.ndarray, k: list[float], rule: dict) -> dict:
    """One image grasp in the camera's optical frame (x right, y down, z forward), metres:
    ``postprocess.metric``'s rules, on the raw image's depth and intrinsics fx, fy, cx, cy."""
    fx, fy, cx, cy = k

    def ray(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.stack([(u - cx) / fx, (v - cy) / fy, np.ones_like(u)], -1)

    x, y, t = g["x"], g["y"], g["angle"]
    a, b = np.array([math.cos(t), -math.sin(t)]), np.array([math.sin(t), math.cos(t)])
    ho, hj = rule["core"] * g["opening"] / 2, g["jaw"] / 2
    H, W = depth.shape
    rows, cols = np.mgrid[0:H, 0:W]  # whole-image grid: simple, not fast
    dx, dy = cols - x, rows - y
    core = (np.abs(dx * a[0] + dy * a[1]) <= ho) & (np.abs(dx * b[0] + dy * b[1]) <= hj)
    core |= (cols == math.floor(x + 0.5)) & (rows == math.floor(y + 0.5))
    d = depth[core].astype(np.float64)
    ok = np.isfinite(d) & (d > 0)
    if not ok.any():
        return dict.fromkeys(("x_m", "y_m", "z_m", "yaw", "opening_m"))
    u, v, d = cols[core][ok].astype(np.float64), rows[core][ok].astype(np.float64), d[ok]
    z0 = float(np.percentile(d, rule["percentile"]))
    near = d <= z0 + rule["band"]
    pts = ray(u[near], v[near]) * d[near, None]
    ends = np.array([[x, y], [x, y] - g["opening"] / 2 * a, [x, y] + g["opening"] / 2 * a])
    r = ray(ends[:, 0], ends[:, 1])  # centre, first plate end, second
    p = r * z0
    if len(pts) >= 3:
        mean = pts.mean(0)
        _, sv, vt = np.linalg.svd(pts - mean, full_matrices=False)
        n = vt[-1]
        if sv[1] >= 1e-9 and np.all(
            np.abs(r @ n) > rule["min_ray_cos"] * np.linalg.norm(r, axis=1)
        ):
            on = r * ((n @ mean) / (r @ n))[:, None]
            p = on if np.all(on[:, 2] > 0) else p
    dx, dy = p[2, 0] - p[1, 0], p[2, 1] - p[1, 1]
    yaw = (math.atan2(dy, dx) + math.pi / 2) % math.pi - math.pi / 2
    return {
        "x_m": float(p[0, 0]),
        "y_m": float(p[0, 1]),
        "z_m": float(p[0, 2]),
        "yaw": yaw,
        "opening_m": float(np.linalg.norm(p[2] - p[1])),
    }


def intrinsics(text: str) -> list[float]:
    """``--intrinsics fx,fy,cx,cy``: four finite numbers > 0."""
    try:
        k = [float(v) for v in text.split(",")]
    except ValueError:
        k = []
    if len(k) != 4 or not all(math.isfinite(v) and v > 0 for v in k):
        raise InputError(f"--intrinsics takes fx,fy,cx,cy (4 finite numbers > 0), got {text!r}")
    return k


# --- model.json ------------------------------------------------------------------------------

MAX_META_BYTES = 4 * 2**20  # an exported model.json is a few kB
MAX_DEPTH = 32  # nesting: export writes 5 levels; json.loads recurses once per level
MAX_SQUARE = math.isqrt(MAX_PIXELS)  # the largest resize_area side
_RGB = ("decode", "convert", "center_crop_square", "resize_area")
_DEPTH = ("decode_depth", "center_crop_square", "fill_depth_holes", "resize_area", "center_depth")
_RGBD = ("decode", "convert", *_DEPTH)
ORDERS: dict[str, list[tuple[str, ...]]] = {
    # the step orders vision_tfm writes (tasks/classification.py cls_preprocess and
    # tasks/grasp/spec.py grasp_preprocess; docs/deployment.md states them); each op once
    CONTRACT: [("decode", "convert", "resize_short_side", "center_crop", "normalize", "to_tensor")],
    GRASP_CONTRACT: [  # input rgbd, rgb, depth; each with normalise "fixed", then "image"
        (*_RGBD, "normalize_rgb", "to_tensor"),
        (*_RGBD, "standardise", "to_tensor"),
        (*_RGB, "normalize_rgb", "to_tensor"),
        (*_RGB, "standardise", "to_tensor"),
        (*_DEPTH, "to_tensor"),
        (*_DEPTH, "standardise", "to_tensor"),
    ],
}
POST_ORDER = ("flip_average", "gaussian_filter", "peaks", "grasps", "to_image")
TASKS = {"cls": CONTRACT, "grasp": GRASP_CONTRACT}  # task -> the contract its steps follow
MAP_CHANNELS = ["quality", "cos", "sin", "width"]
STEP_KEYS: dict[str, dict[str, str]] = {  # op -> each key the client reads -> its kind
    "decode": {"file": "image_name"},
    "convert": {"applies_to": "image_array", "to": "mode"},
    "resize_short_side": {"size": "side"},
    "center_crop": {"size": "sides"},
    "normalize": {"mean": "means", "std": "stds"},
    "decode_depth": {"integer_scale": "positive"},
    "center_crop_square": {"applies_to": "all_arrays", "size": "side_or_null"},
    "fill_depth_holes": {"applies_to": "depth_array"},
    "resize_area": {"applies_to": "all_arrays", "size": "square"},
    "center_depth": {"applies_to": "depth_array", "clip": "positive"},
    "normalize_rgb": {"applies_to": "image_array", "mean": "means", "std": "stds"},
    "standardise": {"applies_to": "all_arrays", "min_std": "positive"},
    "to_tensor": {},
    "flip_average": {"enabled": "bool"},
    "gaussian_filter": {"sigma": "sigmas"},
    "peaks": {"min_distance": "distance", "threshold": "number"},
    "grasps": {"width_scale": "positive"},
    "to_image": {},
}
DEFAULTS = {"applies_to": ["image"], "integer_scale": 0.001}  # what a key left out means
METRIC_KEYS = {  # postprocess.metric: what --intrinsics reads
    "core": "positive",
    "percentile": "percent",
    "band": "nonnegative",
    "min_ray_cos": "unit",
}


def _finite(v: object, low: float = -math.inf, high: float = math.inf) -> bool:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        x = float(v)  # a JSON integer may have thousands of digits
    except OverflowError:
        return False
    return math.isfinite(x) and low <= x <= high


def _whole(v: object, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _each(v: object, counts: tuple[int, ...], ok: Callable[[Any], bool]) -> bool:
    return isinstance(v, list) and len(v) in counts and all(ok(x) for x in v)


Kind = tuple[str, Callable[[Any, dict], bool]]  # what a value must be; its test on (v, context)
KINDS: dict[str, Kind] = {
    "image_name": ("{image!r}", lambda v, c: v == c["image"]),
    "mode": ("one of {modes}", lambda v, c: isinstance(v, str) and v in c["modes"]),
    "image_array": ("[{image!r}]", lambda v, c: v == [c["image"]]),
    "depth_array": ("['depth']", lambda v, c: v == ["depth"]),
    "all_arrays": ("{arrays}", lambda v, c: v == c["arrays"]),
    "side": (f"a whole number in 1..{MAX_SIDE}", lambda v, c: _whole(v, 1, MAX_SIDE)),
    "sides": (
        f"2 whole numbers in 1..{MAX_SIDE}",
        lambda v, c: _each(v, (2,), lambda x: _whole(x, 1, MAX_SIDE)),
    ),
    "side_or_null": (
        f"null or a whole number in 1..{MAX_SIDE}",
        lambda v, c: v is None or _whole(v, 1, MAX_SIDE),
    ),
    "square": (
        f"2 equal whole numbers in 1..{MAX_SQUARE}",
        lambda v, c: _each(v, (2,), lambda x: _whole(x, 1, MAX_SQUARE)) and v[0] == v[1],
    ),
    "means": ("a list of {n} finite numbers", lambda v, c: _each(v, c["counts"], _finite)),
    "stds": (
        "a list of {n} finite numbers > 0",
        lambda v, c: _each(v, c["counts"], lambda x: _finite(x) and x > 0),
    ),
    "number": ("a finite number", lambda v, c: _finite(v)),
    "positive": ("a finite number > 0", lambda v, c: _finite(v) and v > 0),
    "nonnegative": ("a finite number >= 0", lambda v, c: _finite(v, 0)),
    "percent": ("a number in 0..100", lambda v, c: _finite(v, 0, 100)),
    "unit": ("a number in 0..1", lambda v, c: _finite(v, 0, 1)),
    "bool": ("true or false", lambda v, c: isinstance(v, bool)),
    "sigmas": (
        "{{quality, cos, sin, width}}, each a number in 0..{side}",
        lambda v, c: (
            isinstance(v, dict)
            and sorted(v) == sorted(MAP_CHANNELS)
            and all(_finite(x, 0, c["side"]) for x in v.values())
        ),
    ),
    "distance": ("a whole number in 0..{side}", lambda v, c: _whole(v, 0, c["side"])),
}
LEARNS: dict[str, Callable[[dict], dict]] = {  # op -> what later steps' kinds take from it
    "convert": lambda s: _counts(len(s["to"])),  # mean and std: 1 value, or 1 per channel
    "resize_area": lambda s: {"side": s["size"][0]},  # a blur or peak window spans the map
}
_MISSING = object()


def _counts(channels: int) -> dict:
    counts = tuple(sorted({1, channels}))
    return {"counts": counts, "n": " or ".join(map(str, counts))}


def read_meta(path: Path) -> object:
    """model.json's JSON, from a regular file of at most ``MAX_META_BYTES`` nested at most
    ``MAX_DEPTH`` deep: a FIFO would block, ``/dev/zero`` never end, deep nesting recurse."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)  # non-blocking: opening a FIFO waits for no writer
    except OSError as e:
        raise InputError(f"{path}: cannot open model.json ({e.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)  # the file opened, not what the name points at later
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: model.json must be a regular file, not a special one")
        data = fh.read(MAX_META_BYTES + 1) if st.st_size <= MAX_META_BYTES else b""
    if not data or len(data) > MAX_META_BYTES:
        size = "empty" if st.st_size == 0 else f"over {MAX_META_BYTES:,} bytes"
        raise InputError(f"{path}: model.json is {size}; export writes a few kB")
    try:
        meta = json.loads(data.decode("utf-8"))
    except RecursionError:
        meta = None  # refused below as nested too deep
    except ValueError as e:  # not UTF-8, not JSON, an integer of over 4300 digits
        raise InputError(f"{path}: not JSON ({str(e)[:200]})") from None
    stack, deep = [(meta, 1)], meta is None
    while stack and not deep:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            deep = depth > MAX_DEPTH
            stack += [(x, depth + 1) for x in (v.values() if isinstance(v, dict) else v)]
    if deep:
        raise InputError(f"{path}: model.json nests deeper than {MAX_DEPTH} levels")
    return meta


def _plain_name(name: object) -> bool:
    """A file name with no folder part: ``files`` may not point outside the model's folder."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\:\0")
    )


def _shown(v: object) -> str:
    return json.dumps(v, default=str)[:200]


def check_order(
    steps: object, orders: list[tuple[str, ...]], what: str, where: Path, contract: str
) -> None:
    """``what`` (``preprocess.steps``) lists one of ``orders``: each step an object with an
    ``op``, the ops in the contract's order, each as often as the contract has it."""
    if not isinstance(steps, list):
        raise InputError(f"{where}: {what} must be a list of steps, got {_shown(steps)}")
    for i, step in enumerate(steps):
        if not (isinstance(step, dict) and isinstance(step.get("op"), str)):
            raise InputError(f"{where}: {what}[{i}] must be an object with an op: {_shown(step)}")
    ops = tuple(step["op"] for step in steps)
    if ops in orders:
        return
    i = 0  # the first index where no allowed order goes on as ops does
    while any(o[: i + 1] == ops[: i + 1] for o in orders):
        i += 1
    near = [o for o in orders if o[:i] == ops[:i]]  # the orders ops follows up to i
    want = " or ".join(dict.fromkeys(repr(o[i]) if i < len(o) else "the end" for o in near))
    got = f"is {ops[i]!r}" if i < len(ops) else "is missing"
    has = "ends there" if want == "the end" else f"has {want} there"
    whole = f" (the steps: {', '.join(near[0])})" if len(near) == 1 else ""
    raise InputError(f"{where}: {what}[{i}] {got}; {contract} {has}{whole}")


def check_keys(steps: list[dict], what: str, where: Path, context: dict) -> None:
    """Each step's keys the client reads, of the kind ``STEP_KEYS`` names (a key left out
    reads as its ``DEFAULTS`` value); ``context`` gives what a kind depends on."""
    for i, step in enumerate(steps):
        op = step["op"]
        for key, kind in STEP_KEYS[op].items():
            desc, ok = KINDS[kind]
            v = step.get(key, DEFAULTS.get(key, _MISSING))
            if v is _MISSING or not ok(v, context):
                want = desc.format(**context)
                got = "it is missing" if v is _MISSING else f"got {_shown(v)}"
                raise InputError(f"{where}: {what}[{i}] {op}.{key} must be {want}, {got}")
        context.update(LEARNS.get(op, lambda s: {})(step))


def check_meta(meta: object, where: Path) -> dict:
    """Refuse, in one line and before anything runs, a ``model.json`` outside its contract:
    steps missing, repeated or out of order, a key missing or of the wrong type, a std that
    would give NaN scores, a size that would exhaust memory, a file name with a folder."""
    task = meta.get("task") if isinstance(meta, dict) else None
    if not isinstance(task, str) or task not in TASKS:
        raise InputError(f"{where}: task is {_shown(task)}; expected one of {sorted(TASKS)}")
    _check_files(meta, where)
    inputs, names = meta.get("inputs"), meta.get("class_names")
    if not (isinstance(inputs, list) and inputs and isinstance(inputs[0], dict)):
        raise InputError(f"{where}: inputs must list the graph's inputs, got {_shown(inputs)}")
    if not (isinstance(inputs[0].get("name"), str) and inputs[0]["name"]):
        raise InputError(f"{where}: inputs[0].name must be a string, got {_shown(inputs[0])}")
    if task == "cls" and not (
        isinstance(names, list) and names and all(isinstance(n, str) for n in names)
    ):
        raise InputError(f"{where}: class_names must be a list of strings, got {_shown(names)}")
    pre = meta.get("preprocess")
    if not isinstance(pre, dict):
        raise InputError(f"{where}: preprocess must be an object, got {_shown(pre)}")
    check_contract(pre, TASKS[task])
    check_order(
        pre.get("steps"), ORDERS[pre["contract"]], "preprocess.steps", where, pre["contract"]
    )
    ops = [step["op"] for step in pre["steps"]]
    image = "image" if task == "cls" else "rgb"  # what decode reads, by the contract
    context = {
        "image": image,
        "arrays": [k for k, op in ((image, "decode"), ("depth", "decode_depth")) if op in ops],
        "modes": ["L", "RGB"] if task == "cls" else ["RGB"],
        **_counts(3),
        "side": 1,
    }
    check_keys(pre["steps"], "preprocess.steps", where, context)
    if task == "grasp":
        _check_post(meta.get("postprocess"), where, context)
    return meta


def _check_files(meta: dict, where: Path) -> None:
    files = meta.get("files")
    if not (isinstance(files, list) and files and all(isinstance(f, dict) for f in files)):
        raise InputError(f"{where}: files must list the files to ship, got {_shown(files)}")
    for i, f in enumerate(files):
        if not _plain_name(f.get("name")):
            name = _shown(f.get("name"))
            raise InputError(f"{where}: files[{i}]: {name} is not a plain file name")
        sha = f.get("sha256")
        hexed = isinstance(sha, str) and len(sha) == 64 and set(sha) <= set("0123456789abcdef")
        if not (_whole(f.get("bytes"), 0, 2**63) and hexed):
            got = _shown({k: f.get(k) for k in ("bytes", "sha256")})
            raise InputError(
                f"{where}: files[{i}] ({f['name']}) needs bytes (a whole number) and sha256 "
                f"(64 lowercase hex digits), got {got}"
            )


def _check_post(post: object, where: Path, context: dict) -> None:
    """A grasp model's ``postprocess``: the maps' channels, the steps, the metric if any."""
    maps = post.get("maps") if isinstance(post, dict) else None
    channels = maps.get("channels") if isinstance(maps, dict) else None
    if channels != MAP_CHANNELS:
        raise InputError(
            f"{where}: postprocess.maps.channels is {_shown(channels)}; expected {MAP_CHANNELS}"
        )
    check_order(post.get("steps"), [POST_ORDER], "postprocess.steps", where, GRASP_CONTRACT)
    check_keys(post["steps"], "postprocess.steps", where, context)
    rule = post.get("metric")
    if rule is None:  # needed by --intrinsics only, which says so
        return
    if not isinstance(rule, dict):
        raise InputError(f"{where}: postprocess.metric must be an object, got {_shown(rule)}")
    for key, kind in METRIC_KEYS.items():
        desc, ok = KINDS[kind]
        if not ok(rule.get(key), context):
            raise InputError(
                f"{where}: postprocess.metric.{key} must be {desc}, got {_shown(rule.get(key))}"
            )


def print_grasps(sess: ort.InferenceSession, args: argparse.Namespace, meta: dict) -> None:
    """The grasps as ``vtfm grasp`` prints them (or as JSON); with --intrinsics, in metres."""
    k = intrinsics(args.intrinsics) if args.intrinsics else None
    grasps = find_grasps(sess, args.images[0], args.depth, meta, max(1, args.top))
    if k is not None:
        if args.depth is None:
            raise InputError("--intrinsics needs the view's depth: pass --depth")
        rgb = np.asarray(decode(args.images[0]))  # the raw view: its size is the depth's
        depth = decode_depth(args.depth, rgb)
        rule = meta["postprocess"].get("metric")  # check_meta checked it, where present
        if rule is None:
            raise InputError("model.json has no postprocess.metric: export the model again")
        grasps = [{**g, **in_metres(g, depth, k, rule)} for g in grasps]
    if args.json:
        print(json.dumps(grasps))
        return
    head = f"{'x':>8} {'y':>8} {'angle_deg':>10} {'opening':>8} {'jaw':>8} {'quality':>8}"
    print(
        head + (f" {'x_m':>8} {'y_m':>8} {'z_m':>8} {'yaw_deg':>10} {'opening_m':>8}" if k else "")
    )
    for g in grasps:  # as vtfm grasp prints
        line = (
            f"{g['x']:8.1f} {g['y']:8.1f} {math.degrees(g['angle']):10.1f} "
            f"{g['opening']:8.1f} {g['jaw']:8.1f} {g['quality']:8.3f}"
        )
        if k is not None and g["z_m"] is None:  # no valid depth under the grasp
            line += f" {'-':>8} {'-':>8} {'-':>8} {'-':>10} {'-':>8}"
        elif k is not None:
            line += (
                f" {g['x_m']:8.3f} {g['y_m']:8.3f} {g['z_m']:8.3f} "
                f"{math.degrees(g['yaw']):10.1f} {g['opening_m']:8.3f}"
            )
        print(line)


def check_session(sess: ort.InferenceSession, meta: dict) -> None:
    """The graph takes the input model.json names and gives one score per class name (where
    its output width is fixed; a dynamic one is checked on the first image)."""
    name = meta["inputs"][0]["name"]
    if name not in [i.name for i in sess.get_inputs()]:
        raise InputError(f"model.json names input {name[:200]!r}; the model has no such input")
    width = sess.get_outputs()[0].shape[-1] if sess.get_outputs()[0].shape else None
    if meta["task"] == "cls" and isinstance(width, int) and width != len(meta["class_names"]):
        raise InputError(
            f"the model gives {width} scores but model.json has "
            f"{len(meta['class_names'])} class names"
        )


def check_files(folder: Path, meta: dict, sha256: bool) -> None:
    """Every file ``model.json`` lists is present beside the model (onnxruntime would only
    say "External data path does not exist"), with its size and, if asked, its sha256."""
    for f in meta["files"]:
        path = folder / f["name"]
        if not path.is_file() or path.stat().st_size != f["bytes"]:
            raise InputError(f"{path}: missing or not {f['bytes']} bytes; model.json lists it")
        if sha256:
            with open(path, "rb") as fh:
                if hashlib.file_digest(fh, "sha256").hexdigest() != f["sha256"]:
                    raise InputError(f"{path}: sha256 differs from model.json's")


def main() -> None:
    """Bad input (a file, model.json, the model) is one line on stderr and exit code 2."""
    try:
        run()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except ORT_ERRORS as e:  # a file onnxruntime cannot load or run
        print(f"error: onnxruntime: {str(e).strip().splitlines()[0][:300]}", file=sys.stderr)
        sys.exit(2)
    except (OSError, ValueError) as e:  # unreadable files, JSON that is not JSON
        print(f"error: {str(e).strip().splitlines()[0][:300]}", file=sys.stderr)
        sys.exit(2)


def run() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="model.json (beside the model) states every step; see docs/deployment.md.",
    )
    p.add_argument("model", help="model.onnx (its .json beside it unless --meta)")
    p.add_argument("images", nargs="+", help="image files (grasp models: one RGB view)")
    p.add_argument(
        "--depth", help="grasp models: the view's depth (float TIFF in metres or 16-bit in mm)"
    )
    p.add_argument("--top", type=int, default=5, help="grasp models: grasps to print")
    p.add_argument("--json", action="store_true", help="grasp models: print grasps as JSON")
    p.add_argument(
        "--intrinsics",
        metavar="FX,FY,CX,CY",
        help="grasp models: the camera's intrinsics (pixels); grasps also in metres (--depth)",
    )
    p.add_argument("--meta", help="model.json (default: the model path with .json)")
    p.add_argument("--topk", type=int, default=5, help="classifiers: classes to print")
    p.add_argument("--verify", action="store_true", help="check the sha256 of model.json's files")
    p.add_argument("--probs", action="store_true", help="print every probability as JSON")
    args = p.parse_args()
    meta_path = Path(args.meta) if args.meta else Path(args.model).with_suffix(".json")
    meta = check_meta(read_meta(meta_path), meta_path)
    check_files(Path(args.model).parent, meta, args.verify)
    so = ort.SessionOptions()
    # trained models underflow to denormals, which x86 runs several times slower
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    sess = ort.InferenceSession(str(args.model), so, providers=["CPUExecutionProvider"])
    check_session(sess, meta)
    if meta["task"] == "grasp":
        if len(args.images) != 1:
            raise InputError("a grasp model takes one RGB view (and --depth)")
        print_grasps(sess, args, meta)
        return
    for image in args.images:
        prob = classify(sess, image, meta)
        if args.probs:  # one JSON line per image
            print(json.dumps(prob.tolist()))
            continue
        if len(args.images) > 1:
            print(f"{image}:")
        for i in np.argsort(-prob, kind="stable")[: max(1, args.topk)]:
            print(f"{meta['class_names'][i]:>20s}  {prob[i]:.4f}")  # as vtfm predict prints


if __name__ == "__main__":
    main()

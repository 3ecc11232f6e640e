"""Classify an image, or find grasps on an RGB-D pair, with an exported model, using only
onnxruntime, numpy and Pillow.

    vtfm export --checkpoint runs/<run>/best.pt          # writes model.onnx + model.json
    python examples/onnx_client.py runs/<run>/model.onnx photo.jpg --topk 5
    python examples/onnx_client.py runs/<grasp run>/model.onnx pcd0100r.png --depth pcd0100d.tiff

What an edge runtime needs besides the graph is in ``model.json``: class names and, under
``preprocess``, every step of ``vtfm predict``'s (or ``vtfm grasp``'s) preprocessing with its
library, dtype and rounding; for grasp models, ``postprocess`` states how the four maps (the
channels of one output) become grasps. This file follows those contracts step by step and
prints what ``vtfm predict`` / ``vtfm grasp`` print; tests/export/test_export.py holds it to
1e-5 in probability on gray, RGB, 16-bit, palette, RGBA, upscaled and non-square images,
and to vtfm grasp's top grasp within 1e-4 px and 1e-5 rad. Nothing here imports torch, OpenCV
or vision_tfm: copy the file to the device.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

CONTRACT = "vision_tfm.cls.preprocess/1"  # the preprocessing this client implements
GRASP_CONTRACT = "vision_tfm.grasp.preprocess/3"
NEIGHBOURS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx]  # raster order


def decode(path: str | Path, mode: str) -> np.ndarray:
    """The image as HWC uint8 in ``mode`` ("L" or "RGB"): the contract's decode + channels."""
    with Image.open(path) as im:
        if im.mode.startswith("I;16") or im.mode == "I":
            a = np.asarray(im, dtype=np.int64)
            if im.mode == "I" and (not a.size or a.max() <= 255):
                im = Image.fromarray(a.astype(np.uint8), "L")
            else:  # 16-bit: 65535 -> 255
                im = Image.fromarray(((a + 128) // 257).astype(np.uint8), "L")
        elif im.mode == "F":
            raise SystemExit(f"{path}: 32-bit float pixels have no fixed range")
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
    """Short side to ``short_side`` with the contract's integer bicubic."""
    h, w, _ = img.shape
    scale = short_side / min(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    if (nh, nw) == (h, w):
        return img
    xi, xw = cubic_taps(w, nw)
    yi, yw = cubic_taps(h, nh)
    rows = (img.astype(np.int64)[:, xi] * xw[None, :, :, None]).sum(2)  # (h, nw, C)
    out = (rows[yi] * yw[:, :, None, None]).sum(1)  # (nh, nw, C)
    return np.clip((out + (1 << 21)) >> 22, 0, 255).astype(np.uint8)


def check_contract(pre: dict, contract: str) -> None:
    if pre.get("contract") != contract:
        raise SystemExit(
            f"model.json states preprocessing {pre.get('contract')!r}; this client follows "
            f"{contract!r}"
        )


def preprocess(path: str | Path, meta: dict) -> np.ndarray:
    """One image file -> the ``(1, C, H, W)`` float32 input the graph was exported for."""
    pre = meta["preprocess"]
    check_contract(pre, CONTRACT)
    img = resize(decode(path, pre["channels"]["mode"]), pre["resize"]["short_side"])
    ch, cw = pre["center_crop"]["size"]
    top, left = (img.shape[0] - ch) // 2, (img.shape[1] - cw) // 2
    img = img[top : top + ch, left : left + cw]
    norm = pre["normalize"]
    mean = np.asarray(norm["mean"], np.float32) * np.float32(255)
    inv_std = np.reciprocal(np.asarray(norm["std"], np.float32) * np.float32(255))
    x = (img.astype(np.float32) - mean) * inv_std  # (H, W, C)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def classify(sess: ort.InferenceSession, image: str | Path, meta: dict) -> np.ndarray:
    """Class probabilities of one image."""
    (logits,) = sess.run(None, {meta["input_name"]: preprocess(image, meta)})
    z = logits[0].astype(np.float64)
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


def standardise(x: np.ndarray) -> np.ndarray:
    """Per-view standardisation: model.json's preprocess.normalise == "image"."""
    x = x.astype(np.float32)
    return (x - x.mean()) / max(float(x.std()), 1e-6)


def grasp_input(rgb_path: str, depth_path: str | None, meta: dict) -> tuple[np.ndarray, tuple]:
    """An RGB-D pair -> ``((1, C, S, S) float32 input, crop box (x0, y0, side))``."""
    pre = meta["preprocess"]
    check_contract(pre, GRASP_CONTRACT)
    S = pre["resize"]["size"][0]
    rgb = decode(rgb_path, "RGB")
    H, W = rgb.shape[:2]
    side = min(pre["crop"]["size"] or min(H, W), H, W)
    x0, y0 = (W - side) // 2, (H - side) // 2
    channels = []
    per_view = pre.get("normalise", "fixed") == "image"
    if pre["channels"][0] == "R":
        v = resize_area(rgb[y0 : y0 + side, x0 : x0 + side], S).astype(np.float32)
        if per_view:
            v = standardise(v)
        else:
            mean, std = (np.asarray(pre["rgb"][k], np.float32) for k in ("mean", "std"))
            v = (v / np.float32(255) - mean) / std
        channels += list(v.transpose(2, 0, 1))
    if pre["channels"][-1] == "D":
        if depth_path is None:
            raise SystemExit("this grasp model takes depth: pass --depth")
        with Image.open(depth_path) as im:
            depth = np.asarray(im, dtype=np.float32)
        if depth.shape != (H, W):
            raise SystemExit(f"depth {depth.shape} does not match image {(H, W)}: {depth_path}")
        d = resize_area(fill_holes(depth[y0 : y0 + side, x0 : x0 + side]), S)
        clip = np.float32(pre["depth"]["clip"])
        d = np.clip(d - np.float32(d.mean(dtype=np.float64)), -clip, clip)
        channels.append(standardise(d) if per_view else d)
    return np.stack(channels)[None].astype(np.float32), (x0, y0, side)


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
    """The best ``top`` grasps on the raw image, as ``vtfm grasp`` finds them."""
    x, (x0, y0, side) = grasp_input(rgb, depth, meta)
    post = meta["postprocess"]
    keys = ("quality", "cos", "sin", "width")  # the channels of the one output, "maps"

    def run(v: np.ndarray) -> dict[str, np.ndarray]:
        (maps,) = sess.run(None, {meta["input_name"]: v})  # (1, 4, H, W)
        return {k: maps[:, i : i + 1] for i, k in enumerate(keys)}

    maps = run(x)
    if post["flip_tta"]:
        for axis in (3, 2):
            m = run(np.ascontiguousarray(np.flip(x, axis)))
            for k in maps:
                maps[k] = maps[k] + (-1 if k == "sin" else 1) * np.flip(m[k], axis)
        maps = {k: v / np.float32(3) for k, v in maps.items()}
    sigma = post["filter"]["sigma"]
    f = {k: gaussian(maps[k][0, 0], sigma[k]) for k in keys}
    pk = post["peaks"]
    S = meta["preprocess"]["resize"]["size"][0]
    scale = np.float32(S / side)
    width_scale, out = post["grasp"]["width_scale"], []
    for r, c in local_peaks(f["quality"], pk["min_distance"], pk["threshold"], top):
        a = 0.5 * math.atan2(f["sin"][r, c], f["cos"][r, c])
        opening = float(f["width"][r, c]) * width_scale
        out.append(
            {
                "x": float((np.float32(c) + np.float32(0.5)) / scale - np.float32(0.5) + x0),
                "y": float((np.float32(r) + np.float32(0.5)) / scale - np.float32(0.5) + y0),
                "angle": (a + math.pi / 2) % math.pi - math.pi / 2,
                "opening": opening * (side / S),
                "jaw": opening * 0.5 * (side / S),
                "quality": float(f["quality"][r, c]),
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="model.onnx (its .json beside it unless --meta)")
    p.add_argument("images", nargs="+", help="image files (grasp models: one RGB view)")
    p.add_argument("--depth", help="grasp models: the view's depth file (float metres)")
    p.add_argument("--top", type=int, default=5, help="grasp models: grasps to print")
    p.add_argument("--json", action="store_true", help="grasp models: print grasps as JSON")
    p.add_argument("--meta", help="model.json (default: the model path with .json)")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--probs", action="store_true", help="print every probability as JSON")
    args = p.parse_args()
    meta_path = Path(args.meta) if args.meta else Path(args.model).with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    if meta.get("task") not in ("cls", "grasp"):
        raise SystemExit(f"{meta_path}: unknown task {meta.get('task')!r}")
    so = ort.SessionOptions()
    # trained models underflow to denormals, which x86 runs several times slower
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    sess = ort.InferenceSession(str(args.model), so, providers=["CPUExecutionProvider"])
    if meta["task"] == "grasp":
        if len(args.images) != 1:
            raise SystemExit("a grasp model takes one RGB view (and --depth)")
        grasps = find_grasps(sess, args.images[0], args.depth, meta, max(1, args.top))
        if args.json:
            print(json.dumps(grasps))
            return
        print(f"{'x':>8} {'y':>8} {'angle_deg':>10} {'opening':>8} {'jaw':>8} {'quality':>8}")
        for g in grasps:  # as vtfm grasp prints
            print(
                f"{g['x']:8.1f} {g['y']:8.1f} {math.degrees(g['angle']):10.1f} "
                f"{g['opening']:8.1f} {g['jaw']:8.1f} {g['quality']:8.3f}"
            )
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

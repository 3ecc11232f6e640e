"""Classify an image with an exported model, using only onnxruntime, numpy and Pillow.

    vtfm export --checkpoint runs/<run>/best.pt          # writes model.onnx + model.json
    python examples/onnx_client.py runs/<run>/model.onnx photo.jpg --topk 5

What an edge runtime needs besides the graph is in ``model.json``: class names and, under
``preprocess``, every step of ``vtfm predict``'s preprocessing with its library, dtype and
rounding. This file follows that contract step by step and prints what ``vtfm predict``
prints; tests/export/test_onnx_client.py holds it to 1e-5 in probability on gray, RGB,
16-bit, palette, RGBA, upscaled and non-square images. Nothing here imports torch or
vision_tfm: copy the file to the device.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

CONTRACT = "vision_tfm.cls.preprocess/1"  # the preprocessing this client implements


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


def preprocess(path: str | Path, meta: dict) -> np.ndarray:
    """One image file -> the ``(1, C, H, W)`` float32 input the graph was exported for."""
    pre = meta["preprocess"]
    if pre.get("contract") != CONTRACT:
        raise SystemExit(
            f"model.json states preprocessing {pre.get('contract')!r}; this client follows "
            f"{CONTRACT!r}"
        )
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="model.onnx (its .json beside it unless --meta)")
    p.add_argument("images", nargs="+")
    p.add_argument("--meta", help="model.json (default: the model path with .json)")
    p.add_argument("--topk", type=int, default=5)
    p.add_argument("--probs", action="store_true", help="print every probability as JSON")
    args = p.parse_args()
    meta_path = Path(args.meta) if args.meta else Path(args.model).with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    if meta.get("task") != "cls":
        raise SystemExit(f"this client classifies; {meta_path} is a {meta.get('task')!r} model")
    sess = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
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

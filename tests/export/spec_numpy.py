"""``model.json``'s classification preprocessing, implemented from the spec alone.

Written from docs/deployment.md and the numbers in ``model.json``, as a C++ or mobile engineer
would: no vision_tfm import (tests/export/test_model_json.py checks), no Pillow for PNG files
(its own reader below: zlib and numpy), Pillow only to turn JPEG bytes into samples. Grey
conversion, alpha, 16-bit, palettes, the resize, the crop and the normalisation are numpy.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

CONTRACT = "vision_tfm.cls.preprocess/2"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def read_png(data: bytes) -> tuple[np.ndarray, int, int, np.ndarray | None]:
    """A non-interlaced PNG's samples ``(H, W, C)`` (uint8 or, at bit depth 16, uint16 from
    big-endian pairs), its colour type and bit depth, and its palette ``(N, 3)`` if any."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    pos, idat, palette = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            W, H, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert interlace == 0, "interlaced PNG"
        elif kind == b"PLTE":
            palette = np.frombuffer(body, np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    C = CHANNELS[ctype]
    bits = depth * C  # per pixel
    bpp = max(1, bits // 8)  # the filters' byte distance
    stride = (W * bits + 7) // 8
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(H, stride + 1)
    rows = np.zeros((H, stride), np.int64)
    prev = np.zeros(stride, np.int64)
    for y in range(H):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        out = np.zeros(stride, np.int64)
        for x in range(stride):
            a = out[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if kind == 0:
                pred = 0
            elif kind == 1:
                pred = a
            elif kind == 2:
                pred = b
            elif kind == 3:
                pred = (a + b) // 2
            else:  # Paeth
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            out[x] = (line[x] + pred) & 0xFF
        rows[y] = prev = out
    packed = rows.astype(np.uint8)
    if depth == 16:
        samples = packed.view(">u2").astype(np.uint16).reshape(H, W, C)
    elif depth == 8:
        samples = packed.reshape(H, W, C)
    else:  # 1, 2 or 4 bits per sample, one sample per pixel
        samples = np.unpackbits(packed, axis=1).reshape(H, -1, depth)[:, :W]
        samples = (samples * (1 << np.arange(depth - 1, -1, -1))).sum(-1).astype(np.uint8)
        samples = samples[:, :, None]
    return samples, ctype, depth, palette


def decode(path: Path, step: dict) -> np.ndarray:
    """The ``decode`` step: uint8 ``(H, W, C)`` samples, C = 1 (grey), 2 (grey + alpha),
    3 (RGB) or 4 (RGBA); alpha is still there."""
    assert step["exif_orientation"].startswith("ignored")  # so no EXIF is read here
    data = path.read_bytes()
    if data[:8] != PNG_SIGNATURE:  # JPEG: Pillow gives the decoder's samples, nothing more
        from PIL import Image

        with Image.open(path) as im:
            assert im.mode in ("L", "RGB"), im.mode
            arr = np.asarray(im)
        return arr[:, :, None] if arr.ndim == 2 else arr
    samples, ctype, depth, palette = read_png(data)
    if ctype == 3:  # palette: index -> R, G, B; palette alpha ignored
        return palette[samples[:, :, 0]]
    if depth == 16:
        v = samples.astype(np.int64)
        if ctype == 0:  # grey_16bit: (v + 128) // 257
            return ((v + 128) // 257).astype(np.uint8)
        return (v >> 8).astype(np.uint8)  # colour_16bit (grey + alpha too): the high byte
    if depth < 8:  # grey_1_2_4bit: scaled to 0..255 (1 -> 255, 3 -> 255, 15 -> 255)
        return samples * np.uint8(255 // (2**depth - 1))
    return samples


def convert(pixels: np.ndarray, step: dict) -> np.ndarray:
    """The ``convert`` step: uint8 HWC with 1 (``L``) or 3 (``RGB``) channels, alpha dropped."""
    C = pixels.shape[2]
    colour = pixels[:, :, :3] if C >= 3 else np.repeat(pixels[:, :, :1], 3, axis=2)
    if step["to"] == "RGB":
        return colour
    if C in (1, 2):  # grey (+ alpha): the grey itself
        return pixels[:, :, :1]
    luma = step["luma"]
    wr, wg, wb = luma["weights"]
    c = colour.astype(np.int64)
    grey = (c[:, :, 0] * wr + c[:, :, 1] * wg + c[:, :, 2] * wb + luma["add"]) >> luma["shift"]
    return grey.astype(np.uint8)[:, :, None]


def cubic(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Taps and integer weights along one axis: Keys a = -0.75, float32, times 2048."""
    f32 = np.float32
    src = ((np.arange(n_out) + 0.5) * (1.0 / (n_out / n_in)) - 0.5).astype(f32)
    base = np.floor(src)
    t = src - base
    u = f32(1) - t
    a = f32(-0.75)
    w0 = ((a * (t + f32(1)) - f32(5) * a) * (t + f32(1)) + f32(8) * a) * (t + f32(1)) - f32(4) * a
    w1 = ((a + f32(2)) * t - (a + f32(3))) * t * t + f32(1)
    w2 = ((a + f32(2)) * u - (a + f32(3))) * u * u + f32(1)
    w3 = f32(1) - w0 - w1 - w2
    w = np.rint(np.stack([w0, w1, w2, w3], 1) * f32(2048)).astype(np.int64)
    taps = np.clip(base.astype(np.int64)[:, None] + np.arange(-1, 3), 0, n_in - 1)
    return taps, w


def resize_short_side(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    short = min(h, w)
    nh, nw = max(1, round(h * (size / short))), max(1, round(w * (size / short)))
    if (nh, nw) == (h, w):
        return img
    tx, wx = cubic(w, nw)
    ty, wy = cubic(h, nh)
    v = img.astype(np.int64)
    along_w = np.einsum("hxkc,xk->hxc", v[:, tx], wx)
    both = np.einsum("ykxc,yk->yxc", along_w[ty], wy)
    return np.clip((both + 2**21) >> 22, 0, 255).astype(np.uint8)


def preprocess(path: Path, meta: dict) -> np.ndarray:
    """An image file -> the ``(1, C, H, W)`` float32 input, running ``preprocess.steps``."""
    pre = meta["preprocess"]
    assert pre["contract"] == CONTRACT, pre["contract"]
    assert meta["size_order"] == "[height, width]"
    x = None
    for step in pre["steps"]:
        op = step["op"]
        if op == "decode":
            x = decode(Path(path), step)
        elif op == "convert":
            x = convert(x, step)
        elif op == "resize_short_side":
            x = resize_short_side(x, step["size"])
        elif op == "center_crop":
            ch, cw = step["size"]
            top, left = (x.shape[0] - ch) // 2, (x.shape[1] - cw) // 2
            x = x[top : top + ch, left : left + cw]
        elif op == "normalize":
            assert step["dtype"] == "float32"
            mean = np.asarray(step["mean"], np.float32) * np.float32(255)
            scale = np.float32(1) / (np.asarray(step["std"], np.float32) * np.float32(255))
            x = (x.astype(np.float32) - mean) * scale
        elif op == "to_tensor":
            assert step["layout"] == "NCHW" and step["dtype"] == "float32"
            return np.ascontiguousarray(x.transpose(2, 0, 1)[None])
        else:
            raise AssertionError(f"unknown step {op}")
    raise AssertionError("no to_tensor step")

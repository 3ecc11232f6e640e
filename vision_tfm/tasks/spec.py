"""The image-file steps every task's ``model.json`` contract opens with: decoding and channels.

``vtfm predict`` and ``vtfm grasp`` read a file with Pillow (:func:`vision_tfm.data.load_image`);
these steps state what that does in numbers, so a runtime without Pillow (C++, mobile) gets
the same uint8 pixels. Each step links the section of ``docs/deployment.md`` that states its
rules in prose; the tests implement the steps from ``model.json`` in numpy and compare.
"""

from __future__ import annotations

from typing import Any

DOC = "docs/deployment.md"
DECODE_SPEC = f"{DOC}#decoding-an-image-file"
CONVERT_SPEC = f"{DOC}#channel-conversion"

LUMA_WEIGHTS_16 = (19595, 38470, 7471)
"""ITU-R 601 luma as Pillow's ``convert("L")`` computes it: weights x 65536 (sum 65536), plus
:data:`LUMA_ROUND`, shifted right by 16 (``L24`` in Pillow's ``libImaging/Convert.c``)."""
LUMA_ROUND = 0x8000
SIZE_ORDER = "[height, width]"
"""How every size in ``model.json`` is ordered (``img_size``, crops, resizes)."""


def decode_step(what: str = "image") -> dict[str, Any]:
    """An image file's pixels as uint8, before any channel conversion."""
    return {
        "op": "decode",
        "file": what,
        "spec": DECODE_SPEC,
        "exif_orientation": "ignored: pixels as stored",
        "grey_16bit": "(v + 128) // 257",
        "colour_16bit": "v >> 8",
        "grey_int32": "v when every pixel <= 255, else (v + 128) // 257; outside 0..65535: refused",
        "grey_1_2_4bit": "v * 255, v * 85, v * 17 (v in 0..1, 0..3, 0..15)",
        "palette": "index -> the palette's R, G, B; palette alpha and tRNS ignored",
        "cmyk_jpeg": "C, M, Y, K = 255 - stored; R = nk - ((t + (t >> 8)) >> 8), "
        "t = C * nk + 128, nk = 255 - K; G, B alike",
        "float": "refused",
        "other_modes": "YCbCr, LAB, HSV files are outside this contract: refuse them",
    }


def convert_step(mode: str, what: str = "image") -> dict[str, Any]:
    """Decoded pixels to ``mode``: ``"L"`` (one grey channel) or ``"RGB"``."""
    step: dict[str, Any] = {
        "op": "convert",
        "applies_to": [what],
        "to": mode,
        "spec": CONVERT_SPEC,
        "alpha": "dropped, not composited",
    }
    if mode == "L":
        r, g, b = LUMA_WEIGHTS_16
        step["luma"] = {"weights": list(LUMA_WEIGHTS_16), "add": LUMA_ROUND, "shift": 16}
        step["formula"] = f"L = (R * {r} + G * {g} + B * {b} + {LUMA_ROUND}) >> 16"
    else:
        step["grey"] = "repeated into R, G and B"
    return step

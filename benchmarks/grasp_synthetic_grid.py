"""A grid of generated grasp views with their rectangles: docs/results/grasp_synthetic.png.

python benchmarks/grasp_synthetic_grid.py [--seed 0] [--views 8] [--out PNG]

Each tile is the 300x300 centre crop a deployed model sees (Cornell's protocol), RGB with the
positive rectangles (plates red, jaws blue, as Cornell's figures draw them) and negatives in
grey, above the depth map the sensor model returned (holes black).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from vision_tfm.data.grasp import crop_box
from vision_tfm.data.grasp.synthetic import SceneSettings, generate_labelled
from vision_tfm.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]


def tile(index: int, cfg: SceneSettings, side: int = 300) -> np.ndarray:
    """One view's crop: RGB with rectangles above its depth map."""
    v = generate_labelled(index, cfg)
    x0, y0, s = crop_box(v.rgb.shape[:2], side)
    off = np.array([x0, y0], np.float32)
    rgb = np.ascontiguousarray(v.rgb[y0 : y0 + s, x0 : x0 + s])
    grey, red, blue = (150, 150, 150), (220, 0, 0), (0, 60, 255)
    for rects, plate, jaw in ((v.negatives, grey, grey), (v.rects, red, blue)):
        for c in rects:
            p = np.round((c - off) * 4).astype(np.int32)
            for (a, b), col in zip(((0, 3), (1, 2), (0, 1), (2, 3)), (plate, plate, jaw, jaw)):
                cv2.line(rgb, tuple(p[a]), tuple(p[b]), col, 1, cv2.LINE_AA, 2)
    d = v.depth[y0 : y0 + s, x0 : x0 + s]
    valid = ~np.isnan(d)
    lo, hi = np.percentile(d[valid], [1, 99])
    g = np.clip((hi - np.nan_to_num(d, nan=hi)) / max(hi - lo, 1e-6), 0, 1)  # near = bright
    depth = cv2.applyColorMap((g * 255).astype(np.uint8), cv2.COLORMAP_VIRIDIS)[..., ::-1]
    depth[~valid] = 0
    return np.concatenate([rgb, depth], axis=0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--views", type=int, default=8)
    p.add_argument("--cols", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "docs/results/grasp_synthetic.png"))
    args = p.parse_args()
    cfg = replace(SceneSettings(), seed=args.seed)
    tiles = [tile(i, cfg) for i in range(args.views)]
    pad = lambda t: np.pad(t, ((3, 3), (3, 3), (0, 0)), constant_values=255)  # noqa: E731
    rows = [
        np.concatenate([pad(t) for t in tiles[r : r + args.cols]], axis=1)
        for r in range(0, len(tiles), args.cols)
    ]
    grid = np.concatenate(rows, axis=0)
    out = Path(args.out)
    img = Image.fromarray(grid).quantize(256, dither=Image.Dither.NONE)  # ~4x smaller file
    atomic_write(lambda f: img.save(f, format="PNG", optimize=True), out, "file")
    print(f"wrote {out} ({grid.shape[1]}x{grid.shape[0]})")


if __name__ == "__main__":
    main()

"""What ``model.json`` records of a grasp model's preprocessing and decoding.

The values a runtime without vision_tfm needs; the rules behind each step (library, dtype,
rounding) are stated under the contract's name in ``docs/deployment.md``, which
``examples/onnx_client.py`` follows.
"""

from __future__ import annotations

from typing import Any

from ...constants import MAP_KEYS
from ...data.grasp import DEPTH_CLIP, RGB_MEAN, RGB_STD
from ...grasp import MAP_ACTIVATIONS

GRASP_CONTRACT = "vision_tfm.grasp.preprocess/3"
"""Bump when a step or the graph's outputs change (/3: one "maps" output)."""

_CHANNELS = {"rgb": ["R", "G", "B"], "depth": ["D"], "rgbd": ["R", "G", "B", "D"]}


def grasp_preprocess(cfg: Any) -> dict[str, Any]:
    """``vtfm grasp``'s preprocessing of an RGB-D pair: centre crop, area resize, depth hole
    filling and centring, RGB normalisation."""
    d = cfg.data
    return {
        "contract": GRASP_CONTRACT,
        "spec": "docs/deployment.md#grasp-preprocessing",
        "channels": _CHANNELS[d.input],
        "crop": {"size": d.crop_size or None},
        "resize": {"size": [d.output_size, d.output_size], "rule": "area"},
        "depth": {"clip": DEPTH_CLIP, "holes": "filled from their 8 neighbours"},
        "normalise": d.normalise,
        "rgb": {"mean": RGB_MEAN.tolist(), "std": RGB_STD.tolist()},
        "layout": "NCHW float32, channels in the order above (depth last)",
    }


def grasp_postprocess(cfg: Any) -> dict[str, Any]:
    """How ``vtfm grasp`` turns the graph's four maps into grasps on the raw image."""
    kw = cfg.eval.decode_kwargs(cfg.data.width_scale)
    return {
        "spec": "docs/deployment.md#grasp-decoding",
        "outputs": {
            "maps": f"(N, {len(MAP_KEYS)}, H, W) float32, channels {', '.join(MAP_KEYS)}",
            "activations": dict(MAP_ACTIVATIONS),
        },
        "flip_tta": cfg.eval.flip_tta,
        "filter": {
            "sigma": {
                "quality": kw["quality_sigma"],
                "cos": kw["angle_sigma"],
                "sin": kw["angle_sigma"],
                "width": kw["width_sigma"],
            }
        },
        "peaks": {"min_distance": kw["min_distance"], "threshold": kw["threshold"]},
        "grasp": {"width_scale": kw["width_scale"], "jaw": "opening * 0.5"},
    }

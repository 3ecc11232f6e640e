"""What ``model.json`` records of a grasp model's preprocessing and decoding.

The ordered steps a runtime without vision_tfm repeats, with their numbers; the rules behind
each step (dtype, rounding) are stated in the section of ``docs/deployment.md`` it links,
which ``examples/onnx_client.py`` follows.
"""

from __future__ import annotations

from typing import Any

from ...constants import MAP_KEYS
from ...data.grasp import DEPTH_CLIP, DEPTH_SCALE, RGB_MEAN, RGB_STD
from ...grasp import MAP_ACTIVATIONS
from ...grasp.camera import CORE, DEPTH_PERCENTILE, MIN_RAY_COS, SURFACE_BAND_M
from ..spec import DOC, convert_step, decode_step

GRASP_CONTRACT = "vision_tfm.grasp.preprocess/4"
"""Bump when a step or the graph's outputs change (/3: one "maps" output; /4: the steps and
the decoding are ordered lists, image decoding stated)."""
PRE_SPEC = f"{DOC}#grasp-preprocessing"
POST_SPEC = f"{DOC}#grasp-decoding"
METRIC_SPEC = f"{DOC}#grasps-in-metres"

_CHANNELS = {"rgb": ["R", "G", "B"], "depth": ["D"], "rgbd": ["R", "G", "B", "D"]}


def grasp_preprocess(cfg: Any) -> dict[str, Any]:
    """``vtfm grasp``'s preprocessing of an RGB-D pair as ordered steps: decoding, centre
    crop, depth hole filling, area resize, depth centring, normalisation."""
    d = cfg.data
    rgb, depth = d.input != "depth", d.input != "rgb"
    both = [k for k, used in (("rgb", rgb), ("depth", depth)) if used]
    steps: list[dict[str, Any]] = []
    if rgb:
        steps += [decode_step("rgb"), convert_step("RGB", "rgb")]
    if depth:
        steps.append(
            {
                "op": "decode_depth",
                "spec": PRE_SPEC,
                "file": "depth",
                "dtype": "float32",
                "unit": "metres",
                "integer_scale": DEPTH_SCALE,
                "shape": "(H, W), the RGB image's",
            }
        )
    steps.append(
        {
            "op": "center_crop_square",
            "spec": PRE_SPEC,
            "applies_to": both,
            "size": d.crop_size or None,
            "side": "min(size, H, W); min(H, W) when size is null",
            "offset": "x0 = (W - side) // 2, y0 = (H - side) // 2",
        }
    )
    if depth:
        steps.append(
            {
                "op": "fill_depth_holes",
                "spec": PRE_SPEC,
                "applies_to": ["depth"],
                "holes": "NaN, inf or <= 0",
                "rule": "rounds of the mean of valid 8 neighbours",
            }
        )
    steps.append(
        {
            "op": "resize_area",
            "spec": PRE_SPEC,
            "applies_to": both,
            "size": [d.output_size, d.output_size],
            "rule": "area average, float64",
        }
    )
    if depth:
        steps.append(
            {"op": "center_depth", "spec": PRE_SPEC, "applies_to": ["depth"], "clip": DEPTH_CLIP}
        )
    if d.normalise == "image":
        steps.append(
            {
                "op": "standardise",
                "spec": PRE_SPEC,
                "applies_to": both,
                "min_std": 1e-6,
                "rule": "each of rgb and depth on its own mean and std, float32",
            }
        )
    elif rgb:
        steps.append(
            {
                "op": "normalize_rgb",
                "spec": PRE_SPEC,
                "applies_to": ["rgb"],
                "mean": RGB_MEAN.tolist(),
                "std": RGB_STD.tolist(),
                "dtype": "float32",
                "formula": "(v / 255 - mean) / std, mean and std cast to float32",
            }
        )
    steps.append(
        {
            "op": "to_tensor",
            "spec": PRE_SPEC,
            "layout": "NCHW",
            "dtype": "float32",
            "channels": _CHANNELS[d.input],
        }
    )
    return {"contract": GRASP_CONTRACT, "spec": PRE_SPEC, "steps": steps}


def grasp_postprocess(cfg: Any) -> dict[str, Any]:
    """How ``vtfm grasp`` turns the graph's four maps into grasps on the raw image, in order."""
    kw = cfg.eval.decode_kwargs(cfg.data.width_scale)
    angle = kw["angle_sigma"]
    return {
        "spec": POST_SPEC,
        "maps": {
            "output": "maps",
            "channels": list(MAP_KEYS),
            "activations": dict(MAP_ACTIVATIONS),
        },
        "steps": [
            {"op": "flip_average", "spec": POST_SPEC, "enabled": cfg.eval.flip_tta},
            {
                "op": "gaussian_filter",
                "spec": POST_SPEC,
                "sigma": {
                    "quality": kw["quality_sigma"],
                    "cos": angle,
                    "sin": angle,
                    "width": kw["width_sigma"],
                },
            },
            {
                "op": "peaks",
                "spec": POST_SPEC,
                "min_distance": kw["min_distance"],
                "threshold": kw["threshold"],
            },
            {
                "op": "grasps",
                "spec": POST_SPEC,
                "width_scale": kw["width_scale"],
                "jaw": "opening * 0.5",
            },
            {"op": "to_image", "spec": POST_SPEC},
        ],
        "metric": grasp_metric(),
    }


def grasp_metric() -> dict[str, Any]:
    """How ``vtfm grasp --intrinsics`` puts an image grasp in the camera's optical frame: not
    a step (it needs the camera's intrinsics, which the model does not know), a rule any
    client can apply to the grasps the steps give."""
    return {
        "spec": METRIC_SPEC,
        "needs": ["intrinsics fx, fy, cx, cy in pixels", "depth: the raw image's, decode_depth"],
        "frame": "camera optical: x right, y down, z forward, metres",
        "core": CORE,
        "percentile": DEPTH_PERCENTILE,
        "band": SURFACE_BAND_M,
        "min_ray_cos": MIN_RAY_COS,
    }

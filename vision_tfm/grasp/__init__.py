"""Grasp rectangles, dense-map encoding and decoding, and the rectangle metric.

No model, no data loading, no training: inference on a trained model is the grasp task's
(:mod:`vision_tfm.tasks.grasp`).
"""

from vision_tfm.grasp.maps import (
    MAP_ACTIVATIONS,
    MAP_KEYS,
    WIDTH_SCALE,
    activate_grasp_maps,
    activate_stacked,
    as_grasps,
    decode_grasps,
    encode_grasp_maps,
    split_maps,
)
from vision_tfm.grasp.metric import (
    ANGLE_THRESHOLD,
    IOU_THRESHOLD,
    angle_difference,
    batch_grasp_correct,
    grasp_correct,
    grasp_matches,
)
from vision_tfm.grasp.rect import (
    Grasp,
    corners_to_params,
    grasp_axes,
    params_to_corners,
    polygon_area,
    polygon_intersection,
    polygon_iou,
    rotate_points,
    wrap_angle,
)

__all__ = [
    "ANGLE_THRESHOLD",
    "IOU_THRESHOLD",
    "MAP_ACTIVATIONS",
    "MAP_KEYS",
    "WIDTH_SCALE",
    "Grasp",
    "activate_grasp_maps",
    "activate_stacked",
    "angle_difference",
    "as_grasps",
    "batch_grasp_correct",
    "corners_to_params",
    "decode_grasps",
    "encode_grasp_maps",
    "grasp_axes",
    "grasp_correct",
    "grasp_matches",
    "params_to_corners",
    "polygon_area",
    "polygon_intersection",
    "polygon_iou",
    "rotate_points",
    "split_maps",
    "wrap_angle",
]

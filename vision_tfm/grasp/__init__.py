"""Grasp rectangles, dense-map encoding and decoding, the rectangle metric, and inference."""

from vision_tfm.grasp.maps import (
    MAP_ACTIVATIONS,
    MAP_KEYS,
    WIDTH_SCALE,
    activate_grasp_maps,
    as_grasps,
    decode_grasps,
    encode_grasp_maps,
)
from vision_tfm.grasp.metric import (
    ANGLE_THRESHOLD,
    IOU_THRESHOLD,
    angle_difference,
    batch_grasp_correct,
    grasp_correct,
    grasp_matches,
)
from vision_tfm.grasp.predict import (
    GraspMaps,
    draw_grasps,
    flip_averaged,
    grasp_maps,
    predict_grasps,
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
    "GraspMaps",
    "activate_grasp_maps",
    "angle_difference",
    "as_grasps",
    "batch_grasp_correct",
    "corners_to_params",
    "decode_grasps",
    "draw_grasps",
    "encode_grasp_maps",
    "flip_averaged",
    "grasp_axes",
    "grasp_correct",
    "grasp_maps",
    "grasp_matches",
    "params_to_corners",
    "polygon_area",
    "polygon_intersection",
    "polygon_iou",
    "predict_grasps",
    "rotate_points",
    "wrap_angle",
]

"""Grasp rectangles, dense-map encoding and decoding, the rectangle metric, and inference."""

from vision_tfm.grasp.maps import (
    MAP_ACTIVATIONS,
    MAP_KEYS,
    WIDTH_SCALE,
    activate_grasp_maps,
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
from vision_tfm.grasp.predict import GraspMaps, draw_grasps, grasp_maps, predict_grasps
from vision_tfm.grasp.rect import Grasp, polygon_iou

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
    "batch_grasp_correct",
    "decode_grasps",
    "draw_grasps",
    "encode_grasp_maps",
    "grasp_correct",
    "grasp_maps",
    "grasp_matches",
    "polygon_iou",
    "predict_grasps",
]

"""The grasp detection task: configs, training and evaluation, export spec, inference."""

from .config import GraspDataConfig, GraspEvalConfig, GraspLossConfig
from .inference import (
    GraspMaps,
    display_image,
    draw_grasps,
    draw_overlay,
    flip_averaged,
    grasp_maps,
)
from .predict import predict_grasps, predict_metric_grasps
from .spec import GRASP_CONTRACT, grasp_postprocess, grasp_preprocess
from .task import GraspConfig, GraspTask, build_grasp_model, grasp_split

__all__ = [
    "GRASP_CONTRACT",
    "GraspConfig",
    "GraspDataConfig",
    "GraspEvalConfig",
    "GraspLossConfig",
    "GraspMaps",
    "GraspTask",
    "build_grasp_model",
    "display_image",
    "draw_grasps",
    "draw_overlay",
    "flip_averaged",
    "grasp_maps",
    "grasp_postprocess",
    "grasp_preprocess",
    "grasp_split",
    "predict_grasps",
    "predict_metric_grasps",
]

"""Cornell and Jacquard grasp data: annotations and splits, images and augmentation, the Dataset.

- :mod:`.annotations`: annotation parsers and view discovery;
- :mod:`.splits`: train/val splits and k folds, image- or object-wise;
- :mod:`.images`: decoding, depth hole filling and normalisation, crops, augmentation;
- :mod:`.dataset`: :class:`GraspDataset` (views -> input, maps, rects) and its builder;
- :mod:`.synthetic`: generated RGB-D tabletop views in Cornell's conventions (no download;
  ``python -m vision_tfm.data.grasp.synthetic OUT`` writes them as Cornell files).
"""

from .annotations import (
    MAX_COORD,
    GraspDataError,
    GraspView,
    corners_to_jacquard,
    find_cornell_views,
    find_jacquard_views,
    jacquard_to_corners,
    read_cornell_rects,
    read_jacquard_grasps,
)
from .dataset import (
    CROP_MODES,
    IN_CHANS,
    CornellGrasp,
    GraspDataset,
    JacquardGrasp,
    build_grasp_datasets,
    grasp_collate,
    grasp_datasets_from_config,
)
from .images import (
    DEPTH_CLIP,
    DEPTH_SCALE,
    NORMALISE_MODES,
    RGB_MEAN,
    RGB_STD,
    GraspAugment,
    crop_box,
    crop_resize,
    crop_to_output,
    fill_depth_holes,
    load_depth,
    load_rgb,
    normalise_depth,
    output_to_crop,
    resize_area,
    standardise,
    to_input,
)
from .splits import Split, fewer_train_views, kfold_splits, split_ids

__all__ = [
    "CROP_MODES",
    "DEPTH_CLIP",
    "DEPTH_SCALE",
    "IN_CHANS",
    "MAX_COORD",
    "NORMALISE_MODES",
    "RGB_MEAN",
    "RGB_STD",
    "CornellGrasp",
    "GraspAugment",
    "GraspDataError",
    "GraspDataset",
    "GraspView",
    "JacquardGrasp",
    "Split",
    "build_grasp_datasets",
    "corners_to_jacquard",
    "crop_box",
    "crop_resize",
    "crop_to_output",
    "fewer_train_views",
    "fill_depth_holes",
    "find_cornell_views",
    "find_jacquard_views",
    "grasp_collate",
    "grasp_datasets_from_config",
    "jacquard_to_corners",
    "kfold_splits",
    "load_depth",
    "load_rgb",
    "normalise_depth",
    "output_to_crop",
    "read_cornell_rects",
    "read_jacquard_grasps",
    "resize_area",
    "split_ids",
    "standardise",
    "to_input",
]

"""Procedural RGB-D tabletop grasp scenes in the Cornell conventions: data with no download.

A pinhole camera looks down at a table at an oblique angle, as Cornell's Kinect does; 1-3
objects stand on it, drawn from a few families (boxes, upright and lying cylinders, L and T
shapes, tools with a handle, mugs, thin sticks), each a union of convex prisms extruded from
the table plane. Everything is seeded: view ``i`` of seed ``s`` is the same bytes on every
machine, whichever views are drawn before it.

Why these choices:

- **Geometry first, pixels second.** Objects live in metres on the table plane; the camera
  projects them. Grasps are found on that geometry (antipodal contacts whose normals lie in
  the friction cone, an opening the gripper has, jaws that hit nothing), then projected, so
  every label is right by construction rather than drawn by hand.
- **The sensor's faults, not a clean z-buffer.** Depth noise grows with the square of the
  distance, values are quantised (disparity steps), and pixels go missing at depth edges and
  on dark surfaces; missing pixels are NaN, which the loaders' hole filling already handles.
- **Cheap enough to regenerate.** Parts are rasterised in their bounding boxes with OpenCV's
  polygon fill and a z-buffer, and colour stays planar so per-pixel factors run over whole
  rows; a dataset is generated on the fly (and cached in memory with ``data.cache``) rather
  than shipped (time per view: docs/results/grasp_synthetic.md).

``python -m vision_tfm.data.grasp.synthetic OUT --views 4`` writes Cornell-style files
(``pcdXXXXr.png``, ``d.tiff``, ``cpos.txt``, ``cneg.txt``) for ``vtfm grasp`` and the loaders.

The pieces, from small to large: :mod:`.scene` (settings, camera, objects and the antipodal
grasps on their geometry), :mod:`.render` (one view's pixels, depth and labels) and
:mod:`.dataset` (Cornell files, ``synthetic:N`` roots and the Dataset).
"""

from .dataset import (
    DEFAULT_VIEWS,
    SYNTHETIC,
    SyntheticGrasp,
    datasets_from_config,
    is_synthetic_root,
    parse_root,
    save_cornell,
    synthetic_datasets,
)
from .render import generate_labelled, generate_view
from .scene import FAMILIES, Camera, SceneSettings, SyntheticView

__all__ = [
    "DEFAULT_VIEWS",
    "FAMILIES",
    "SYNTHETIC",
    "Camera",
    "SceneSettings",
    "SyntheticGrasp",
    "SyntheticView",
    "datasets_from_config",
    "generate_labelled",
    "generate_view",
    "is_synthetic_root",
    "parse_root",
    "save_cornell",
    "synthetic_datasets",
]

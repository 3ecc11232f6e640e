"""Procedural RGB-D tabletop grasp scenes in the Cornell conventions: data with no download.

A pinhole camera looks down at a table from 30 to 90 degrees, 0.55-1.3 m away; 1-3 objects
stand on it among flat distractor sheets. Objects come from a few Cornell-like families
(boxes, upright and lying cylinders, L and T shapes, tools, mugs, sticks) and from parametric
spaces sized 2-30 cm: superellipse prisms (box to ellipse to diamond), random star-shaped
outlines, rings, bodies with bars or loops for handles, and thin flat objects. Each is a union
of convex prisms extruded from the table plane. Tables, objects and sheets take plain colours
or procedural textures (stripes, checks, blotches, grain) under a random exposure, white
balance and slow light variation. Everything is seeded: view ``i`` of seed ``s`` is the same
bytes on every machine, whichever views are drawn before it.

Why these choices:

- **Geometry first, pixels second.** Objects live in metres on the table plane; the camera
  projects them. Grasps are found on that geometry (antipodal contacts whose normals lie in
  the friction cone, an opening the gripper has, jaws that hit nothing), then projected, so
  every label is right by construction rather than drawn by hand.
- **The sensor's faults, not a clean z-buffer.** Depth noise grows with the square of the
  distance, values are quantised (disparity steps), and pixels go missing at depth edges, on
  dark surfaces and in blobs the sensor cannot see; missing pixels are NaN, which the
  loaders' hole filling already handles.
- **Shapes that are not convex, solved as one solid.** A closing line is cut with every
  piece of its object and the pieces that touch along it are joined, so contacts are where
  the line leaves the whole object: across a ring's wall, between a star's lobes, around a
  handle.
- **Cheap enough to regenerate.** Parts are rasterised in their bounding boxes with OpenCV's
  polygon fill and a z-buffer, and colour stays planar so per-pixel factors run over whole
  rows. A dataset renders only the centre crop it serves (``generate_view(..., window=)``)
  and is generated on the fly, in loader workers or cached in memory with ``data.cache``,
  rather than shipped (time per view: docs/results/grasp_synthetic.md).

``python -m vision_tfm.data.grasp.synthetic OUT --views 4`` writes Cornell-style files
(``pcdXXXXr.png``, ``d.tiff``, ``cpos.txt``, ``cneg.txt``) for ``vtfm grasp`` and the loaders.

The pieces, from small to large: :mod:`.shapes` (the objects), :mod:`.scene` (settings,
camera and the antipodal grasps on the objects' geometry), :mod:`.render` (one view's pixels,
depth and labels) and :mod:`.dataset` (Cornell files, ``synthetic:N`` roots and the Dataset).
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
from .scene import Camera, SceneSettings, SyntheticView
from .shapes import CORNELL_FAMILIES, FAMILIES, PARAMETRIC_FAMILIES

__all__ = [
    "CORNELL_FAMILIES",
    "DEFAULT_VIEWS",
    "FAMILIES",
    "PARAMETRIC_FAMILIES",
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

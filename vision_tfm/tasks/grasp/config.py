"""The grasp task's own config sections: data, loss, evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...config import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    Checked,
    ConfigError,
    Range,
)
from ...data.grasp import CROP_MODES, IN_CHANS, NORMALISE_MODES
from ...data.grasp.synthetic import SceneSettings
from ...grasp import WIDTH_SCALE

MAP_LOSSES = ("smooth_l1", "mse")
QUALITY_LOSSES = ("bce", "regress")
GEOMETRY = ("all", "graspable")
WIDTH_SPACES = ("linear", "log")


@dataclass
class GraspDataConfig(Checked):
    """Grasp data, input channels, split and augmentation.

    Attributes:
        dataset: "cornell", "jacquard" or "synthetic" (generated scenes,
            :mod:`vision_tfm.data.grasp.synthetic`; then ``root`` is ``synthetic:N``).
        root: Dataset folder, or ``synthetic:N`` for N generated views.
        synthetic: Generator settings (:class:`~vision_tfm.data.grasp.SceneSettings` fields,
            e.g. ``{seed: 1, objects: [1, 2]}``) for ``dataset: synthetic``.
        score_all: Validate on every view of ``root``, no split: scoring a folder the model
            did not train on (``train_grasp.py --eval-only`` sets it for such a folder).
        input: "rgb", "depth" or "rgbd" (depth last); sets the model's in_chans.
        split: "image" (shuffled) or "object" (consecutive ids), written into every figure.
        train_frac: Share of views used for training (when ``folds`` is 0).
        folds: k of k-fold cross-validation (``train_grasp.py --folds``); 0: one split.
        fold: The fold that validates (0-based), when ``folds`` > 0.
        train_views: Train on this many of the split's training views, a seeded subset that
            grows by adding views (a learning curve: how the figure scales with views); 0: all.
        output_size: Side of the square model input and maps.
        crop_size: Square crop before resizing (0: shorter image side).
        train_crop: Where training views are cropped: "centre" (the image centre, as
            validation and deployment) or "grasps" (centred on the labels, GG-CNN).
        normalise: Input normalisation: "fixed" (ImageNet RGB, depth in metres minus the
            crop's mean) or "image" (RGB and depth each standardised per view).
        batch_size: Views per step.
        num_workers: DataLoader workers.
        augment: Grasp-aware augmentation for training.
        rotate: Rotation range in degrees (symmetric).
        zoom: Zoom range about the objects.
        translate: Largest random shift, as a fraction of the crop, per axis.
        color_jitter: RGB jitter strength (0 = off).
        depth_noise: Depth noise std in metres.
        width_scale: The one width normaliser, used for encoding and decoding.
        repeat: Passes over the training views per epoch, each freshly augmented, so that a
            small dataset makes enough steps to be worth an evaluation each.
        cache: Keep decoded view crops in memory (small datasets); augmentation still runs
            fresh on every item.
    """

    dataset: str = "cornell"
    root: str = ""
    input: str = "rgbd"
    split: str = "image"
    train_frac: float = 0.8
    folds: int = 0
    fold: int = 0
    train_views: int = 0
    output_size: int = 224
    crop_size: int = 300
    train_crop: str = "centre"
    normalise: str = "fixed"
    batch_size: int = 8
    num_workers: int = 0
    augment: bool = True
    rotate: float = 180.0
    zoom: tuple[float, float] = (1.0, 1.25)
    translate: float = 0.1
    color_jitter: float = 0.2
    depth_noise: float = 0.005
    width_scale: float = WIDTH_SCALE
    repeat: int = 1
    cache: bool = False
    synthetic: dict[str, Any] = field(default_factory=dict)
    score_all: bool = False

    SECTION: ClassVar[str] = "data"
    RANGES: ClassVar[dict[str, Range]] = {
        "train_frac": Range(0, 1, lo_open=True, hi_open=True),
        "output_size": AT_LEAST_ONE,
        "crop_size": NON_NEGATIVE,
        "batch_size": AT_LEAST_ONE,
        "num_workers": NON_NEGATIVE,
        "rotate": Range(0, 180),
        "zoom": POSITIVE,
        "color_jitter": PROBABILITY,
        "depth_noise": NON_NEGATIVE,
        "width_scale": POSITIVE,
        "repeat": AT_LEAST_ONE,
        "translate": PROBABILITY,
        "folds": NON_NEGATIVE,
        "fold": NON_NEGATIVE,
        "train_views": NON_NEGATIVE,
    }
    ORDERED: ClassVar[tuple[str, ...]] = ("zoom",)
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dataset": ("cornell", "jacquard", "synthetic"),
        "input": tuple(IN_CHANS),
        "split": ("image", "object"),
        "train_crop": CROP_MODES,
        "normalise": NORMALISE_MODES,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.folds and not self.fold < self.folds:
            raise ConfigError(f"data.fold must be in [0, {self.folds}), got {self.fold}")
        if self.synthetic:  # checked where it enters: a typo fails before any data is made
            SceneSettings.from_dict(self.synthetic)


@dataclass
class GraspLossConfig(Checked):
    """Loss on the four maps.

    Attributes:
        maps: "smooth_l1" or "mse" on cos, sin and width (and quality when ``quality`` is
            "regress"), over every pixel, as in GG-CNN / GR-ConvNet.
        quality: "bce" (binary cross-entropy on the quality logits) or "regress" (the
            ``maps`` loss on the probability). Graspable pixels are a few percent of a view;
            regressing them under a sigmoid gives small gradients and flat peaks, BCE does not.
        geometry: Where cos, sin and width are fitted: "all" pixels (background target 0,
            as in GG-CNN) or only "graspable" ones, the only pixels decoding ever reads.
        width_weight: Weight of the width term. Width targets span ~0.1-0.4 under a sigmoid,
            so their unweighted gradients are an order of magnitude below the angle's.
        width_space: Where the width error is taken: "linear" (``opening / width_scale``, as
            GG-CNN) or "log" (``log`` of it). The rectangle IoU judges an opening by its
            ratio to the true one; the log space charges a 2x error alike on a narrow grasp
            and a wide one, the linear space charges the narrow one far less. The recipes
            keep "linear": "log" did not score better on the nested folds
            (docs/results/grasp.md).
            Needs ``geometry: graspable`` (the background has no opening to take a log of).
    """

    maps: str = "smooth_l1"
    quality: str = "bce"
    geometry: str = "graspable"
    width_weight: float = 10.0
    width_space: str = "linear"

    SECTION: ClassVar[str] = "loss"
    RANGES: ClassVar[dict[str, Range]] = {"width_weight": NON_NEGATIVE}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "maps": MAP_LOSSES,
        "quality": QUALITY_LOSSES,
        "geometry": GEOMETRY,
        "width_space": WIDTH_SPACES,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.width_space == "log" and self.geometry != "graspable":
            raise ConfigError(
                "loss.width_space=log needs loss.geometry=graspable "
                f"(got {self.geometry!r}: background pixels have width 0, whose log is -inf)"
            )


@dataclass
class GraspEvalConfig(Checked):
    """Decoding and scoring.

    Attributes:
        top_n: Also report top-n accuracy when > 1.
        min_distance: Minimum distance between decoded peaks, in map pixels.
        threshold: Minimum smoothed quality of a decoded grasp. 0 keeps the best peak of
            every view, which is what a top-1 score asks for.
        quality_sigma: Gaussian post-filter of the quality map before peak picking
            (GG-CNN2 / GR-ConvNet; 0: off).
        angle_sigma: The same for the cos and sin maps.
        width_sigma: The same for the width map.
        flip_tta: Average the maps of the view and its horizontal and vertical flips.
    """

    top_n: int = 1
    min_distance: int = 10
    threshold: float = 0.0
    quality_sigma: float = 2.0
    angle_sigma: float = 2.0
    width_sigma: float = 1.0
    flip_tta: bool = False

    def decode_kwargs(self, width_scale: float) -> dict[str, Any]:
        """Keyword arguments of :func:`~vision_tfm.grasp.decode_grasps` for this config."""
        names = ("min_distance", "threshold", "quality_sigma", "angle_sigma", "width_sigma")
        return {"width_scale": width_scale, **{k: getattr(self, k) for k in names}}

    SECTION: ClassVar[str] = "eval"
    RANGES: ClassVar[dict[str, Range]] = {
        "top_n": AT_LEAST_ONE,
        "min_distance": NON_NEGATIVE,
        "threshold": PROBABILITY,
        "quality_sigma": NON_NEGATIVE,
        "angle_sigma": NON_NEGATIVE,
        "width_sigma": NON_NEGATIVE,
    }

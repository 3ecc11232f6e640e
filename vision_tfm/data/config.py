"""Data and augmentation configs, and the per-dataset defaults they resolve to.

Both configs are plain dataclasses so the YAML loader can check keys and types against the
fields. Zero or empty values mean "use the dataset's default"; `resolve_in_chans` and
`resolve_mean_std` turn them into concrete numbers in one place, shared by training and
`vtfm predict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, PROBABILITY, Checked, Range
from ..constants import IMAGENET_MEAN, IMAGENET_STD, MNIST_MEAN, MNIST_STD
from ..errors import ConfigError

DATASET_NAMES = ("mnist", "imagefolder", "cifar10")
AUG_KINDS = ("affine", "rrc", "none")

# ITU-R 601 luma weights: the same ones PIL uses for convert("L"), so array and file inputs agree.
LUMA_WEIGHTS = (0.299, 0.587, 0.114)

# Channels each source stores natively; ImageFolder files are decoded to RGB unless forced to 1.
_NATIVE_CHANS = {"mnist": 1, "cifar10": 3, "imagefolder": 3}


@dataclass
class AugConfig(Checked):
    """Training augmentation; evaluation never augments.

    Attributes:
        kind: Geometric augmentation: "affine" (resize, then random shift/scale/rotate; suits
            centred digits), "rrc" (RandomResizedCrop; suits natural images) or "none".
        scale: Affine zoom range (1.0 = unchanged).
        translate: Affine shift, as a fraction of the image side, in both directions.
        rotate: Affine rotation range in degrees, in both directions.
        crop_scale: RandomResizedCrop area fraction range.
        crop_ratio: RandomResizedCrop aspect-ratio range.
        hflip: Horizontal flip probability; keep 0 for digits and text, whose meaning flips.
        color_jitter: Brightness/contrast/saturation strength; ignored for 1-channel data.
        random_erasing: Probability of erasing one random rectangle (filled with the mean).
        rand_augment: timm RandAugment spec such as "rand-m9-mstd0.5-inc1"; empty = off.
        mixup: Mixup alpha for timm's `Mixup` in the training engine; 0 = off.
        cutmix: CutMix alpha for timm's `Mixup`; 0 = off.
        mixup_prob: Probability of applying mixup or cutmix to a batch.
        mixup_switch_prob: Probability of cutmix instead of mixup when both are on.
        label_smoothing: Label smoothing for the loss (also passed to `Mixup`).
    """

    kind: str = "affine"
    scale: tuple[float, float] = (0.9, 1.1)
    translate: float = 0.1
    rotate: float = 10.0
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (0.75, 1.3333333333333333)
    hflip: float = 0.0
    color_jitter: float = 0.0
    random_erasing: float = 0.0
    rand_augment: str = ""
    mixup: float = 0.0
    cutmix: float = 0.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    label_smoothing: float = 0.0

    SECTION: ClassVar[str] = "aug"
    RANGES: ClassVar[dict[str, Range]] = {
        "scale": POSITIVE,
        "translate": PROBABILITY,
        "rotate": Range(0, 180),
        "crop_scale": Range(0, 1, lo_open=True),
        "crop_ratio": POSITIVE,
        "hflip": PROBABILITY,
        "color_jitter": PROBABILITY,
        "random_erasing": PROBABILITY,
        "mixup": NON_NEGATIVE,
        "cutmix": NON_NEGATIVE,
        "mixup_prob": PROBABILITY,
        "mixup_switch_prob": PROBABILITY,
        "label_smoothing": Range(0, 1, hi_open=True),
    }
    ORDERED: ClassVar[tuple[str, ...]] = ("scale", "crop_scale", "crop_ratio")
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"kind": AUG_KINDS}


@dataclass
class DataConfig(Checked):
    """Which data to read and how to shape it for the model.

    Attributes:
        name: "mnist" (embedded in the package, no download), "imagefolder" or "cifar10".
        root: Dataset folder; required for "imagefolder" and "cifar10", ignored for "mnist".
        img_size: Side of the square model input.
        in_chans: 0 follows the data (MNIST 1, CIFAR-10 3, ImageFolder RGB = 3); 1 or 3
            converts (gray to RGB by repetition, RGB to gray by ITU-R 601 luma).
        batch_size: Batch size for the data loaders.
        num_workers: Data loader worker processes.
        mean: Per-channel normalisation mean; empty = dataset default.
        std: Per-channel normalisation std; empty = dataset default.
        crop_pct: Evaluation resizes the short side to img_size / crop_pct, then centre-crops.
        train_subset: Keep only this many (seeded random) training samples; 0 = all.
        holdout: Validate on this many (seeded random) training samples, held out of
            training, instead of the val split: a recipe is chosen on them, so the val
            figure it reports was never looked at while choosing. 0 = off.
        val_split: The share of each class a flat ``root/<class>/`` folder holds out for
            validation (seeded; the run dir's ``split.csv`` lists both sides). A folder with
            its own train/ and val/ keeps them and ignores this.
    """

    name: str = "mnist"
    root: str = ""
    img_size: int = 28
    in_chans: int = 0
    batch_size: int = 128
    num_workers: int = 0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    crop_pct: float = 1.0
    train_subset: int = 0
    holdout: int = 0
    val_split: float = 0.0

    SECTION: ClassVar[str] = "data"
    RANGES: ClassVar[dict[str, Range]] = {
        "img_size": AT_LEAST_ONE,
        "batch_size": AT_LEAST_ONE,
        "num_workers": NON_NEGATIVE,
        "mean": Range(),
        "std": POSITIVE,
        "crop_pct": Range(0, 1, lo_open=True),
        "train_subset": NON_NEGATIVE,
        "holdout": NON_NEGATIVE,
        "val_split": Range(0, 1, hi_open=True),
    }
    CHOICES: ClassVar[dict[str, tuple]] = {"name": DATASET_NAMES, "in_chans": (0, 1, 3)}


def resolve_in_chans(cfg: DataConfig) -> int:
    """Channels the model sees: forced by `cfg.in_chans`, else the dataset's native count."""
    return cfg.in_chans or _NATIVE_CHANS[cfg.name]


def resolve_mean_std(cfg: DataConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Normalisation statistics, one value per model input channel.

    Defaults: MNIST uses its own statistics (repeated if forced to 3 channels); everything else
    uses ImageNet's, so pretrained timm weights see familiar inputs. For 1-channel non-MNIST
    data the ImageNet values are luma-weighted, matching the RGB-to-gray conversion. A single
    configured value is repeated for 3-channel input.
    """
    in_chans = resolve_in_chans(cfg)
    if cfg.mean:
        mean, std = tuple(cfg.mean), tuple(cfg.std)
        if len(mean) != len(std):
            raise ConfigError(f"data.mean has {len(mean)} values but data.std has {len(std)}")
        if len(mean) == 1 and in_chans == 3:
            mean, std = mean * 3, std * 3
        if len(mean) != in_chans:
            raise ConfigError(
                f"data.mean has {len(mean)} values; the model has {in_chans} channels"
            )
        return mean, std
    if cfg.name == "mnist":
        return MNIST_MEAN * in_chans, MNIST_STD * in_chans
    if in_chans == 1:
        return (_luma(IMAGENET_MEAN),), (_luma(IMAGENET_STD),)
    return IMAGENET_MEAN, IMAGENET_STD


def _luma(rgb: tuple[float, ...]) -> float:
    return round(sum(w * v for w, v in zip(LUMA_WEIGHTS, rgb)), 4)

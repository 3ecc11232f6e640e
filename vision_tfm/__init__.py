"""vision_tfm: ViT, Swin and a CNN+Transformer grasp hybrid on one shared Transformer core."""

from . import detection
from .detection import create_backbone
from .models import create_model, list_models, load_pretrained
from .optimize import optimize_for_inference
from .version import __version__

__all__ = [
    "__version__",
    "create_backbone",
    "create_model",
    "detection",
    "list_models",
    "load_pretrained",
    "optimize_for_inference",
]

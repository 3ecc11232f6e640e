"""Model families; importing this registers every name."""

from . import hybrid, swin, vit  # noqa: F401  (registration side effects)
from ._common import check_input_memory
from .convert import load_pretrained
from .registry import create_model, get_model_entry, list_models, register_model
from .timm_plugin import register_all

register_all()  # every name above, in timm's registry too (``timm_plugin``)

__all__ = [
    "check_input_memory",
    "create_model",
    "get_model_entry",
    "list_models",
    "load_pretrained",
    "register_model",
]

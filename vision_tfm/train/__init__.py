"""The training engine (one loop for every task) and the classification task."""

from .checkpoint import atomic_save, load_checkpoint
from .classification import ClassificationTask, ClsConfig, build_cls_model
from .config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig, load_config
from .engine import NonFiniteLossError, Task, Trainer, make_run_dir

__all__ = [
    "ClassificationTask",
    "ClsConfig",
    "EmaConfig",
    "ModelConfig",
    "NonFiniteLossError",
    "OptimConfig",
    "RunConfig",
    "SchedConfig",
    "Task",
    "Trainer",
    "atomic_save",
    "build_cls_model",
    "load_checkpoint",
    "load_config",
    "make_run_dir",
]

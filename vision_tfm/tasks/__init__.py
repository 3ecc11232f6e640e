"""Tasks: what differs between classification and grasp detection, behind one interface.

The engine trains a :class:`Task`, export and the CLI restore and score through one, and
nothing above this floor tests a task's name. ``TASKS`` maps a checkpoint's ``meta["task"]``
to its class.
"""

from .base import TASKS, Runner, Task, get_task, register_task, task_for_model, task_of
from .classification import ClassificationTask, ClsConfig, build_cls_model, eval_data_config
from .config import (
    EmaConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SchedConfig,
    config_hash,
    load_config,
    save_config,
)
from .grasp import GraspConfig, GraspTask, build_grasp_model

__all__ = [
    "TASKS",
    "ClassificationTask",
    "ClsConfig",
    "EmaConfig",
    "GraspConfig",
    "GraspTask",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "Runner",
    "SchedConfig",
    "Task",
    "build_cls_model",
    "build_grasp_model",
    "config_hash",
    "eval_data_config",
    "get_task",
    "load_config",
    "register_task",
    "save_config",
    "task_for_model",
    "task_of",
]

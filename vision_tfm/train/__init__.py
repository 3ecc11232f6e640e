"""The training loop, shared by every task, and what surrounds it: run dirs, exact resume,
Ctrl-C, cross-validation and the scripts' command line."""

from .cv import cross_validate
from .engine import Trainer
from .optim import build_optimizer, build_scheduler
from .rundir import make_run_dir
from .stops import Interrupted, NonFiniteLossError

__all__ = [
    "Interrupted",
    "NonFiniteLossError",
    "Trainer",
    "build_optimizer",
    "build_scheduler",
    "cross_validate",
    "make_run_dir",
]

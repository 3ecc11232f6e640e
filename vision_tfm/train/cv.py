"""k-fold cross-validation: one full engine run per fold, then every fold and mean ± std."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from ..config import config_to_dict
from ..errors import ConfigError
from ..io import atomic_write_text
from ..tasks import Task
from .engine import Trainer
from .rundir import make_run_dir


def cross_validate(cfg: Any, task_cls: type[Task], folds: int) -> dict[str, Any]:
    """Train one model per fold and report each fold's headline metrics and their mean and
    (population) std.

    Each fold runs in ``<cv dir>/fold<k>``; ``cv.json`` in the cv dir holds the figures. The
    last lines printed are the headlines, in the single-run format with ``mean ± std``.

    Returns:
        The ``cv.json`` content.
    """
    if folds < 2:
        raise ConfigError(f"--folds must be >= 2, got {folds}")
    cv_dir = make_run_dir(cfg.run.out_dir, f"{cfg.model.name}-cv{folds}")
    rows: list[dict[str, Any]] = []
    for k in range(folds):
        fold_cfg = task_cls.fold_config(cfg, folds, k)
        task = task_cls(fold_cfg)
        t0 = time.perf_counter()
        trainer = Trainer(fold_cfg, task, run_dir=cv_dir / f"fold{k + 1}")
        metrics = trainer.shipped_metrics(trainer.fit())
        rows.append(
            {
                "fold": k + 1,
                **task.fold_record(trainer.val_ds),
                "train_time_s": round(time.perf_counter() - t0, 1),
                **{m: metrics[m] for m in task.headlines},
            }
        )
    task = task_cls(cfg)
    result: dict[str, Any] = {
        "model": cfg.model.name,
        "split": task.split_label(),
        "folds": rows,
        "config": config_to_dict(cfg),
    }
    for m in task.headlines:
        values = np.array([r[m] for r in rows])
        result[m] = {"mean": float(values.mean()), "std": float(values.std())}
    atomic_write_text(json.dumps(result, indent=2), cv_dir / "cv.json")
    for r in rows:
        print(task.fold_line(r, folds))
    print(f"cv dir {cv_dir}")
    print(task.cv_summary(result, folds))
    return result

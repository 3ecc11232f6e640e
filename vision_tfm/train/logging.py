"""Run outputs: CSV + TensorBoard scalars, and the end-of-run PNG plots."""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


class MetricLogger:
    """Append one row per epoch to ``metrics.csv``; mirror scalars to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.csv_path = run_dir / "metrics.csv"
        self.steps_path = run_dir / "steps.csv"
        self.tb = None
        if tensorboard:  # a dependency, but keep training if its import breaks
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(run_dir / "tb"))

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None:
            self.tb.add_scalar(tag, value, step)

    def step(self, step: int, loss: float, lr: float) -> None:
        """Per-step training loss (every ``log_interval`` steps) for loss-curve plots."""
        self.scalar("train/loss", loss, step)
        self.scalar("train/lr", lr, step)
        self._append(self.steps_path, {"step": step, "loss": loss, "lr": lr})

    def epoch(self, row: dict[str, Any]) -> None:
        """Write an epoch row; the header follows the first row's keys."""
        self._append(self.csv_path, row)
        for k, v in row.items():
            if k != "epoch" and isinstance(v, (int, float)):
                self.scalar(f"epoch/{k}", v, int(row["epoch"]))

    def drop_rows_after(self, step: int, epoch: int) -> None:
        """Forget rows past a checkpoint's update and epoch, which a run killed after writing
        them left behind; the resumed run writes them again."""
        for path, key, last in ((self.steps_path, "step", step), (self.csv_path, "epoch", epoch)):
            if not path.is_file():
                continue
            lines = path.read_text().splitlines(keepends=True)
            rows = list(csv.reader(lines))
            if not rows or key not in rows[0]:
                continue
            col = rows[0].index(key)
            keep = [line for line, row in zip(lines[1:], rows[1:]) if float(row[col]) <= last]
            if len(keep) < len(lines) - 1:
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text("".join([lines[0], *keep]))
                os.replace(tmp, path)

    @staticmethod
    def _append(path: Path, row: dict[str, Any]) -> None:
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row), extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow(row)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(history: Sequence[dict[str, Any]], path: Path, metric_keys: Sequence[str]) -> None:
    """Loss (left) and validation metrics (right) per epoch."""
    plt = _pyplot()
    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(epochs, [h["train_loss"] for h in history], marker="o")
    a.set(xlabel="epoch", ylabel="train loss", title="loss")
    for k in metric_keys:
        if all(k in h for h in history):
            b.plot(epochs, [h[k] for h in history], marker="o", label=k)
    b.set(xlabel="epoch", ylabel="metric", title="validation")
    b.legend()
    b.grid(alpha=0.3)
    a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_confusion(cm: np.ndarray, class_names: Sequence[str], path: Path) -> None:
    """Row-normalised confusion matrix (rows: true class) with counts in the cells."""
    plt = _pyplot()
    n = len(class_names)
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    size = max(4.0, min(0.5 * n + 2, 20.0))
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        ax.set_xticks(range(n), class_names, rotation=90)
        ax.set_yticks(range(n), class_names)
        for i in range(n):
            for j in range(n):
                if cm[i, j]:
                    color = "white" if norm[i, j] > 0.5 else "black"
                    ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=7, color=color)
    ax.set(
        xlabel="predicted", ylabel="true", title=f"confusion (acc {np.trace(cm) / cm.sum():.4f})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

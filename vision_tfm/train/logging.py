"""Run outputs: CSV + TensorBoard scalars, and the end-of-run PNG plots."""

from __future__ import annotations

import contextlib
import csv
import os
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm


class MetricLogger:
    """Append one row per epoch to ``metrics.csv``; mirror scalars to TensorBoard."""

    def __init__(
        self, run_dir: Path, tensorboard: bool = True, inherited: list[dict] | None = None
    ) -> None:
        """``inherited``: epoch rows written first (a run forked from another's checkpoint)."""
        self.csv_path = run_dir / "metrics.csv"
        self.steps_path = run_dir / "steps.csv"
        self.tb = None
        if tensorboard:  # a dependency, but keep training if its import breaks
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(run_dir / "tb"))
        for row in inherited or ():
            self.epoch(row)

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


class Progress:
    """One epoch's progress bar (rank 0, and only on a terminal) and its per-step log rows."""

    def __init__(
        self, logger: MetricLogger | None, epoch: int, total: int, done: int, seen: int
    ) -> None:
        self.logger, self.t0, self.seen0 = logger, time.perf_counter(), seen
        self.bar = tqdm(
            initial=done,
            total=total,
            desc=f"epoch {epoch}",
            leave=False,
            dynamic_ncols=True,
            disable=None if logger is not None else True,
        )

    def update(self, step: int, loss: float, lr: float, seen: int, logged: bool) -> None:
        """One micro-batch done; ``logged``: also show and write its loss (rank 0)."""
        if logged and self.logger is not None:
            ips = (seen - self.seen0) / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}")
            self.logger.step(step, loss, lr)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

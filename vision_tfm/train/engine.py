"""The one training loop, shared by every task.

A :class:`~vision_tfm.tasks.Task` says what differs; :class:`Trainer` runs it: precision,
accumulation, clipping, EMA, checkpoints, the NaN guard, DDP and logging. Beside it: the data
order that makes resume exact (:mod:`.sampling`), run dirs (:mod:`.rundir`), resume checks
(:mod:`.resume`), stop signals (:mod:`.stops`: on Ctrl-C, SIGTERM or SIGUSR1 the update in
flight finishes, ``last.pt`` is written with the position, then :class:`Interrupted` is raised,
on every DDP rank at the same update).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from ..accel import prepare_for_training, warn_if_bf16_emulated
from ..data.loaders import close_loader
from ..distributed import (
    all_reduce_sum,
    any_rank,
    broadcast_object,
    cleanup,
    init_distributed,
    is_main,
    world_size,
)
from ..errors import ConfigError
from ..io import atomic_write_text, check_writable_dir, load_checkpoint
from ..tasks import Task
from ..tasks.config import run_hash, save_config
from .checkpoint import Checkpoints
from .device import autocast, resolve_device, resolve_precision
from .logging import MetricLogger, Progress
from .optim import build_training, group_ids, unfreeze
from .resume import LoopState, check_compatible, check_position, check_weights
from .rundir import RunDirs, file_id, newest_unfinished
from .sampling import (
    EpochBatches,
    SeededItems,
    check_batches,
    derive_seed,
    full_batches,
    make_loader,
    seed_everything,
    val_batches,
)
from .stops import STOP_SIGNALS, Interrupted, StopSignals, stop_notice


class Trainer(Checkpoints):
    """Runs a task under its config (``model``, ``optim``, ``sched``, ``ema``, ``run``)."""

    def __init__(
        self,
        cfg: Any,
        task: Task,
        resume: str | os.PathLike | None = None,
        run_dir: str | os.PathLike | None = None,
    ) -> None:
        self.cfg, self.task = cfg, task
        self.resume_path = Path(resume) if resume else None
        self._run_dir = Path(run_dir) if run_dir else None
        self._stop: signal.Signals | None = None  # the stop signal every rank agreed on
        self._dirs = RunDirs(self.say)
        self._signals = StopSignals()
        self._compile_t0: float | None = None

    # --- setup -------------------------------------------------------------------------

    def precision(self) -> str:
        """``run.precision`` as this run resolves it (see :func:`.device.resolve_precision`)."""
        return resolve_precision(self.cfg.run.precision, self.device)

    def _setup(self, eval_only: bool = False) -> None:
        cfg = self.cfg
        if is_main() and self.resume_path is None:  # a read-only out dir fails before any work
            check_writable_dir(self._run_dir or cfg.run.out_dir, "run.out_dir")
        if cfg.run.threads > (os.cpu_count() or 1):  # more would only oversubscribe the cores
            raise ConfigError(
                f"run.threads must be at most {os.cpu_count() or 1} (the CPU cores here), "
                f"got {cfg.run.threads}"
            )
        if cfg.run.threads > 0:
            torch.set_num_threads(cfg.run.threads)
        self.device = resolve_device(cfg.run.device)
        self.distributed = init_distributed(self.device)
        seed_everything(cfg.run.seed)
        if cfg.run.resume == "auto" and self.resume_path is None and self._run_dir is None:
            self.resume_path = broadcast_object(self._auto_resume() if is_main() else None)
        self.ckpt = None
        if self.resume_path is not None:  # identity first: a later replace shows as a change
            self._resume_id = file_id(self.resume_path) if self.resume_path.exists() else None
            self.ckpt = load_checkpoint(self.resume_path, resume=True)
            check_weights(self.ckpt, self.task, self.resume_path)
        # a resumed run restores its weights: the ones it started from are not read again
        model, self.train_ds, self.val_ds, self.meta = self.task.build(pretrained=self.ckpt is None)
        self.meta["weights"] = "ema" if cfg.ema.enabled else "model"  # what the run ships
        self.tracked = f"ema_{self.task.metric}" if cfg.ema.enabled else self.task.metric
        if self.ckpt is not None:
            check_compatible(self.ckpt, self.meta["model_name"], model, self.resume_path)
        self.model = prepare_for_training(model.to(self.device))  # accel's kernel choices
        self.ema, self.optimizer, self.scheduler, self.scaler, self.base_lr = build_training(
            self.model, cfg, self.task.batch_size * world_size(), self._num_batches(),
            self.precision() == "amp" and self.device.type == "cuda",
        )  # fmt: skip
        self.state, self.history = LoopState(), []
        self._groups = group_ids(self.model) if cfg.optim.unfreeze else {}
        if self.ckpt is not None:
            self._restore(self.ckpt, eval_only)
        self.train_model: nn.Module = self.model
        self.ddp: DistributedDataParallel | None = None
        if self.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            unused = cfg.optim.unfreeze > 0  # frozen groups send no gradient
            self.ddp = self.train_model = DistributedDataParallel(
                self.model, device_ids=ids, find_unused_parameters=unused
            )
        if cfg.run.compile:  # lazy: it compiles in the first step, which reports the time
            self._compile_t0 = time.perf_counter()
            self.train_model = torch.compile(self.train_model)

    def _auto_resume(self) -> Path | None:
        """``run.resume=auto``: the newest unfinished run of this config, if there is one."""
        cfg, want = self.cfg, run_hash(self.cfg)
        found = newest_unfinished(
            cfg.run.out_dir, lambda c: run_hash(c) == want, cfg.sched.epochs, say=self.say
        )
        if found is None:
            self.say(f"run.resume=auto: no unfinished run of this config in {cfg.run.out_dir}")
        return found

    def _num_batches(self) -> int:
        return full_batches(len(self.train_ds), self.task.batch_size, self.distributed)

    def _val_loader(self) -> DataLoader:
        batches = val_batches(len(self.val_ds), self.task.batch_size, self.distributed)
        return self._opened(make_loader(self.val_ds, batches, self.task))

    def _opened(self, loader: DataLoader) -> DataLoader:
        self._loaders = [*getattr(self, "_loaders", []), loader]  # closed when fit ends
        return loader

    # --- the loop ----------------------------------------------------------------------

    def fit(self, eval_only: bool = False) -> dict[str, float]:
        """Train (or just evaluate) and return the last validation metrics."""
        self._setup(eval_only)
        try:
            if eval_only:
                metrics = self._evaluate()
                self.say(self.task.summary(self.shipped_metrics(metrics)))
                return metrics
            return self._fit()
        finally:
            for loader in getattr(self, "_loaders", []):
                close_loader(loader)
            self.task.close()
            self._dirs.release()
            cleanup()

    def _fit(self) -> dict[str, float]:
        cfg, s = self.cfg, self.state
        check_batches(len(self.train_ds), self.task.batch_size, self.distributed)
        if self.ckpt is not None:
            check_position(self.resume_path, s, cfg.sched.epochs, world_size())
        s.world_size = world_size()
        forked, self.run_dir = False, Path(cfg.run.out_dir)
        if self.ckpt is not None:
            self.run_dir = self.resume_path.parent
        if is_main():  # a fork copies the resumed epoch as its best.pt if it was the best yet
            best = bool(self.history) and self.history[-1].get(self.tracked) == s.best
            best_ck = self.ckpt if best and not s.step_in_epoch else None
            self.run_dir, forked = self._dirs.choose(
                cfg.run.out_dir, self.task.run_name(self.meta), self._run_dir, self.resume_path,
                getattr(self, "_resume_id", None), self.ckpt, best_ck,
            )  # fmt: skip
            save_config(cfg, self.run_dir / "config.yaml")
            for name, text in self.task.run_files().items():
                atomic_write_text(text, self.run_dir / name)
            if self.ckpt is not None:
                self.say(f"resuming {self.run_dir} at epoch {s.epoch + 1}, update {s.num_updates}")
        logger = None
        if is_main():  # a fork's metrics.csv starts with the epochs it inherits
            inherited = self.history if forked else None
            logger = MetricLogger(self.run_dir, cfg.run.tensorboard, inherited)
            if self.ckpt is not None and not forked:  # rows a killed run wrote past it
                logger.drop_rows_after(step=s.num_updates, epoch=s.epoch)
        n_params = sum(p.numel() for p in self.model.parameters())
        self.say(
            f"run dir {self.run_dir} | {self.meta['model_name']} {n_params / 1e6:.2f}M params"
            f" | {data_counts(self.train_ds, self.val_ds)} | device {self.device}"
            f" x{world_size()} | lr {self.base_lr:.2e}"
        )
        if is_main() and self.precision() != "fp32" and self.device.type == "cpu":  # bf16
            warn_if_bf16_emulated("train with run.precision=fp32")
        metrics: dict[str, float] = {}
        self._batches = EpochBatches(
            self.train_ds, self.task.batch_size, cfg.run.seed, self.distributed
        )
        train_ds = SeededItems(self.train_ds, cfg.run.seed)
        train_loader = self._opened(make_loader(train_ds, self._batches, self.task, self.device))
        val_loader = self._val_loader()
        stop_at = s.epoch + cfg.run.stop_after if cfg.run.stop_after else cfg.sched.epochs
        try:
            with self._signals:
                while s.epoch < min(cfg.sched.epochs, stop_at):
                    metrics = self._epoch(train_loader, val_loader, logger)
        finally:
            if logger is not None:
                logger.close()
            if cfg.optim.unfreeze:  # everything trains again after the run, whatever the epoch
                self.model.requires_grad_(True)
        if s.epoch < cfg.sched.epochs:
            self.say(
                f"stopped after epoch {s.epoch} of {cfg.sched.epochs}; resume with "
                f"--resume {self.run_dir / 'last.pt'}"
            )
        elif is_main() and cfg.run.plots:
            self.task.finish(self.shipped_model, val_loader, self.run_dir, self.history)
        self.say(self.task.summary(self.shipped_metrics(metrics or self.history[-1])))
        return metrics

    def _epoch(
        self, train_loader: DataLoader, val_loader: DataLoader, logger: MetricLogger | None
    ) -> dict[str, float]:
        """One epoch from the current position, its evaluation and checkpoint."""
        s, epoch, t0 = self.state, self.state.epoch, time.perf_counter()
        if self.cfg.optim.unfreeze:  # a function of the epoch alone: resume finds it again
            unfreeze(self.model, self._groups, epoch, self.cfg.optim.unfreeze)
        loss_sum, loss_count = self._train_epoch(epoch, train_loader, logger)
        dt = s.time_s + time.perf_counter() - t0
        if self._stop is not None:
            s.loss_sum, s.loss_count, s.time_s = loss_sum, loss_count, dt
            self._save(best=False)
            last_pt = self.run_dir / "last.pt"
            self.say(f"checkpoint written: {last_pt} (resume with --resume {last_pt})")
            msg = f"stopped by {self._stop.name}; resume with --resume {last_pt}"
            raise Interrupted(msg, self._stop)
        train_loss, seen = loss_sum / max(loss_count, 1), s.seen
        metrics = self._evaluate(val_loader)
        s.epoch, s.step_in_epoch = epoch + 1, 0
        s.loss_sum, s.loss_count, s.seen, s.time_s = 0.0, 0, 0, 0.0
        improved = metrics[self.tracked] > s.best
        s.best = max(s.best, metrics[self.tracked])
        lr = self.optimizer.param_groups[0]["lr"]
        timing = {"epoch_time_s": round(dt, 2), "img_per_s": round(seen / dt, 1)}
        row = {"epoch": epoch + 1, "train_loss": train_loss, "lr": lr, **metrics, **timing}
        self.history.append(row)
        if logger is not None:  # before the checkpoint: a resume drops rows past it
            logger.epoch(row)
        self._save(best=improved)
        shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        self.say(
            f"epoch {epoch + 1}/{self.cfg.sched.epochs} loss {train_loss:.4f} {shown}"
            f" ({dt:.1f}s, {seen / dt:.0f} img/s)"
        )
        return metrics

    def _train_epoch(
        self, epoch: int, loader: DataLoader, logger: MetricLogger | None
    ) -> tuple[float, int]:
        """Train from ``state.step_in_epoch`` to the end of the epoch or an agreed stop.

        Returns the epoch's loss sum and micro-batch count over all ranks (with what a
        mid-epoch checkpoint carried over), so the epoch loss averages every step.
        """
        cfg, s = self.cfg, self.state
        accum, nb = cfg.optim.accum_steps, self._num_batches()
        full = nb - nb % accum  # micro-batches from here on form a shorter last group
        rank = torch.distributed.get_rank() if self.distributed else 0
        self._batches.set_epoch(epoch, s.step_in_epoch)
        self.train_model.train()
        carried = is_main()  # rank 0 carries the sums over all ranks from a checkpoint
        sums = torch.tensor([s.loss_sum, s.loss_count] if carried else [0, 0], dtype=torch.float64)
        progress = Progress(logger, epoch + 1, nb, s.step_in_epoch, s.seen)
        self.optimizer.zero_grad(set_to_none=True)
        bad = ""  # this rank's first non-finite loss (any stops the run)
        for batch in loader:
            k = s.step_in_epoch
            sync = (k + 1) % accum == 0 or k + 1 == nb  # the last micro-batch of its group
            group = accum if k < full else nb - full
            seed_everything(derive_seed(cfg.run.seed, 1, epoch, k, rank))
            # DDP all-reduces gradients on the last micro-batch of an accumulation group only
            no_sync = self.ddp is not None and not sync
            with self.ddp.no_sync() if no_sync else contextlib.nullcontext():
                with autocast(self.precision(), self.device):
                    loss, n = self.task.loss(self.train_model, batch, self.device)
                if not bad and not torch.isfinite(loss):
                    bad = f"loss became {loss.item()} at epoch {epoch + 1}, step {k + 1}"
                    if not self.distributed:
                        raise self._non_finite(bad)
                # under DDP every rank runs backward: the others wait in its gradient all-reduce
                self.scaler.scale(loss / group).backward()
            s.step_in_epoch += 1
            if sync:
                # every rank asks at every update, so all stop at the same one; before the step,
                # so no NaN update is applied
                got = [self._signals.received == sig for sig in STOP_SIGNALS]
                *agreed, failed = any_rank([*got, bool(bad)], self.device)
                self._stop = next((sig for sig, a in zip(STOP_SIGNALS, agreed) if a), None)
                if self._stop is not None:
                    self.say(stop_notice(self._stop))
                if failed:
                    other = f"loss became non-finite on another rank at epoch {epoch + 1}"
                    raise self._non_finite(bad or f"{other}, by step {k + 1}")
                self._optimizer_step()
            sums += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
            s.seen += n * world_size()
            if self._compile_t0 is not None:
                took, self._compile_t0 = time.perf_counter() - self._compile_t0, None
                self.say(f"torch.compile: first step (compile included) took {took:.1f}s")
            logged = sync and ((s.num_updates - 1) % cfg.run.log_interval == 0 or k + 1 == nb)
            lr = self.optimizer.param_groups[0]["lr"]
            progress.update(s.num_updates, loss.item(), lr, s.seen, logged)
            if sync and self._stop is not None:
                break
        progress.close()
        loss_sum, loss_count = all_reduce_sum(sums).tolist()
        return loss_sum, int(loss_count)

    def _optimizer_step(self) -> None:
        s, o = self.state, self.cfg.optim
        if o.clip_grad > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), o.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        s.num_updates += 1
        self.scheduler.step_update(num_updates=s.num_updates)
        if self.ema is not None:
            self.ema.update(self.model, step=s.num_updates)

    @property
    def shipped_model(self) -> nn.Module:
        """The model the run ships: the EMA when enabled, else the trained weights."""
        return self.ema.module if self.ema is not None else self.model

    def shipped_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Metrics of the shipped model under the task's plain names (for the summary)."""
        if self.ema is None:
            return metrics
        return {**metrics, **{k[4:]: v for k, v in metrics.items() if k.startswith("ema_")}}

    @torch.no_grad()
    def _evaluate(self, loader: DataLoader | None = None) -> dict[str, float]:
        loader = loader or self._val_loader()
        with autocast(self.precision(), self.device):
            metrics = self.task.evaluate(self.model.eval(), loader, self.device)
            if self.ema is not None:
                ema_m = self.task.evaluate(self.ema.module.eval(), loader, self.device)
                metrics.update({f"ema_{k}": v for k, v in ema_m.items() if not k.startswith("_")})
        return {k: v for k, v in metrics.items() if not k.startswith("_")}


def data_counts(train: Any, val: Any) -> str:
    """``N train / M val``, counting items, not repeats: a dataset that serves each item
    ``repeat`` times per epoch (grasp's ``data.repeat``) says so."""
    rep = getattr(train, "repeat", 1)
    rep = rep if isinstance(rep, int) and rep > 1 else 1
    shown = f"{len(train) // rep} train" + (f" (x{rep} per epoch)" if rep > 1 else "")
    return f"{shown} / {len(val)} val"

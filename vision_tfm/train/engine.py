"""The one training engine, shared by classification and grasp detection.

A :class:`Task` says what differs (model and data, loss, evaluation, end-of-run artefacts);
:class:`Trainer` owns everything else: optimiser and schedule, precision, accumulation,
clipping, EMA, checkpoints and exact resume, Ctrl-C, NaN guard, DDP and logging.

Exact resume: the shuffle order comes from a generator seeded from ``(seed, epoch)``; every
training item is drawn with all RNGs (torch, numpy, Python, the augmentation pipeline's own)
seeded from ``(seed, epoch, index)``, and every micro-batch runs with them seeded from
``(seed, epoch, position, rank)``. Nothing random depends on what ran before, in which
DataLoader worker, or whether the process restarted, so a run stopped anywhere (Ctrl-C
mid-epoch writes the position and the epoch's partial loss sums into ``last.pt``) continues
exactly as an uninterrupted one and ends with bit-identical weights on CPU.

Under DDP every rank handles Ctrl-C; the ranks agree at each optimizer update whether any was
interrupted, so all stop at the same update and rank 0 writes the checkpoint.

Resuming a run's newest state (its ``last.pt``) continues in its run dir; resuming an older
one (a ``best.pt`` behind it) continues in a new run dir beside it, so nothing written is lost.
A checkpoint outside a run dir this package created (see :mod:`.rundir`) continues in a new
run dir under ``run.out_dir``; a run dir in use by another process is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from .. import __version__
from ..accel import cpu_native_bf16, prepare_for_training, warn_if_bf16_emulated
from ..config import config_to_dict
from ..errors import CheckpointError, VisionTfmError
from ..models.convert import check_finite
from .checkpoint import atomic_save, check_fits, load_checkpoint
from .config import EmaConfig, ModelConfig, OptimConfig, RunConfig, SchedConfig, save_config
from .distributed import all_reduce_sum, cleanup, init_distributed, is_main, world_size
from .logging import MetricLogger
from .rundir import (
    RunLock,
    check_writable_dir,
    is_own_run_dir,
    make_run_dir,
    mark_run_dir,
    remove_stale_temps,
)


class NonFiniteLossError(VisionTfmError, RuntimeError):
    """The loss became NaN or inf; the last good checkpoint is kept."""


FUSED_OPTIMIZERS = ("adam", "adamw")
"""timm names that build torch's ``Adam`` / ``AdamW``, which take ``fused=True``."""


def build_optimizer(model: nn.Module, o: OptimConfig, lr: float) -> torch.optim.Optimizer:
    """timm's optimiser for ``optim``: weight decay off for norms, biases and the model's
    ``no_weight_decay()``; with ``layer_decay``, each group's ``lr_scale`` follows the model's
    ``group_matcher`` (BEiT's ``decay ** (depth + 1 - layer_id)``).

    torch's Adam and AdamW run fused where every parameter lives on a CPU or CUDA device: one
    kernel per step instead of a dozen ops per parameter, which on a small model is a large
    part of a CPU training step (``benchmarks/optimizer_step.py``)."""
    kw: dict[str, Any] = {"betas": o.betas} if "adam" in o.opt or "lamb" in o.opt else {}
    if o.opt.lower() in FUSED_OPTIMIZERS and all(
        p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in model.parameters()
    ):
        kw["fused"] = True
    return create_optimizer_v2(
        model,
        opt=o.opt,
        lr=lr,
        weight_decay=o.weight_decay,
        momentum=o.momentum,
        layer_decay=o.layer_decay or None,
        **kw,
    )


class TrainerConfig(Protocol):
    """The sections every task's config has (classification and grasp configs both do)."""

    model: ModelConfig
    optim: OptimConfig
    sched: SchedConfig
    ema: EmaConfig
    run: RunConfig


class Task(Protocol):
    """What a training task supplies to the engine.

    Optional: ``model_builder(ckpt) -> (build, cfg)``; with it, a resumed checkpoint's weights
    are checked against ``build()`` on the meta device before anything is built for real.
    """

    metric: str  # primary validation metric, higher is better
    batch_size: int
    num_workers: int

    def build(self, pretrained: bool = True) -> tuple[nn.Module, Dataset, Dataset, dict[str, Any]]:
        """Model, train and val datasets, and metadata stored in every checkpoint;
        ``pretrained=False``: without the configured starting weights (a resume has its own)."""

    def collate(self, batch: list) -> Any:
        """Collate samples into a batch (``default_collate`` for classification)."""

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        """Forward a training batch; return the mean loss and the number of samples."""

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device) -> dict:
        """Validation metrics; counts must be summed with ``all_reduce_sum`` under DDP."""

    def finish(self, model: nn.Module, loader: DataLoader, run_dir: Path, history: list) -> None:
        """End-of-run artefacts (plots, overlays); called on rank 0 only."""

    def summary(self, metrics: dict[str, float]) -> str:
        """The last stdout line, e.g. ``val top1: 0.9712``."""


@dataclass
class _State:
    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # micro-batches done in the current epoch (Ctrl-C mid-epoch)
    num_updates: int = 0
    best: float = -math.inf
    # the current epoch's progress before a mid-epoch stop, summed over ranks
    loss_sum: float = 0.0
    loss_count: int = 0
    seen: int = 0
    time_s: float = 0.0
    world_size: int = 1  # a mid-epoch position is only valid under the same process count


def _say(msg: str) -> None:
    """Print on rank 0, the one process that logs."""
    if is_main():
        print(msg, flush=True)


def _file_id(path: Path) -> tuple[int, int, int]:
    """Changes when a file is replaced (atomic_save) or rewritten."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def seed_everything(seed: int) -> None:
    """Seed torch (CPU, and CUDA once in use), numpy and Python RNGs.

    Cheap enough to run per item and per step: ``torch.manual_seed`` would also queue a lazy
    CUDA seeding, which records a stack trace every call.
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _epoch_seed(seed: int, epoch: int) -> int:
    return seed * 100_003 + epoch


def _derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integer parts (numpy's SeedSequence), distinct per tuple."""
    words = np.random.SeedSequence([p % 2**64 for p in parts]).generate_state(2, np.uint32)
    return int(words[0]) << 31 | int(words[1]) >> 1


def _reseed_transforms(ds: Dataset, seed: int) -> None:
    """Restart augmentation pipelines that keep their own RNG (albumentations does).

    Looks at ``transform`` (classification) and ``augment`` (grasp), through Subset wrappers.
    """
    while ds is not None:
        for aug in (getattr(ds, "transform", None), getattr(ds, "augment", None)):
            if hasattr(aug, "reseed"):
                aug.reseed(seed)
        ds = getattr(ds, "dataset", None)


def _full_batches(n: int, batch_size: int, distributed: bool) -> int:
    """Full batches of ``n`` items per epoch on this rank (DistributedSampler pads to equal)."""
    return (math.ceil(n / world_size()) if distributed else n) // batch_size


def _ignore_sigint(worker_id: int) -> None:
    """DataLoader workers leave Ctrl-C to the main process, which still needs them to finish
    the update it is in (a terminal sends SIGINT to the whole process group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _SeededItems(Dataset):
    """Item ``(epoch, index)`` of a dataset, drawn with every RNG seeded from both.

    Augmentation then depends on nothing else: not the worker that loads the item, its place
    in the epoch or the number of processes, so a resumed epoch draws what the first try did.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        seed = _derive_seed(self.seed, 0, epoch, index)
        seed_everything(seed)
        _reseed_transforms(self.dataset, seed)
        return self.dataset[index]


class _EpochBatches(Sampler):
    """One epoch's batches of ``(epoch, index)`` keys, from a given position on.

    The order is a shuffle seeded from ``(seed, epoch)`` (this rank's shard under DDP). One
    DataLoader serves every epoch through :meth:`set_epoch`, so its workers persist, and with
    them what a dataset caches in them.
    """

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, distributed: bool) -> None:
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.distributed = distributed
        self.epoch = self.skip = 0

    def set_epoch(self, epoch: int, skip: int) -> None:
        self.epoch, self.skip = epoch, skip

    def _order(self) -> list[int]:
        if self.distributed:
            sampler = DistributedSampler(self.dataset, shuffle=True, seed=self.seed)
            sampler.set_epoch(self.epoch)
            return list(sampler)
        g = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
        return torch.randperm(len(self.dataset), generator=g).tolist()

    def __iter__(self):
        batches = BatchSampler(self._order(), self.batch_size, drop_last=True)
        for i, batch in enumerate(batches):
            if i >= self.skip:
                yield [(self.epoch, index) for index in batch]

    def __len__(self) -> int:
        return max(
            _full_batches(len(self.dataset), self.batch_size, self.distributed) - self.skip, 0
        )


class Trainer:
    """Runs a :class:`Task` under a config; see the module docstring for the guarantees."""

    def __init__(
        self,
        cfg: TrainerConfig,
        task: Task,
        resume: str | os.PathLike | None = None,
        run_dir: str | os.PathLike | None = None,
    ) -> None:
        self.cfg, self.task = cfg, task
        self.resume_path = Path(resume) if resume else None
        self._run_dir = Path(run_dir) if run_dir else None
        self._interrupted = False  # this process got Ctrl-C
        self._stop = False  # every rank has agreed to stop
        self._eval_only = False
        self._lock: RunLock | None = None

    # --- setup -------------------------------------------------------------------------

    def _device(self) -> torch.device:
        want = self.cfg.run.device
        if want == "auto":
            want = "cuda" if torch.cuda.is_available() else "cpu"
        if want == "cuda" and not torch.cuda.is_available():
            raise ValueError("run.device is 'cuda' but no CUDA device is available")
        if want == "cuda" and "LOCAL_RANK" in os.environ:
            return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        return torch.device(want)

    def precision(self) -> str:
        """``run.precision`` with ``auto`` resolved for this device: fp16 AMP on CUDA, bf16
        where the CPU computes it natively, fp32 where bf16 would be emulated (slower)."""
        p = self.cfg.run.precision
        if p != "auto":
            return p
        if self.device.type == "cuda":
            return "amp"
        return "bf16" if cpu_native_bf16() else "fp32"

    def _autocast(self):
        p = self.precision()
        if p == "fp32":
            return contextlib.nullcontext()
        dt = self.device.type
        dtype = torch.float16 if (p == "amp" and dt == "cuda") else torch.bfloat16
        return torch.autocast(device_type=dt, dtype=dtype)

    def _setup(self) -> None:
        cfg = self.cfg
        if is_main() and self.resume_path is None:  # a read-only out dir fails before any work
            check_writable_dir(self._run_dir or cfg.run.out_dir, "run.out_dir")
        if cfg.run.threads > 0:
            torch.set_num_threads(cfg.run.threads)
        self.device = self._device()
        self.distributed = init_distributed(self.device)
        seed_everything(cfg.run.seed)
        if self.resume_path is not None:  # identity first: a later replace shows as a change
            self._resume_id = _file_id(self.resume_path) if self.resume_path.exists() else None
        self.ckpt = load_checkpoint(self.resume_path, resume=True) if self.resume_path else None
        if self.ckpt is not None:
            self._check_weights()
        # a resumed run restores its weights: the ones it started from are not read again
        built = self.task.build(pretrained=self.ckpt is None)
        model, self.train_ds, self.val_ds, self.meta = built
        self.meta["weights"] = "ema" if cfg.ema.enabled else "model"  # what the run ships
        self.tracked = f"ema_{self.task.metric}" if cfg.ema.enabled else self.task.metric
        if self.ckpt is not None:
            self._check_compatible(model)
        self.model = model.to(self.device)
        self.model = prepare_for_training(self.model)
        self.ema = None
        if cfg.ema.enabled:
            self.ema = ModelEmaV3(self.model, decay=cfg.ema.decay, use_warmup=cfg.ema.warmup)
        o = cfg.optim
        global_batch = self.task.batch_size * o.accum_steps * world_size()
        self.base_lr = o.lr * global_batch / o.lr_base_batch if o.lr_base_batch > 0 else o.lr
        self.optimizer = build_optimizer(self.model, o, self.base_lr)
        # a shorter last accumulation group is stepped too
        self.steps_per_epoch = max(1, math.ceil(self._num_batches() / o.accum_steps))
        total = cfg.sched.epochs * self.steps_per_epoch
        warm = min(int(cfg.sched.warmup_epochs * self.steps_per_epoch), max(total - 1, 0))
        self.scheduler = CosineLRScheduler(
            self.optimizer,
            t_initial=max(total - warm, 1),
            lr_min=cfg.sched.min_lr,
            warmup_t=warm,
            warmup_lr_init=cfg.sched.warmup_lr,
            warmup_prefix=True,
            t_in_epochs=False,
        )
        use_scaler = self.precision() == "amp" and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=use_scaler)
        self.state = _State()
        self.history: list[dict[str, Any]] = []
        if self.ckpt is not None:
            self._restore(self.ckpt)
        self.train_model: nn.Module = self.model
        self.ddp: DistributedDataParallel | None = None
        if self.distributed:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = self.train_model = DistributedDataParallel(self.model, device_ids=ids)
        if cfg.run.compile:  # lazy: it compiles in the first step, which reports the time
            self._compile_t0 = time.perf_counter()
            self.train_model = torch.compile(self.train_model)

    def _check_weights(self) -> None:
        """Before anything is built: finite weights that fit the model the checkpoint's config
        describes, checked on the meta device (an edited config cannot make a huge model)."""
        what = str(self.resume_path)
        check_finite(self.ckpt["model"], what)
        builder = getattr(self.task, "model_builder", None)
        if builder is not None:
            check_fits(builder(self.ckpt)[0], self.ckpt["model"], what)

    def _check_compatible(self, model: nn.Module) -> None:
        ck_name = self.ckpt["meta"].get("model_name")
        if ck_name != self.meta["model_name"]:
            raise ValueError(
                f"{self.resume_path} holds a {ck_name!r} checkpoint, but the config asks for "
                f"{self.meta['model_name']!r}"
            )
        check_fits(lambda: model, self.ckpt["model"], str(self.resume_path))  # as configured now

    def _restore(self, ck: dict[str, Any]) -> None:
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self._restore_schedule(ck["scheduler"], ck["state"]["num_updates"])
        if self.ema is not None and ck.get("ema") is not None:
            self.ema.load_state_dict(ck["ema"])
        self.scaler.load_state_dict(ck["scaler"])
        known = set(_State.__dataclass_fields__)
        self.state = _State(**{k: v for k, v in ck["state"].items() if k in known})
        self.history = list(ck.get("history", []))

    def _restore_schedule(self, saved: dict[str, Any], num_updates: int) -> None:
        """Continue the saved schedule, unless the config now asks for another one.

        The scheduler's state holds its length, so loading it as is would keep a run resumed
        with a larger ``--epochs`` at ``min_lr`` after the old end. A changed schedule is
        rebuilt from the config and picked up at the current update instead.
        """
        shape = ("t_initial", "warmup_t", "lr_min", "warmup_lr_init")
        new = self.scheduler.state_dict()
        if all(saved.get(k) == new[k] for k in shape):
            self.scheduler.load_state_dict(saved)
            return
        self.scheduler.step_update(num_updates=num_updates)
        if not self._eval_only:  # evaluating another folder resizes the epoch
            old_total, new_total = (d["t_initial"] + d["warmup_t"] for d in (saved, new))
            _say(
                f"the schedule differs from the checkpoint's ({old_total} -> {new_total} "
                f"updates); following the new one from update {num_updates}"
            )

    def _num_batches(self) -> int:
        return _full_batches(len(self.train_ds), self.task.batch_size, self.distributed)

    def _train_loader(self) -> DataLoader:
        """The one training loader of the run; :meth:`_train_epoch` points it at each epoch."""
        self._batches = _EpochBatches(
            self.train_ds, self.task.batch_size, self.cfg.run.seed, self.distributed
        )
        return DataLoader(
            _SeededItems(self.train_ds, self.cfg.run.seed),
            batch_sampler=self._batches,
            num_workers=self.task.num_workers,
            collate_fn=self.task.collate,
            persistent_workers=self.task.num_workers > 0,
            pin_memory=self.device.type == "cuda",
            worker_init_fn=_ignore_sigint,
        )

    def _val_loader(self) -> DataLoader:
        idx = list(range(len(self.val_ds)))
        if self.distributed:  # disjoint shards, no padding: counts summed across ranks are exact
            idx = idx[torch.distributed.get_rank() :: world_size()]
        batches = list(BatchSampler(idx, self.task.batch_size, drop_last=False))
        return DataLoader(
            self.val_ds,
            batch_sampler=batches,
            num_workers=self.task.num_workers,
            collate_fn=self.task.collate,
            persistent_workers=self.task.num_workers > 0,  # keeps what workers cache
        )

    # --- checkpoints -------------------------------------------------------------------

    def _checkpoint(self) -> dict[str, Any]:
        s = self.state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "scaler": self.scaler.state_dict(),
            "state": dataclasses.asdict(s),
            "config": config_to_dict(self.cfg),
            "meta": self.meta,
            "history": self.history,
            "version": __version__,
        }

    def _save(self, best: bool) -> None:
        # a finite loss does not prove finite weights (a huge step, a bad lr). Every rank
        # checks its own copy: DDP keeps them equal, so all ranks stop here together.
        try:
            check_finite(self.model.state_dict(), "the trained weights")
        except CheckpointError as e:
            raise self._non_finite(f"{e} after epoch {self.state.epoch}") from None
        if not is_main():
            return
        ck = self._checkpoint()
        atomic_save(ck, self.run_dir / "last.pt")
        if best:
            atomic_save(ck, self.run_dir / "best.pt")

    def _non_finite(self, what: str) -> NonFiniteLossError:
        """The one-line stop; only rank 0 knows its run dir and writes checkpoints."""
        if not is_main():
            kept = "rank 0 keeps the last good checkpoint"
        elif (self.run_dir / "last.pt").exists():
            kept = f"last good checkpoint kept: {self.run_dir / 'last.pt'}"
        else:
            kept = "no checkpoint yet"
        return NonFiniteLossError(f"{what}; stopping ({kept})")

    # --- loop --------------------------------------------------------------------------

    def _on_sigint(self, signum, frame) -> None:
        if self._interrupted:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self._interrupted = True
        _say("\ninterrupt: finishing this update, then writing a resumable checkpoint")

    def fit(self, eval_only: bool = False) -> dict[str, float]:
        """Train (or just evaluate) and return the last validation metrics."""
        self._eval_only = eval_only
        self._setup()
        try:
            if eval_only:
                metrics = self._evaluate()
                _say(self.task.summary(self.shipped_metrics(metrics)))
                return metrics
            return self._fit()
        finally:
            if self._lock is not None:
                self._lock.release()
            cleanup()

    def _resumes_newest(self) -> bool:
        """Whether the resumed checkpoint is its run dir's newest state (its last.pt, or a copy).

        Continuing in place from anything older (a best.pt behind last.pt) would overwrite
        last.pt with another lineage and repeat epochs in metrics.csv.
        """
        last = self.resume_path.parent / "last.pt"
        if self.resume_path.name == last.name:  # unless another run has replaced it since
            with contextlib.suppress(OSError):
                return _file_id(last) == self._resume_id
            return False
        try:
            return load_checkpoint(last, resume=True)["state"] == self.ckpt["state"]
        except (OSError, ValueError):  # no (readable) last.pt: nothing to continue there
            return False

    def _fork_run_dir(self, parent: Path, why: str) -> Path:
        """A new run dir under ``parent``; the resumed checkpoint's folder is left as it is."""
        old = self.resume_path.parent
        new = make_run_dir(parent, self.meta["model_name"])
        s = self.state
        at_best = bool(self.history) and self.history[-1].get(self.tracked) == s.best
        if at_best and not s.step_in_epoch:  # the resumed epoch is this lineage's best so far
            atomic_save(self.ckpt, new / "best.pt")
        _say(
            f"{self.resume_path} {why}; continuing in a new run dir {new} and leaving {old} "
            f"as it is"
        )
        return new

    def _lock_run_dir(self, path: Path) -> None:
        """Hold ``path`` against a second writer and clear temps a killed write left."""
        if self._lock is not None:
            self._lock.release()
        self._lock = RunLock(path).acquire()
        remove_stale_temps(path)

    def _prepare_run_dir(self) -> bool:
        """Pick the run dir (rank 0 creates and locks it); True when a resume starts a new one."""
        forked = False
        if self.resume_path is not None:
            self.run_dir = self.resume_path.parent  # continue the same run
            if is_main() and not is_own_run_dir(self.run_dir):  # a user's folder: never write
                forked = True
                self.run_dir = self._fork_run_dir(
                    Path(self.cfg.run.out_dir), "is not in a run dir vision_tfm made"
                )
            elif is_main():  # lock, then look again: it may have moved on while we waited
                if self._resumes_newest():
                    self._lock_run_dir(self.run_dir)
                if self._lock is None or not self._resumes_newest():
                    forked = True  # a folder we only read is left byte for byte as it was
                    self.run_dir = self._fork_run_dir(
                        self.run_dir.parent, "is not the newest state of its run dir"
                    )
        elif self._run_dir is not None:
            self.run_dir = self._run_dir
            if is_main():
                self.run_dir.mkdir(parents=True, exist_ok=False)
                mark_run_dir(self.run_dir)
        elif is_main():
            self.run_dir = make_run_dir(self.cfg.run.out_dir, self.meta["model_name"])
        else:
            self.run_dir = Path(self.cfg.run.out_dir)
        if is_main():
            if forked or self.resume_path is None:
                self._lock_run_dir(self.run_dir)
            save_config(self.cfg, self.run_dir / "config.yaml")
        return forked

    def _fit(self) -> dict[str, float]:
        cfg, s = self.cfg, self.state
        if self._num_batches() == 0:
            # full batches only (drop_last), so a split smaller than one batch trains nothing
            raise ValueError(
                f"the training split has {len(self.train_ds)} images, fewer than one batch "
                f"(data.batch_size={self.task.batch_size} per process); lower data.batch_size"
            )
        if s.epoch >= cfg.sched.epochs:
            raise ValueError(
                f"{self.resume_path} has already trained {s.epoch} epochs of "
                f"sched.epochs={cfg.sched.epochs}; raise --epochs to train on"
            )
        if s.step_in_epoch and s.world_size != world_size():
            raise ValueError(
                f"{self.resume_path} was stopped mid-epoch under {s.world_size} process(es); "
                f"resume it under {s.world_size} (torchrun --nproc_per_node={s.world_size})"
            )
        s.world_size = world_size()
        forked = self._prepare_run_dir()
        logger = MetricLogger(self.run_dir, cfg.run.tensorboard) if is_main() else None
        if logger is not None and forked:  # the new metrics.csv starts with the epochs inherited
            for row in self.history:
                logger.epoch(row)
        elif logger is not None and self.ckpt is not None:  # rows a killed run wrote past it
            logger.drop_rows_after(step=s.num_updates, epoch=s.epoch)
        n_params = sum(p.numel() for p in self.model.parameters())
        _say(
            f"run dir {self.run_dir} | {self.meta['model_name']} {n_params / 1e6:.2f}M params"
            f" | {len(self.train_ds)} train / {len(self.val_ds)} val | device {self.device}"
            f" x{world_size()} | lr {self.base_lr:.2e}"
        )
        if is_main() and self.precision() != "fp32" and self.device.type == "cpu":  # bf16
            warn_if_bf16_emulated("train with run.precision=fp32")
        prev = signal.signal(signal.SIGINT, self._on_sigint)  # on every rank
        metrics: dict[str, float] = {}
        train_loader, val_loader = self._train_loader(), self._val_loader()
        stop_at = s.epoch + cfg.run.stop_after if cfg.run.stop_after else cfg.sched.epochs
        last = min(cfg.sched.epochs, stop_at)
        try:
            while s.epoch < last:
                epoch = s.epoch
                t0 = time.perf_counter()
                loss_sum, loss_count = self._train_epoch(epoch, train_loader, logger)
                dt = s.time_s + time.perf_counter() - t0
                if self._stop:
                    s.loss_sum, s.loss_count, s.time_s = loss_sum, loss_count, dt
                    self._save(best=False)
                    last_pt = self.run_dir / "last.pt"
                    _say(f"checkpoint written: {last_pt} (resume with --resume {last_pt})")
                    sys.exit(130)
                train_loss, seen = loss_sum / max(loss_count, 1), s.seen
                metrics = self._evaluate(val_loader)
                s.epoch, s.step_in_epoch = epoch + 1, 0
                s.loss_sum, s.loss_count, s.seen, s.time_s = 0.0, 0, 0, 0.0
                improved = metrics[self.tracked] > s.best
                s.best = max(s.best, metrics[self.tracked])
                row = {
                    "epoch": epoch + 1,
                    "train_loss": train_loss,
                    "lr": self.optimizer.param_groups[0]["lr"],
                    **metrics,
                    "epoch_time_s": round(dt, 2),
                    "img_per_s": round(seen / dt, 1),
                }
                self.history.append(row)
                if logger is not None:  # before the checkpoint: a resume drops rows past it
                    logger.epoch(row)
                self._save(best=improved)
                shown = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
                _say(
                    f"epoch {epoch + 1}/{cfg.sched.epochs} loss {train_loss:.4f} {shown}"
                    f" ({dt:.1f}s, {seen / dt:.0f} img/s)"
                )
        finally:
            if prev is not None:
                signal.signal(signal.SIGINT, prev)
            if logger is not None:
                logger.close()
        if s.epoch < cfg.sched.epochs:
            _say(
                f"stopped after epoch {s.epoch} of {cfg.sched.epochs}; resume with "
                f"--resume {self.run_dir / 'last.pt'}"
            )
        elif is_main() and cfg.run.plots:
            self.task.finish(self.shipped_model, val_loader, self.run_dir, self.history)
        _say(self.task.summary(self.shipped_metrics(metrics or self.history[-1])))
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
        from tqdm import tqdm

        bar = tqdm(  # on rank 0, and only on a terminal
            initial=s.step_in_epoch,
            total=nb,
            desc=f"epoch {epoch + 1}",
            leave=False,
            dynamic_ncols=True,
            disable=None if is_main() else True,
        )
        t_start, seen_start = time.perf_counter(), s.seen
        self.optimizer.zero_grad(set_to_none=True)
        bad = ""  # this rank's first non-finite loss (any stops the run)
        for batch in loader:
            k = s.step_in_epoch
            sync = (k + 1) % accum == 0 or k + 1 == nb  # the last micro-batch of its group
            group = accum if k < full else nb - full
            seed_everything(_derive_seed(cfg.run.seed, 1, epoch, k, rank))
            with self._grad_sync(sync):
                with self._autocast():
                    loss, n = self.task.loss(self.train_model, batch, self.device)
                if not bad and not torch.isfinite(loss):
                    bad = f"loss became {loss.item()} at epoch {epoch + 1}, step {k + 1}"
                    if not self.distributed:
                        raise self._non_finite(bad)
                # under DDP every rank runs backward: the others wait in its gradient all-reduce
                self.scaler.scale(loss / group).backward()
            s.step_in_epoch += 1
            if sync:
                stop, failed = self._agree(bool(bad))  # before the step: no NaN update applied
                if failed:
                    raise self._non_finite(
                        bad
                        or f"loss became non-finite on another rank at epoch {epoch + 1}, "
                        f"by step {k + 1}"
                    )
                self._optimizer_step()
            sums += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
            s.seen += n * world_size()
            if hasattr(self, "_compile_t0"):
                took = time.perf_counter() - self._compile_t0
                _say(f"torch.compile: first step (compile included) took {took:.1f}s")
                del self._compile_t0
            logged = sync and ((s.num_updates - 1) % cfg.run.log_interval == 0 or k + 1 == nb)
            if logger is not None and logged:  # rank 0
                lr = self.optimizer.param_groups[0]["lr"]
                ips = (s.seen - seen_start) / max(time.perf_counter() - t_start, 1e-9)
                bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}")
                logger.step(s.num_updates, loss.item(), lr)
            bar.update(1)
            if sync and stop:
                break
        bar.close()
        loss_sum, loss_count = all_reduce_sum(sums).tolist()
        return loss_sum, int(loss_count)

    def _grad_sync(self, sync: bool) -> contextlib.AbstractContextManager:
        """DDP all-reduces gradients on the last micro-batch of an accumulation group only."""
        if sync or self.ddp is None:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def _agree(self, bad_loss: bool) -> tuple[bool, bool]:
        """Whether any rank got Ctrl-C, and whether any saw a non-finite loss.

        Every rank asks at every update, in one all-reduce, so all stop at the same one: a
        rank that stopped alone would leave the others blocked in the next collective.
        """
        flags = torch.tensor([float(self._interrupted), float(bad_loss)], device=self.device)
        stop, failed = (all_reduce_sum(flags) > 0).tolist()
        self._stop = stop
        return stop, failed

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
        with self._autocast():
            metrics = self.task.evaluate(self.model.eval(), loader, self.device)
            if self.ema is not None:
                ema_m = self.task.evaluate(self.ema.module.eval(), loader, self.device)
                metrics.update({f"ema_{k}": v for k, v in ema_m.items() if not k.startswith("_")})
        return {k: v for k, v in metrics.items() if not k.startswith("_")}

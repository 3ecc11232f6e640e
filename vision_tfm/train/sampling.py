"""Exact resume: every random draw of a run depends on the seed and a position, nothing else.

The shuffle order comes from a generator seeded from ``(seed, epoch)``; every training item
is drawn with all RNGs (torch, numpy, Python, the augmentation pipeline's own) seeded from
``(seed, epoch, index)``, and every micro-batch runs with them seeded from ``(seed, epoch,
position, rank)``. Nothing random depends on what ran before, in which DataLoader worker, or
whether the process restarted, so a run stopped anywhere continues exactly as an
uninterrupted one and ends with bit-identical weights on CPU.
"""

from __future__ import annotations

import math
import random
import signal
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from ..distributed import world_size
from ..errors import ConfigError
from .stops import STOP_SIGNALS


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


def epoch_seed(seed: int, epoch: int) -> int:
    return seed * 100_003 + epoch


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integer parts (numpy's SeedSequence), distinct per tuple."""
    words = np.random.SeedSequence([p % 2**64 for p in parts]).generate_state(2, np.uint32)
    return int(words[0]) << 31 | int(words[1]) >> 1


def reseed_transforms(ds: Dataset, seed: int) -> None:
    """Restart augmentation pipelines that keep their own RNG (albumentations does).

    Looks at ``transform`` (classification) and ``augment`` (grasp), through Subset wrappers.
    """
    while ds is not None:
        for aug in (getattr(ds, "transform", None), getattr(ds, "augment", None)):
            if hasattr(aug, "reseed"):
                aug.reseed(seed)
        ds = getattr(ds, "dataset", None)


def full_batches(n: int, batch_size: int, distributed: bool) -> int:
    """Full batches of ``n`` items per epoch on this rank (DistributedSampler pads to equal)."""
    return (math.ceil(n / world_size()) if distributed else n) // batch_size


def check_batches(n: int, batch_size: int, distributed: bool) -> None:
    """Full batches only (drop_last): a split smaller than one batch would train nothing."""
    if full_batches(n, batch_size, distributed) == 0:
        raise ConfigError(
            f"the training split has {n} images, fewer than one batch "
            f"(data.batch_size={batch_size} per process); lower data.batch_size"
        )


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers leave Ctrl-C and SIGTERM to the main process, which still needs
    them to finish the update it is in and to evaluate: a terminal sends SIGINT, and
    ``timeout`` its signal, to the whole process group, and a worker that SIGTERM ended
    would stop the run with a DataLoader error instead of a checkpoint. The main process
    still shuts its workers down (a sentinel on their queues), and a worker whose parent has
    died exits by itself."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class SeededItems(Dataset):
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
        seed = derive_seed(self.seed, 0, epoch, index)
        seed_everything(seed)
        reseed_transforms(self.dataset, seed)
        return self.dataset[index]


class EpochBatches(Sampler):
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
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return torch.randperm(len(self.dataset), generator=g).tolist()

    def __iter__(self):
        batches = BatchSampler(self._order(), self.batch_size, drop_last=True)
        for i, batch in enumerate(batches):
            if i >= self.skip:
                yield [(self.epoch, index) for index in batch]

    def __len__(self) -> int:
        return max(
            full_batches(len(self.dataset), self.batch_size, self.distributed) - self.skip, 0
        )


def val_batches(n: int, batch_size: int, distributed: bool) -> list[list[int]]:
    """Evaluation batches of ``n`` items, in order; under DDP this rank's disjoint shard, with
    no padding, so counts summed across ranks are exact."""
    idx = list(range(n))
    if distributed:
        idx = idx[torch.distributed.get_rank() :: world_size()]
    return list(BatchSampler(idx, batch_size, drop_last=False))


def make_loader(
    ds: Dataset, batches: Any, task: Any, device: torch.device | None = None
) -> DataLoader:
    """A DataLoader over ``batches`` with the task's workers and collate. Workers persist
    (with what they cache) across epochs and leave stop signals to the main process; given
    the device, it is a training loader: pinned memory on CUDA."""
    n = task.num_workers
    return DataLoader(
        ds,
        batch_sampler=batches,
        num_workers=n,
        collate_fn=task.collate,
        persistent_workers=n > 0,
        pin_memory=device is not None and device.type == "cuda",
        worker_init_fn=ignore_stop_signals,
    )

"""DDP plumbing for ``torchrun``: gloo on CPU, nccl on GPU; rank 0 alone writes files."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def init_distributed(device: torch.device) -> bool:
    """Join the process group when launched by torchrun; returns whether we are distributed."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend)
    return True


def is_main() -> bool:
    """Rank 0 (or not distributed): the one process that logs and writes."""
    return not dist.is_initialized() or dist.get_rank() == 0


def world_size() -> int:
    """Number of processes (1 when not distributed)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (identity when not distributed), on the tensor's device.

    NCCL reduces CUDA tensors only, so a CPU tensor (counts, loss sums) goes via the GPU.
    """
    if dist.is_initialized():
        on = t.device
        if dist.get_backend() == "nccl" and on.type != "cuda":
            on = torch.device("cuda", torch.cuda.current_device())
        out = t.to(on, copy=True)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(t.device)
    return t


def cleanup() -> None:
    """Leave the process group so the launcher exits cleanly."""
    if dist.is_initialized():
        dist.destroy_process_group()


def any_rank(flags: list[bool], device: torch.device) -> list[bool]:
    """For each flag, whether any rank raised it, in one all-reduce; every rank must call it
    at the same point, so all act on the answer together."""
    t = torch.tensor([float(f) for f in flags], device=device)
    return (all_reduce_sum(t) > 0).tolist()


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` (picklable) on every rank, for a decision rank 0 alone can make (it
    reads the run dirs); ``obj`` itself when not distributed. Every rank must call it."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]

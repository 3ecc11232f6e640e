"""Where a run computes and in which precision, resolved once from ``run``."""

from __future__ import annotations

import contextlib
import os

import torch

from ..accel import cpu_native_bf16
from ..errors import ConfigError


def resolve_device(want: str) -> torch.device:
    """``run.device`` (``auto``, ``cpu`` or ``cuda``) as a device; under torchrun each process
    takes its ``LOCAL_RANK``'s GPU."""
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device is 'cuda' but no CUDA device is available")
    if want == "cuda" and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device(want)


def resolve_precision(precision: str, device: torch.device) -> str:
    """``run.precision`` with ``auto`` resolved for this device: fp16 AMP on CUDA, bf16
    where the CPU computes it natively, fp32 where bf16 would be emulated (slower)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "amp"
    return "bf16" if cpu_native_bf16() else "fp32"


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The autocast context of a resolved precision: fp16 for AMP on CUDA, else bf16."""
    if precision == "fp32":
        return contextlib.nullcontext()
    half = precision == "amp" and device.type == "cuda"
    return torch.autocast(device_type=device.type, dtype=torch.float16 if half else torch.bfloat16)

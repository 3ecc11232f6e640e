"""FLOPs per image and this machine's matmul ceiling, to say how close a format runs to it.

Convention: 1 multiply-add = 2 FLOPs (``torch.utils.flop_counter``'s), over matmuls,
convolutions and attention only, as FLOP tables count. torch's counter knows only the CUDA
attention kernels, so the CPU SDPA op is given their formula (q @ k^T plus attn @ v).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from ..accel import cpu_description as cpu_description  # the CPU line of speed tables


def _cpu_sdpa_flops(q_shape: Any, k_shape: Any, v_shape: Any, *args: Any, **kwargs: Any) -> int:
    """The CPU SDPA kernel, counted by torch's formula for its CUDA twins."""
    return sdpa_flop_count(q_shape, k_shape, v_shape)


_CPU_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}


def count_flops(model: nn.Module, x: torch.Tensor) -> float:
    """FLOPs of one forward pass over ``x`` divided by its batch size (FLOPs per image)."""
    counter = FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION)
    with counter, torch.inference_mode():
        model(x)
    return counter.get_total_flops() / x.shape[0]


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch on ``n`` intra-op threads (0 = leave as is), then restore the count."""
    prev = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def matmul_ceiling(
    dtype: torch.dtype = torch.float32,
    threads: int = 0,
    sizes: Sequence[int] = (512, 1024, 2048),
    seconds: float = 1.0,
    device: str | torch.device = "cpu",
) -> float:
    """Best FLOP/s of square matmuls in ``dtype`` on ``threads`` torch threads, ``seconds``
    per size: the best run, not the mean, as a shared machine only ever makes a run slower.
    On a GPU each run is ten matmuls queued back to back and waited for, so the wait's
    latency is spread over them."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    reps = 10 if on_gpu else 1
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    best = 0.0
    with torch_threads(threads), torch.inference_mode():
        for n in sizes:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            torch.mm(a, b)  # warm up: allocation, kernel selection
            sync()
            start, runs = time.perf_counter(), 0
            while runs < 3 or time.perf_counter() - start < seconds:
                t0 = time.perf_counter()
                for _ in range(reps):
                    torch.mm(a, b)
                sync()
                best = max(best, reps * 2.0 * n**3 / (time.perf_counter() - t0))
                runs += 1
    return best

"""Gradient checkpointing: peak activation memory and time of one training step, on and off.

Run: ``python benchmarks/grad_checkpointing.py [--models vit_small_patch16_224 ...]
[--batch 16] [--size 224] [--repeats 2] [--threads 0]`` (several minutes per model on 2 cores).

Memory: each (model, checkpointing) pair runs one forward + backward in a fresh subprocess.
The process's peak RSS is reset (``/proc/self/clear_refs``) after the model, its gradients and
the batch are allocated, so the peak above the resident size at that point is what the step
itself needed: activations kept for backward plus the backward's transients. Time: one more
subprocess per model alternates plain and checkpointed steps, ``--repeats`` of each after a
warm-up of both, and reports the median ratio; it also checks that both give bit-identical
gradients on the same batch. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

MODELS = ("vit_small_patch16_224", "swin_tiny_patch4_window7_224")


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _setup(name: str, batch: int, size: int) -> tuple[torch.nn.Module, torch.Tensor]:
    import vision_tfm as vt

    torch.manual_seed(0)
    model = vt.create_model(name).train()
    for p in model.parameters():  # gradients allocated up front: not part of the step's peak
        p.grad = torch.zeros_like(p)
    return model, torch.randn(batch, 3, size, size)


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).logsumexp(-1).mean().backward()


def child_memory(name: str, ckpt: bool, batch: int, size: int) -> dict:
    """Peak RSS growth (MiB) of one training step in this process."""
    model, x = _setup(name, batch, size)
    model.set_grad_checkpointing(ckpt)
    base = _kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    t0 = time.perf_counter()
    _step(model, x)
    return {"peak_mib": (_kib("VmHWM") - base) / 1024, "step_s": time.perf_counter() - t0}


def child_time(name: str, batch: int, size: int, repeats: int) -> dict:
    """Interleaved plain / checkpointed step times, and whether their gradients agree."""
    model, x = _setup(name, batch, size)
    grads = {}
    for ckpt in (False, True):  # warm-up, and the gradient check on the same batch
        model.zero_grad(set_to_none=False)
        model.set_grad_checkpointing(ckpt)
        _step(model, x)
        grads[ckpt] = [p.grad.clone() for p in model.parameters()]
    identical = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for ckpt in (False, True):
            model.set_grad_checkpointing(ckpt)
            t0 = time.perf_counter()
            _step(model, x)
            times[ckpt].append(time.perf_counter() - t0)
    return {"plain_s": times[False], "ckpt_s": times[True], "identical_grads": identical}


def _run_child(args: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"child {' '.join(args)} failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.child:
        kind, name, *rest = a.child
        if kind == "memory":
            res = child_memory(name, rest[0] == "1", a.batch, a.size)
        else:
            res = child_time(name, a.batch, a.size, a.repeats)
        print(json.dumps(res))
        return
    common = ["--batch", str(a.batch), "--size", str(a.size), "--threads", str(a.threads)]
    print(f"{_cpu()}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}")
    print(f"batch {a.batch} at {a.size}x{a.size}, one forward + backward (training mode)")
    header = "model", "peak plain", "peak ckpt", "reduction", "time ratio", "grads"
    print("{:<32} {:>11} {:>11} {:>10} {:>11} {:>10}".format(*header))
    for name in a.models:
        plain = _run_child(["memory", name, "0", *common])
        ckpt = _run_child(["memory", name, "1", *common])
        t = _run_child(["time", name, *common, "--repeats", str(a.repeats)])
        ratio = statistics.median(c / p for p, c in zip(t["plain_s"], t["ckpt_s"]))
        print(
            f"{name:<32} {plain['peak_mib']:>7.0f} MiB {ckpt['peak_mib']:>7.0f} MiB "
            f"{1 - ckpt['peak_mib'] / plain['peak_mib']:>9.0%} {ratio:>10.2f}x "
            f"{'identical' if t['identical_grads'] else 'DIFFER':>10}"
        )
        print(
            f"  step seconds: plain {', '.join(f'{s:.2f}' for s in t['plain_s'])}; "
            f"checkpointed {', '.join(f'{s:.2f}' for s in t['ckpt_s'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()

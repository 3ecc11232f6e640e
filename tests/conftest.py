"""Shared test helpers: tiny versions of every registered model, error checks that pin names."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import PurePath

import pytest
import torch

import vision_tfm as vt
from vision_tfm.models.registry import get_model_entry


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the workers split the cores: each worker's default of one intra-op
    thread per core would put ``workers x cores`` spinning OpenMP threads on the machine."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def _as_word(name: str) -> str:
    """A regex for ``name`` standing alone: ``2`` is not found in ``12`` or ``2.5``, ``epochs``
    not in ``epochs_max``; a number may touch letters (``600`` in ``600x600``), and an integer
    may be shown as a float (``5`` as ``5.0``, after a float field coerced it)."""
    edge = {True: (r"(?<![\d.])", r"(?:\.0+)?(?!\d|\.\d)"), False: (r"(?<!\w)", r"(?!\w)")}
    head = edge[name[0].isdigit()][0] if re.match(r"\w", name) else ""
    tail = edge[name[-1].isdigit()][1] if re.match(r"\w", name[-1]) else ""
    return head + re.escape(name) + tail


def assert_names(message: str, *names: object) -> None:
    """``message`` is one line and names each of ``names`` (a key, file, flag or number) as a
    word of its own. Error tests pin what the message points at, never the sentence around it."""
    assert "\n" not in message.strip(), message
    paths = {str(n) for n in names if isinstance(n, PurePath)}

    def names_it(name: str) -> bool:  # not inside one of the given paths (a pytest-1 folder)
        rest = message
        for p in paths - {name}:
            rest = rest.replace(p, " ")
        return re.search(_as_word(name), rest) is not None

    missing = [n for n in names if not names_it(str(n))]
    assert not missing, f"{message!r} does not name {missing}"


@contextmanager
def raises_naming(kind: type[BaseException], *names: object) -> Iterator[pytest.ExceptionInfo]:
    """``pytest.raises(kind)`` whose one-line message names each of ``names``."""
    with pytest.raises(kind) as info:
        yield info
    assert_names(str(info.value), *names)


def tiny_overrides(name: str) -> dict:
    """Shrink a registered model to test size while keeping its family structure."""
    cfg = get_model_entry(name).cfg
    if hasattr(cfg, "depths"):  # hierarchical (Swin): keep the stage count
        n = len(cfg.depths)
        return {"embed_dim": 8, "depths": (2,) * n, "num_heads": (1,) * n}
    if hasattr(cfg, "depth") and hasattr(cfg, "num_heads") and cfg.embed_dim > 64:
        return {"embed_dim": 16, "depth": 2, "num_heads": 2}
    return {}


def input_size(model: torch.nn.Module) -> tuple[int, int, int]:
    """A valid (C, H, W) for the model at its nominal size."""
    return (model.in_chans, model.cfg.img_size, model.cfg.img_size)


@pytest.fixture
def tiny_model():
    def make(name: str, **kw) -> torch.nn.Module:
        torch.manual_seed(0)
        return vt.create_model(name, **{**tiny_overrides(name), **kw})

    return make


@pytest.fixture
def fake_cpu(monkeypatch):
    """``fake_cpu(capability, native_bf16, amx=native_bf16)``: the attention plan and the
    emulated-bf16 warning see that CPU (e.g. ``"AVX2", False``) instead of this one. It
    replaces the facts' cached readers, so every importer of the public facts sees them."""
    from vision_tfm.accel import cpu

    def fake(capability: str, native_bf16: bool, amx: bool | None = None) -> None:
        amx = native_bf16 if amx is None else amx
        monkeypatch.setattr(cpu, "_cpu_capability", lambda: capability)
        monkeypatch.setattr(cpu, "_cpu_native_bf16", lambda: native_bf16)
        monkeypatch.setattr(cpu, "_cpu_amx", lambda: amx)

    return fake


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module: on shared, busy CPUs a second OpenMP thread spins
    far more than it computes. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

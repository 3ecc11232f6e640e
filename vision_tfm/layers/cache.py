"""A small bounded LRU for tensors derived from input sizes (attention masks, position tables).

Such tensors depend only on a grid size, dtype and device, so rebuilding them every forward
pass is waste; keeping one per size ever seen grows without bound when input sizes vary
(detection, multi-scale inference). :class:`TensorCache` keeps the most recently used few.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

from ..errors import ConfigError


def tracing() -> bool:
    """Whether a graph is being captured (torch.compile, torch.export, the TorchScript tracer).

    Tensors made then may be fake or symbolic, and must be built inside the graph anyway.
    """
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


class TensorCache:
    """LRU of at most ``max_entries`` values, built on first use by a caller-given function.

    Values are shared between callers and must be treated as read-only. They are built
    outside autograd and inference mode, so one made during ``torch.inference_mode()``
    still serves a training forward later. While tracing nothing is cached or read.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ConfigError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The value under ``key``, built by ``build()`` (and the oldest one evicted) if absent."""
        if tracing():
            return build()
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        with torch.inference_mode(False), torch.no_grad():
            value = build()
        self._entries[key] = value
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def __deepcopy__(self, memo: dict) -> TensorCache:
        return TensorCache(self.max_entries)  # a copied model (EMA) refills its own

    def __getstate__(self) -> dict:
        return {"max_entries": self.max_entries, "_entries": OrderedDict()}

    def __repr__(self) -> str:
        return f"TensorCache({len(self)}/{self.max_entries})"

"""Model registry: names -> (class, default config). Loops and tests never name a class."""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..config import apply_overrides

__all__ = ["create_model", "get_model_entry", "list_models", "register_model"]


@dataclass(frozen=True)
class ModelEntry:
    """What ``create_model`` needs to build one registered name."""

    name: str
    cls: type[nn.Module]
    cfg: Any  # the family's config dataclass instance


_REGISTRY: dict[str, ModelEntry] = {}


def register_model(name: str, cls: type[nn.Module], cfg: Any) -> None:
    """Register ``name`` as ``cls(cfg)``; a duplicate name is a programming error."""
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = ModelEntry(name, cls, cfg)


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style ``pattern``."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def get_model_entry(name: str) -> ModelEntry:
    """Look up a name; an unknown one lists the closest registered names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f"closest: {', '.join(close)}" if close else "see vision_tfm.list_models()"
        raise ValueError(f"unknown model name {name!r}; {hint}") from None


def create_model(name: str, **overrides: Any) -> nn.Module:
    """Build a registered model; keyword overrides replace fields of its config dataclass.

    The model keeps ``model_name`` and the resolved ``cfg`` so checkpoints can say what
    they are.
    """
    entry = get_model_entry(name)
    try:
        cfg = apply_overrides(entry.cfg, overrides)
        model = entry.cls(cfg)  # constructors reject out-of-range fields with a ValueError
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    model.model_name = name
    return model

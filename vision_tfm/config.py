"""Dataclass configs: the single source of truth, with strict key and type checking.

Every override (YAML, ``key.sub=value`` on the CLI, ``create_model(**kw)``) goes through
:func:`apply_overrides`, so an unknown key or a wrong type fails in one line that names the
key, instead of being silently ignored or failing later inside a model.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml

__all__ = ["ConfigError", "apply_overrides", "config_to_dict", "parse_cli_overrides"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key is unknown or its value has the wrong type."""


def _hint(key: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, options, n=3)
    named = [prefix + c for c in (close or options)]
    return f"; did you mean {', '.join(named)}?" if close else f"; valid keys: {', '.join(named)}"


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; allow only lossless promotions (int->float)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"config key {key!r}: {value!r} does not match {tp}")
    if origin is tuple or origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(
                    f"config key {key!r}: expected {len(args)} values, got {len(value)}"
                )
            items = [_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            arg = args[0] if args else Any
            items = [_coerce(v, arg, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"config key {key!r}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key {key!r}: expected a string, got {value!r}")
    return value


def apply_overrides(cfg: T, overrides: Mapping[str, Any], prefix: str = "") -> T:
    """Return a copy of dataclass ``cfg`` with ``overrides`` applied and type-checked.

    Nested dataclasses take nested mappings or dotted keys (``optim.lr``).
    """
    if not dataclasses.is_dataclass(cfg):
        raise TypeError(f"expected a dataclass config, got {type(cfg).__name__}")
    hints = typing.get_type_hints(type(cfg))
    names = [f.name for f in dataclasses.fields(cfg)]
    nested: dict[str, dict[str, Any]] = {}
    flat: dict[str, Any] = {}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if head not in names:
            raise ConfigError(f"unknown config key {prefix + head!r}{_hint(head, names, prefix)}")
        sub = getattr(cfg, head)
        if rest and isinstance(sub, dict):
            flat[head] = {**flat.get(head, sub), rest: value}  # free-form mapping (model kwargs)
        elif rest:
            if not dataclasses.is_dataclass(sub):
                raise ConfigError(f"config key {prefix + head!r} has no sub-keys")
            nested.setdefault(head, {})[rest] = value
        elif dataclasses.is_dataclass(sub):
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key {prefix + head!r}: expected a mapping")
            nested.setdefault(head, {}).update(value)
        else:
            flat[head] = _coerce(value, hints[head], prefix + head)
    for head, sub_over in nested.items():
        flat[head] = apply_overrides(getattr(cfg, head), sub_over, prefix + head + ".")
    return dataclasses.replace(cfg, **flat)


def parse_cli_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ``["optim.lr=1e-3", "model.depths=[2,2]"]`` into typed values via YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        value = yaml.safe_load(raw) if raw != "" else ""
        if isinstance(value, str) and _looks_numeric(raw):
            value = float(raw)  # YAML 1.1 reads '1e-3' as a string
        out[key.strip()] = value
    return out


def _looks_numeric(raw: str) -> bool:
    try:
        float(raw)
    except ValueError:
        return False
    return True


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML-safe dict of a (nested) dataclass; tuples become lists."""

    def conv(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return {k: conv(v) for k, v in dataclasses.asdict(cfg).items()}

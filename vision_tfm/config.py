"""Dataclass configs: the single source of truth, with strict key and type checking.

Every override (YAML, ``key.sub=value`` on the CLI, ``create_model(**kw)``) goes through
:func:`apply_overrides`, so an unknown key or a wrong type fails in one line that names the
key; each config's ``__post_init__`` checks its values (:func:`check_ranges`) however it is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import reprlib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml

from .errors import ConfigError, InputTypeError
from .files import MAX_NESTING, check_nesting

__all__ = [
    "Checked",
    "ConfigError",
    "Range",
    "apply_overrides",
    "check_memory",
    "check_ranges",
    "config_to_dict",
    "machine_memory",
    "parse_cli_overrides",
    "safe_yaml",
    "shorten",
]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Range:
    """The valid values of a numeric config field; ``str()`` is what the error shows.

    Attributes:
        lo, hi: Bounds (None = unbounded); every value must also be finite.
        lo_open, hi_open: Exclude the bound itself.
        zero: 0 is also allowed (a field where 0 means "off").
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    zero: bool = False

    def __contains__(self, v: float) -> bool:
        if not math.isfinite(v):
            return False
        if self.zero and v == 0:
            return True
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return self.hi is None or not (v > self.hi or (self.hi_open and v == self.hi))

    def __str__(self) -> str:
        if self.hi is None:
            text = "finite" if self.lo is None else f"{'>' if self.lo_open else '>='} {self.lo:g}"
        else:
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            text = (
                f"in {'(' if self.lo_open else '['}{lo}, {self.hi:g}{')' if self.hi_open else ']'}"
            )
        return f"0 or {text}" if self.zero else text


POSITIVE = Range(0, lo_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
PROBABILITY = Range(0, 1)


def check_ranges(cfg: Any, ranges: Mapping[str, Range] | None = None) -> None:
    """Check a config dataclass's fields against its ``RANGES`` and ``CHOICES`` (from
    ``__post_init__``).

    Tuple fields are checked element by element, and a field annotated ``int`` (or a tuple of
    ints) takes integers only; the fields named in its ``ORDERED`` must also be ``(low, high)``
    pairs with ``low <= high``. Raises a one-line :class:`ConfigError` naming the key
    (``SECTION.field``, e.g. ``optim.lr``) and what is valid. ``ranges`` replaces ``RANGES``.
    """
    kind = type(cfg)
    section = f"{kind.SECTION}." if getattr(kind, "SECTION", "") else ""
    whole = _int_fields(kind)
    for name, rng in (kind.RANGES if ranges is None else ranges).items():
        value = getattr(cfg, name)
        values = value if isinstance(value, (tuple, list)) else (value,)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v not in rng:
                raise ConfigError(f"{section}{name} must be {rng}, got {_show(value)}")
            if name in whole and not isinstance(v, int):
                raise ConfigError(f"{section}{name} must be an integer {rng}, got {_show(value)}")
    for name, allowed in getattr(kind, "CHOICES", {}).items():
        if getattr(cfg, name) not in allowed:
            shown = ", ".join(map(repr, allowed))
            raise ConfigError(f"{section}{name} must be one of {shown}, got {getattr(cfg, name)!r}")
    for name in getattr(kind, "ORDERED", ()):
        lo, hi = getattr(cfg, name)
        if lo > hi:
            raise ConfigError(
                f"{section}{name} must be (low, high) with low <= high, got {_show((lo, hi))}"
            )


class Checked:
    """Base of a config dataclass whose ``RANGES`` and ``CHOICES`` are checked on creation."""

    def __post_init__(self) -> None:
        check_ranges(self)


@functools.cache
def _int_fields(kind: type) -> frozenset[str]:
    """Fields annotated ``int`` or ``tuple[int, ...]``: a float there would slip past a Range."""
    hints = typing.get_type_hints(kind)
    return frozenset(
        f.name
        for f in dataclasses.fields(kind)
        if hints[f.name] is int or typing.get_args(hints[f.name])[:1] == (int,)
    )


MAX_SHOWN = 200
"""Characters of a value an error quotes: a value built to be huge (a YAML alias bomb, a
million-element list) must not turn a one-line error into megabytes of text."""


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with its full length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


_BRIEF = reprlib.Repr()  # keyword arguments only from Python 3.12
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxtuple, _BRIEF.maxdict = 3, 20, 20, 20
_BRIEF.maxstring = _BRIEF.maxother = MAX_SHOWN


def _brief(v: Any) -> str:
    """A scalar as ``str`` shows it; a container bounded in depth and width (a YAML alias
    bomb shares one list 10**9 times: ``str`` would write every copy)."""
    return str(v) if isinstance(v, (int, float, str, bool, type(None))) else _BRIEF.repr(v)


def _brief_repr(v: Any) -> str:
    """``repr`` bounded in depth, width and length, for errors."""
    return shorten(_BRIEF.repr(v))


def _show(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        head = ", ".join(map(_brief, value[:20]))
        return shorten(f"[{head}{', ...' if len(value) > 20 else ''}]")
    return shorten(_brief(value))


MAX_YAML_ALIASES = 100
"""Aliases (``*name``) a YAML text may use: a config needs a few; nested aliases expand
exponentially (the billion laughs)."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses more than :data:`MAX_YAML_ALIASES` aliases."""

    aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise ConfigError(
                    f"more than {MAX_YAML_ALIASES} YAML aliases (*name): refused, as nested "
                    "aliases expand exponentially"
                )
        return super().compose_node(parent, index)


def safe_yaml(text: str) -> Any:
    """``yaml.safe_load`` with the alias and nesting bounds (:data:`MAX_YAML_ALIASES`,
    ``files.MAX_NESTING``); YAML errors propagate as ``yaml.YAMLError``."""
    try:
        value = yaml.load(text, Loader=_BoundedLoader)
    except RecursionError:
        raise ConfigError(f"YAML nests deeper than {MAX_NESTING} levels") from None
    return check_nesting(value, "YAML")


def machine_memory() -> int | None:
    """Bytes of memory this machine has (``psutil`` if installed, else ``/proc/meminfo``);
    None where neither says, and then no bound is checked."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(nbytes: float, key: str, what: str) -> None:
    """Refuse, in one line naming ``key``, a setting whose ``what`` needs more bytes than the
    machine has: checked arithmetically before anything is allocated, so a hostile size is an
    error instead of a hang, a swap storm or ``std::bad_alloc``."""
    total = machine_memory()
    if total is not None and nbytes > total:
        raise ConfigError(
            f"{key}: {what} would need {nbytes / 2**30:,.3g} GiB, more than this machine's "
            f"{total / 2**30:,.3g} GiB of memory"
        )


def _hint(key: str, options: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, options, n=3)
    named = [prefix + c for c in (close or options)]
    return f"; did you mean {', '.join(named)}?" if close else f"; valid keys: {', '.join(named)}"


def _coerce(value: Any, tp: Any, key: str, finite: bool = True) -> Any:
    """Check ``value`` against annotation ``tp``; allow only lossless promotions (int->float).

    ``finite=False`` lets nan/inf through to a field's own :class:`Range`, whose message also
    names the valid range.
    """
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            with contextlib.suppress(ConfigError):
                return _coerce(value, arm, key, finite)
        raise ConfigError(f"config key {key!r}: {_brief_repr(value)} does not match {tp}")
    if origin is tuple or origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {_brief_repr(value)}")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(
                    f"config key {key!r}: expected {len(args)} values, got {len(value)}"
                )
            items = [
                _coerce(v, a, f"{key}[{i}]", finite) for i, (v, a) in enumerate(zip(value, args))
            ]
        else:
            arg = args[0] if args else Any
            items = [_coerce(v, arg, f"{key}[{i}]", finite) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {_brief_repr(value)}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r}: expected true/false, got {_brief_repr(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r}: expected an integer, got {_brief_repr(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # nan / inf silently disable or poison whatever reads them
            if finite and not math.isfinite(value):
                raise ConfigError(
                    f"config key {key!r}: expected a finite number, got {_brief_repr(value)}"
                )
            return float(value)
        raise ConfigError(f"config key {key!r}: expected a number, got {_brief_repr(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key {key!r}: expected a string, got {_brief_repr(value)}")
    return value


def apply_overrides(cfg: T, overrides: Mapping[str, Any], prefix: str = "") -> T:
    """Return a copy of dataclass ``cfg`` with ``overrides`` applied and type-checked.

    Nested dataclasses take nested mappings or dotted keys (``optim.lr``).
    """
    if not dataclasses.is_dataclass(cfg):
        raise InputTypeError(f"expected a dataclass config, got {type(cfg).__name__}")
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
            ranged = head in getattr(type(cfg), "RANGES", {})
            flat[head] = _coerce(value, hints[head], prefix + head, finite=not ranged)
    for head, sub_over in nested.items():
        flat[head] = apply_overrides(getattr(cfg, head), sub_over, prefix + head + ".")
    return dataclasses.replace(cfg, **flat)  # runs the dataclass's own range checks


def parse_cli_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ``["optim.lr=1e-3", "model.depths=[2,2]"]`` into typed values via YAML scalars."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        try:
            value = safe_yaml(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            why = str(e).splitlines()[0]
            raise ConfigError(
                f"override {key.strip()!r}: {shorten(repr(raw))} is not valid YAML ({why})"
            ) from None
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


def plain(v: Any) -> Any:
    """``v`` with every tuple a list, nested dicts included: what YAML and JSON write."""
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain, YAML-safe dict of a (nested) dataclass; tuples become lists."""
    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}

"""The config reference, ``docs/config.md``: every key of every task's config, with its type,
default, valid values and meaning, generated from the dataclasses so that it cannot drift.

``python -m vision_tfm.tasks.reference [OUT]`` rewrites it (default: the repository's
``docs/config.md``); a test fails when the file and the dataclasses disagree.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..io import atomic_write_text
from . import TASKS

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "config.md"
HEADER = """# Config reference

Every key of `train_cls.py` and `train_grasp.py`, with its type, its default and the values
it takes. A YAML file (`--config`, the recipes in `configs/`) lists only what differs from
these defaults, and `key.sub=value` overrides on the command line come last; an unknown key
or a wrong type is an error naming the key. How the keys work together:
[training.md](training.md).

Generated from the config dataclasses by `python -m vision_tfm.tasks.reference`: edit the
dataclass docstrings, not this file.
"""


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's text from the class docstring's Google-style ``Attributes:`` section
    (``a, b: text`` gives both the text), continuation lines joined."""
    lines = (inspect.getdoc(cls) or "").splitlines()
    if "Attributes:" not in lines:
        return {}
    docs: dict[str, str] = {}
    names: list[str] = []
    for line in lines[lines.index("Attributes:") + 1 :]:
        entry = re.match(r"^ {4}(\w+(?:, \w+)*): (.*)$", line)
        if entry:
            names = entry[1].split(", ")
            docs.update(dict.fromkeys(names, entry[2].strip()))
        elif line.startswith(" " * 8) and names:
            for n in names:
                docs[n] += " " + line.strip()
        elif line.strip():  # the next section
            break
    return docs


def _valid(cls: type, name: str) -> str:
    if name in getattr(cls, "CHOICES", {}):
        return ", ".join(f"`{json.dumps(c)}`" for c in cls.CHOICES[name])
    if name in getattr(cls, "RANGES", {}):
        return str(cls.RANGES[name])
    return ""


def _type(field: dataclasses.Field) -> str:
    return field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def section_table(section: str, cfg: Any) -> list[str]:
    """One Markdown table: the keys of one config section, with ``cfg``'s values as defaults."""
    cls = type(cfg)
    docs = attribute_docs(cls)
    rows = ["| key | type | default | valid | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = json.dumps(getattr(cfg, f.name))
        cells = (f"`{section}.{f.name}`", f"`{_type(f)}`", f"`{default}`", _valid(cls, f.name))
        rows.append("| " + " | ".join(_cell(c) for c in (*cells, docs.get(f.name, ""))) + " |")
    return rows


def render() -> str:
    """The whole reference, one part per registered task, one table per section."""
    out = [HEADER]
    for task in TASKS.values():
        cfg = task.config_cls()
        out.append(f"## {task.script} ({task.title})\n")
        for f in dataclasses.fields(cfg):
            section = getattr(cfg, f.name)
            summary = (inspect.getdoc(type(section)) or "").split("\n\n")[0].replace("\n", " ")
            out += [f"### {f.name}\n", f"{summary}\n", *section_table(f.name, section), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> None:
    """Write the reference to ``argv[0]`` (default: the repository's ``docs/config.md``)."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DEFAULT_OUT
    atomic_write_text(render(), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

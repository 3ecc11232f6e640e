"""The package's floors (docs/design.md): imports run downward only, and never in a circle.

The imports are read from the source with ``ast`` (those inside functions too), so a lazy
import cannot hide a climb.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "vision_tfm"

FLOORS: dict[str, int] = {
    "errors": 0,
    "config": 0,
    "constants": 0,
    "version": 0,
    "files": 0,
    "layers": 1,
    "models": 2,
    "data": 2,
    "grasp": 2,
    "accel": 2,
    "io": 2,
    "distributed": 2,
    "viz": 2,
    "optimize": 2,
    "tasks": 3,
    "train": 4,
    "export": 4,
    "detection": 4,
    "cli": 5,
}
"""Each top-level module or subpackage and its floor; the package's ``__init__`` is the roof."""

ALLOWED_SIDEWAYS = {
    ("config", "errors"),
    ("files", "errors"),  # a failed write is a RunDirError
    ("config", "files"),  # YAML configs share the JSON nesting bound
    ("data", "grasp"),  # grasp datasets encode rectangles into maps
    ("io", "models"),  # checkpoints are read with the models' safe loader
    ("optimize", "accel"),  # the inference fast path applies accel's swaps
}
"""Imports between two parts of one floor that the layout allows (from, to)."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` for every import of a vision_tfm module in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path.parent)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            for a in node.names:  # `from . import x` and `from pkg import submodule`
                sub = f"{mod}.{a.name}"
                if (PKG.parent / sub.replace(".", "/")).is_dir() or (
                    PKG.parent / (sub.replace(".", "/") + ".py")
                ).is_file():
                    found.append((node.lineno, sub))
    return [(n, m) for n, m in found if m == "vision_tfm" or m.startswith("vision_tfm.")]


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_part_has_a_floor() -> None:
    parts = {_part(_module_name(p)) for p in _files()} - {None}
    assert parts <= set(FLOORS), f"give these a floor in FLOORS: {sorted(parts - set(FLOORS))}"


def layout_violations() -> list[str]:
    bad = []
    for path in _files():
        src = _part(_module_name(path))
        if src is None:  # the package's own __init__: the roof, it may import anything
            continue
        for line, target in _imports(path):
            dst = _part(target)
            where = f"{path.relative_to(PKG.parent)}:{line} imports {target}"
            if dst is None:
                bad.append(f"{where} (the package root: import the part instead)")
            elif FLOORS[dst] > FLOORS[src]:
                bad.append(f"{where} ({src} is on floor {FLOORS[src]}, {dst} on {FLOORS[dst]})")
            elif FLOORS[dst] == FLOORS[src] and dst != src and (src, dst) not in ALLOWED_SIDEWAYS:
                bad.append(f"{where} (sideways on floor {FLOORS[src]})")
    return bad


def test_imports_run_downward_only() -> None:
    bad = layout_violations()
    assert not bad, "imports against the floors (docs/design.md):\n" + "\n".join(bad)


def test_no_import_circles() -> None:
    graph: dict[str, set[str]] = {}
    for path in _files():
        name = _module_name(path)
        graph[name] = {m for _, m in _imports(path) if m != name}
    known = set(graph)
    for name in graph:  # an import of a name inside a module is an edge to that module
        graph[name] = {m if m in known else m.rsplit(".", 1)[0] for m in graph[name]} & known
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if m.startswith(n + "."):  # a package importing its own submodules
                continue
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (cycle := visit(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            pytest.fail("import circle: " + " -> ".join(cycle))


def test_the_checker_catches_a_climb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model file importing from data/ and train/ is reported, with its line."""
    pkg = tmp_path / "vision_tfm"
    (pkg / "models").mkdir(parents=True)
    (pkg / "data").mkdir()
    (pkg / "train").mkdir()
    for p in (pkg, pkg / "models", pkg / "data", pkg / "train"):
        (p / "__init__.py").write_text("")
    (pkg / "data" / "config.py").write_text("X = 1\n")
    (pkg / "models" / "vit.py").write_text(
        "from ..data.config import X\n\ndef f():\n    from vision_tfm.train import engine\n"
    )
    (pkg / "train" / "engine.py").write_text("")
    monkeypatch.setattr(f"{__name__}.PKG", pkg)
    bad = layout_violations()
    assert any(re.search(r"models/vit.py:1 imports vision_tfm.data.config", b) for b in bad)
    assert any(re.search(r"models/vit.py:4 imports vision_tfm.train", b) for b in bad)


def test_no_task_strings_in_shared_code() -> None:
    """Shared code asks the task; it never tests a task's name."""
    hits = [
        f"{p.relative_to(PKG.parent)}:{i}"
        for p in _files()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"task\s*==|==\s*[\"'](grasp|cls)[\"']", line)
    ]
    assert not hits, hits

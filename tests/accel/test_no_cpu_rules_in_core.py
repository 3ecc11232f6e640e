"""CPU-specific rules live in vision_tfm/accel/ only: no other module names a CPU or an ISA."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import vision_tfm

PACKAGE = Path(vision_tfm.__file__).parent
# whole words, any case: what `grep -rniwE` with this pattern finds
CPU_WORDS = re.compile(
    r"(?<![\w])(zen[0-9]*|amx|avx[0-9a-z_]*|epyc|xeon|sapphire|intel|amd)(?![\w])", re.IGNORECASE
)


def test_no_cpu_names_outside_accel():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "accel") in path.parents:
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if CPU_WORDS.search(line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{no}: {line.strip()}")
    assert not found, "CPU rules belong in vision_tfm/accel/:\n" + "\n".join(found)


def test_the_pattern_finds_what_grep_would():
    hits = ["AVX512_BF16 units", "on AMD Zen 5", "(amx)", "zen4", "avx2", "Intel Xeon"]
    misses = ["zenith", "examx", "gamd", "intelligent", "amdahl"]
    assert all(CPU_WORDS.search(s) for s in hits)
    assert not any(CPU_WORDS.search(s) for s in misses)


def _package_imports(path: Path) -> set[str]:
    """The vision_tfm subpackages ``path`` imports (``layers``, ``accel``...)."""
    here = path.relative_to(PACKAGE).with_suffix("").parts  # ("accel", "cpu")
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            mods = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative to this module
            base = list(here[: len(here) - node.level])
            tails = [node.module.split(".")] if node.module else [[a.name] for a in node.names]
            mods = [["vision_tfm", *base, *tail] for tail in tails]
        elif isinstance(node, ast.ImportFrom):
            mods = [node.module.split(".")]
        else:
            continue
        found |= {m[1] for m in mods if len(m) > 1 and m[0] == "vision_tfm"}
    return found


def test_accel_sits_above_layers_and_layers_never_import_it():
    """errors/config -> layers -> accel: accel reads the core, the core knows nothing of it."""
    for path in (PACKAGE / "accel").rglob("*.py"):
        assert _package_imports(path) <= {"errors", "config", "layers", "accel"}, path
    for path in (PACKAGE / "layers").rglob("*.py"):
        assert "accel" not in _package_imports(path), path

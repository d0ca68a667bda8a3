"""No public name that nothing uses (what ruff cannot see; the architecture issue asked
for vulture "or a small test": this is the small test, with no false positives from
names only notebooks call).

A module-level public name of ``tpu_course`` (function, class, constant) must occur
somewhere besides its own definition: in the package, the tests, the tools, the
benchmarks, a notebook twin or a document. ``__all__`` lists do not count as a use.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.stack_independent

ROOT = Path(__file__).resolve().parents[1]
WORD = re.compile(r"\b[A-Za-z_]\w*\b")
ALL = re.compile(r"__all__\s*=\s*[\[(].*?[\])]", re.S)


def _corpus() -> collections.Counter:
    files = list((ROOT / "tpu_course").rglob("*.py"))
    for folder in ("tests", "tools", "bench", "notebooks", "solutions", "docs"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md")]
    files += [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "INSTRUCTORS.md",
                                        "Makefile", "pyproject.toml")]
    words: collections.Counter = collections.Counter()
    for path in files:
        words.update(WORD.findall(ALL.sub("", path.read_text(encoding="utf-8", errors="ignore"))))
    return words


def _public_definitions():
    for path in sorted((ROOT / "tpu_course").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            for name in names:
                if not name.startswith("_"):
                    yield path.relative_to(ROOT), name


def test_every_public_name_is_used_somewhere():
    words = _corpus()
    unused = [f"{path}: {name}" for path, name in _public_definitions() if words[name] <= 1]
    assert not unused, "public names used nowhere (delete them, or use them):\n" + "\n".join(unused)


def test_the_check_finds_an_unused_name(tmp_path):
    """The rule itself: a name defined once and named nowhere else is found."""
    text = "def used():\n    pass\n\n\ndef lonely_name_xyz():\n    used()\n"
    words = collections.Counter(WORD.findall(ALL.sub("", text + "__all__ = ['lonely_name_xyz']")))
    assert words["lonely_name_xyz"] == 1 and words["used"] == 2

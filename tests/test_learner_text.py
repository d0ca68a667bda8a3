"""Learner-facing text speaks of the course, never of its development: no issue numbers
or change history in the chapters, labs, solutions, README, the instructors' guide or
the site's pages."""

from __future__ import annotations

import pathlib
import re

import pytest

pytestmark = pytest.mark.stack_independent

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = sorted([*ROOT.glob("notebooks/*.py"), *ROOT.glob("labs/*.py"),
                *ROOT.glob("solutions/*.py"), ROOT / "README.md", ROOT / "INSTRUCTORS.md",
                *ROOT.glob("docs/*.md")])
DEVELOPMENT = re.compile(r"\bissues?\s*#?\d+|\bPR\s*#?\d+|\bpull request\b",
                         re.IGNORECASE)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_development_vocabulary(path):
    found = [f"{path.name}:{i}: {line.strip()}" for i, line in
             enumerate(path.read_text().splitlines(), 1) if DEVELOPMENT.search(line)]
    assert not found, "\n".join(found)

"""Lab checkers, one sub-module per chapter (``checks.ch01`` ... ``checks.ch07``).

Each chapter module holds its lab's registry, ``LAB`` (a :class:`Lab`): every exercise
with its title, minutes, what it needs and its checker. A checker returns a
:class:`CheckResult` and never raises: "passed", "failed" (with a hint; the expected
answer only through :func:`reveal`), "not written" or "skipped" (what the runtime lacks).
``LAB.scorecard(globals())`` at the end of a lab re-runs every checker and totals them.
Chapter sub-modules load on first use (``checks.ch05``), since some of them import JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

from tpu_course.checks._core import (
    KINDS, NEEDS, CheckResult, Exercise, Lab, NotWritten, NotWrittenError, Scorecard, Verdict,
    as_number, course_code_used, grading_seed, names_used, refuse, refuse_course_code,
    close_enough, fail, is_not_written, not_written, ok, reveal, skip_if_not_written, skipped,
)

__all__ = [
    "KINDS", "NEEDS", "CheckResult", "Exercise", "Lab", "NotWritten", "NotWrittenError",
    "Scorecard", "Verdict", "as_number", "course_code_used", "grading_seed", "names_used",
    "refuse",
    "refuse_course_code", "close_enough", "fail", "is_not_written", "not_written", "ok", "reveal",
    "skip_if_not_written", "skipped", "LABS", "lab",
]
#: The chapter modules that hold a lab, in order.
LABS = ("ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07")


def lab(number: int) -> Lab:
    """The registry of lab ``number`` (``checks.lab(3)`` is ``checks.ch03.LAB``)."""
    name = f"ch{number:02d}" if isinstance(number, int) else None
    if name not in LABS:
        raise ValueError(f"there is no lab {number!r}; the labs are 1 to {len(LABS)}")
    return importlib.import_module(f"{__name__}.{name}").LAB


def __getattr__(name: str) -> Any:
    if name in LABS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tpu_course.checks' has no attribute {name!r}")

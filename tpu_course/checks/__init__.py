"""Lab checks, one sub-module per chapter (``checks.ch01`` ... ``checks.ch08``).

Each chapter module declares its lab, ``LAB`` (a :class:`~tpu_course.checks.engine.Lab`):
every exercise once, as an :class:`~tpu_course.checks.engine.Exercise` (what the learner
provides, the visible cases, how the learner's code is run, how its output is compared).
A check cell calls the exercise's check, which never raises: "passed", "failed" (with a
hint; the expected answer only through :func:`reveal`), "not written" or "skipped".
``LAB.scorecard(globals())`` at the end of a lab totals them, and ``hand_in(LAB, MY_ID)``
marks the notebook as the learner's hand-in (the grader reads who from it). References,
hidden cases and known mistakes are not here: they live in the repository's ``grading/``
folder, which ``tpu-course grade`` loads (see :mod:`tpu_course.checks.engine`). Chapter
sub-modules load on first use (``checks.ch05``), since some of them import JAX.
"""

from __future__ import annotations

import importlib
import operator
from typing import Any

from tpu_course.errors import CourseValueError
from tpu_course.checks.engine import (
    KINDS, NEEDS, Case, CheckResult, Exercise, Lab, Mistake, NotWritten, NotWrittenError,
    Scorecard, fail, hand_in, is_not_written, not_written, ok, reveal, skip_if_not_written,
    skipped,
)

__all__ = [
    "KINDS", "NEEDS", "Case", "CheckResult", "Exercise", "Lab", "Mistake", "NotWritten",
    "NotWrittenError", "Scorecard", "fail", "hand_in", "is_not_written", "not_written", "ok",
    "reveal", "skip_if_not_written", "skipped", "LABS", "lab",
]
#: The chapter modules that hold a lab, in order.
LABS = ("ch01", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08")


def lab(number: int | str) -> Lab:
    """The registry of lab ``number`` (``checks.lab(3)`` is ``checks.ch03.LAB``; the
    number as text, ``checks.lab("3")``, works too)."""
    n = number
    if isinstance(n, str) and n.strip().isdigit():
        n = int(n.strip())
    if hasattr(n, "__index__") and not isinstance(n, (bool, str)):
        n = operator.index(n)  # numpy integers too
    name = f"ch{n:02d}" if isinstance(n, int) and not isinstance(n, bool) else None
    if name not in LABS:
        hint = (" Pass the lab's number, e.g. checks.lab(1)." if not isinstance(n, int)
                or isinstance(n, bool) else "")
        raise CourseValueError(f"there is no lab {number!r}; the labs are 1 to "
                               f"{len(LABS)}.{hint}")
    return importlib.import_module(f"{__name__}.{name}").LAB


def __getattr__(name: str) -> Any:
    if name in LABS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tpu_course.checks' has no attribute {name!r}")

"""Lab checkers, one sub-module per chapter (``checks.ch01`` ... ``checks.ch06``).

Every checker returns a :class:`CheckResult`: truthy when the answer is right, with a
message that says what was expected and what came back when it is not. In a notebook the
result renders as a coloured line; ``assert_passed`` turns a failure into an exception.
Chapter sub-modules load on first use (``checks.ch05.check_train_step``), since some of
them import JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

from tpu_course.checks._core import CheckResult, close_enough, fail, ok

__all__ = ["CheckResult", "close_enough", "fail", "ok"]
_CHAPTERS = ("ch01", "ch02", "ch03", "ch04", "ch05", "ch06")


def __getattr__(name: str) -> Any:
    if name in _CHAPTERS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'tpu_course.checks' has no attribute {name!r}")

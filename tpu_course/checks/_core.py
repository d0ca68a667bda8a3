"""The result type every lab checker returns, and small helpers to build it."""

from __future__ import annotations

import dataclasses
import html


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise.

    ``passed`` is the verdict, ``message`` says why: on a failure it names what was
    expected, what came back and, where the mistake is a common one, what it looks like.
    """

    exercise: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        return f"[{mark}] {self.exercise}: {self.message}"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        mark = "&#10004; pass" if self.passed else "&#10008; not yet"
        return (
            f'<div style="border-left:4px solid {colour};padding:4px 8px">'
            f"<b style='color:{colour}'>{mark}</b> <b>{html.escape(self.exercise)}</b>: "
            f"{html.escape(self.message)}</div>"
        )

    def assert_passed(self) -> "CheckResult":
        """Raise ``AssertionError`` with the message when the check failed."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


def ok(exercise: str, message: str = "correct") -> CheckResult:
    """A passing result."""
    return CheckResult(exercise, True, message)


def fail(exercise: str, message: str) -> CheckResult:
    """A failing result; ``message`` should say expected vs got and a hint."""
    return CheckResult(exercise, False, message)


def close_enough(got: float, want: float, rel: float) -> bool:
    """True when ``got`` is within a relative tolerance ``rel`` of ``want``.

    >>> close_enough(101.0, 100.0, 0.02), close_enough(110.0, 100.0, 0.05)
    (True, False)
    """
    return abs(got - want) <= rel * abs(want)

"""What every lab checker is built from: the verdict, the exercise registry, the scorecard.

A lab is a :class:`Lab` (one per chapter, ``checks.chNN.LAB``) holding its
:class:`Exercise` entries: title, minutes, what the exercise needs (any runtime, an
accelerator, the TPU compiler), the names of the learner's objects it grades, and the
checker. A checker is registered with :meth:`Lab.exercise`, which wraps it so that it
never raises: an unwritten exercise, a learner's exception, a wrong type or a string
where a number belongs all become a :class:`CheckResult` that says what happened.

The same registry serves three readers: the check cell after each exercise (the wrapped
checker), the scorecard at the end of a lab (:meth:`Lab.scorecard`, which re-runs every
checker on the objects it finds in the notebook's namespace), and the instructor's
grader. Predictions a learner records are ordinary variables in that namespace, so a
fresh run of the checkers finds them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import html
import math
import numbers
from typing import Any, Callable, Iterator, Mapping

PASSED, FAILED, NOT_WRITTEN, SKIPPED = "passed", "failed", "not written", "skipped"
_MARKS = {PASSED: "PASS", FAILED: "FAIL", NOT_WRITTEN: "NOT WRITTEN", SKIPPED: "SKIPPED"}
_COLOURS = {PASSED: "#1a7f37", FAILED: "#cf222e", NOT_WRITTEN: "#9a6700", SKIPPED: "#57606a"}

#: What an exercise can need from the runtime, and how to tell whether it is there.
NEEDS = ("cpu", "accelerator", "tpu-compiler")

#: The last result of each exercise, so that :func:`reveal` can show its answer on request.
_LAST: dict[str, "CheckResult"] = {}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise.

    ``status`` is ``"passed"``, ``"failed"``, ``"not written"`` or ``"skipped"``;
    ``message`` says why; on a failure ``hint`` points at the mistake without giving the
    answer, and ``answer`` (the expected value) is shown only by :func:`reveal`.
    ``bool(result)`` is True only for a pass.
    """

    exercise: str
    passed: bool
    message: str
    status: str = ""
    hint: str = ""
    answer: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            object.__setattr__(self, "status", PASSED if self.passed else FAILED)

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        text = f"[{_MARKS[self.status]}] {self.exercise}: {self.message}"
        if self.hint:
            text += f"\n  Hint: {self.hint}"
        if self.answer:
            text += f'\n  (checks.reveal("{self.exercise}") shows the expected answer)'
        return text

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = _COLOURS[self.status]
        mark = {"passed": "&#10004; pass", "failed": "&#10008; not yet"}.get(
            self.status, html.escape(self.status))
        extra = f"<br><i>Hint:</i> {html.escape(self.hint)}" if self.hint else ""
        if self.answer:
            extra += (f'<br><small>checks.reveal("{html.escape(self.exercise)}") shows the '
                      "expected answer</small>")
        return (
            f'<div style="border-left:4px solid {colour};padding:4px 8px">'
            f"<b style='color:{colour}'>{mark}</b> <b>{html.escape(self.exercise)}</b>: "
            f"{html.escape(self.message)}{extra}</div>"
        )

    def assert_passed(self) -> "CheckResult":
        """Raise ``AssertionError`` with the message when the check did not pass."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


def ok(exercise: str, message: str = "correct") -> CheckResult:
    """A passing result."""
    return CheckResult(exercise, True, message)


def fail(exercise: str, message: str, *, hint: str = "", answer: str = "") -> CheckResult:
    """A failing result: ``message`` says what is wrong (not the answer), ``hint`` where to
    look, ``answer`` the expected value, shown only when the learner asks (:func:`reveal`)."""
    return CheckResult(exercise, False, message, FAILED, hint, answer)


def not_written(exercise: str, detail: str = "") -> CheckResult:
    """The learner has not written this exercise yet (a stub is still in place)."""
    message = "not written yet" + (f": {detail}" if detail else "")
    return CheckResult(exercise, False, message, NOT_WRITTEN)


def skipped(exercise: str, reason: str) -> CheckResult:
    """This runtime cannot grade the exercise; ``reason`` says what it needs."""
    return CheckResult(exercise, False, f"skipped: {reason}", SKIPPED)


def close_enough(got: float, want: float, rel: float) -> bool:
    """True when ``got`` is within a relative tolerance ``rel`` of ``want``.

    >>> close_enough(101.0, 100.0, 0.02), close_enough(110.0, 100.0, 0.05)
    (True, False)
    """
    return abs(got - want) <= rel * abs(want)


def reveal(exercise: str) -> str:
    """The expected answer of ``exercise`` (its title, e.g. ``"Exercise 3"``, or a prefix
    of it), from the last time its checker ran. Printed and returned."""
    matches = [r for title, r in _LAST.items() if title == exercise or title.startswith(exercise)]
    if not matches:
        text = (f"{exercise!r} has not been checked yet in this kernel: run its check cell "
                "first, then ask again.")
    else:
        r = matches[-1]
        if r.answer:
            text = f"{r.exercise}: {r.answer}"
        elif r.passed:
            text = f"{r.exercise}: you passed; there is nothing to reveal."
        else:
            text = f"{r.exercise}: {r.message} (this checker has no single expected value)."
    print(text)
    return text


# -- stubs the lab generator writes ------------------------------------------------------


class NotWrittenError(NotImplementedError):
    """Raised when code uses the value of an exercise the learner has not written yet."""


class NotWritten:
    """The value an unwritten exercise leaves behind in a lab (``x = NotWritten("Exercise 2")``).

    Using it (arithmetic, formatting, calling it, indexing it, converting it to a number
    or an array) raises :class:`NotWrittenError`, which a cell wrapped in
    :func:`skip_if_not_written` turns into a "skipped" line; checkers report it as "not
    written yet".
    """

    def __init__(self, exercise: str) -> None:
        object.__setattr__(self, "exercise", exercise)

    def _raise(self, *_: Any, **__: Any) -> Any:
        raise NotWrittenError(f"{self.exercise} is not written yet")

    def __repr__(self) -> str:
        return f"NotWritten({self.exercise!r})"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # keep Python's and IPython's protocol probes working
            raise AttributeError(name)
        self._raise()

    __call__ = __getitem__ = __iter__ = __len__ = __bool__ = __float__ = __int__ = _raise
    __index__ = __array__ = __format__ = __neg__ = __abs__ = _raise
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _raise
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __pow__ = __rpow__ = _raise
    __matmul__ = __rmatmul__ = __lt__ = __le__ = __gt__ = __ge__ = _raise


def is_not_written(value: Any) -> bool:
    """True for a :class:`NotWritten` stub value."""
    return isinstance(value, NotWritten)


@contextlib.contextmanager
def skip_if_not_written() -> Iterator[None]:
    """Run a cell that depends on exercises; if one is not written yet, say so and skip.

    >>> with skip_if_not_written():
    ...     NotWritten("Exercise 2") + 1
    skipped: Exercise 2 is not written yet
    """
    try:
        yield
    except NotImplementedError as err:
        what = str(err) or "an exercise this cell uses is not written yet"
        what = what.replace(": write your code here", " is not written yet")
        print(f"skipped: {what}")


# -- reading a learner's answer safely --------------------------------------------------


def as_number(exercise: str, value: Any, what: str) -> float | CheckResult:
    """``value`` as a finite float, or a failing :class:`CheckResult` that says why not.

    Rejects strings (even ``"256"``), booleans, None, arrays with more than one element,
    NaN and infinities, naming ``what`` was expected.

    >>> as_number("Ex", 3, "the cycle count")
    3.0
    >>> print(as_number("Ex", "256", "the cycle count"))
    [FAIL] Ex: the cycle count should be a number, but you gave the string '256'
      Hint: remove the quotes: 256, not "256"
    """
    if isinstance(value, NotWritten):
        return not_written(exercise)
    if isinstance(value, str):
        return fail(exercise, f"{what} should be a number, but you gave the string {value!r}",
                    hint=f'remove the quotes: {value}, not "{value}"')
    if value is None or isinstance(value, bool):
        return fail(exercise, f"{what} should be a number, but you gave {value!r}",
                    hint="return (or assign) the number itself")
    size = getattr(value, "size", None)
    if size is not None and size != 1:
        return fail(exercise, f"{what} should be one number, but you gave an array of shape "
                              f"{getattr(value, 'shape', '?')}",
                    hint="reduce it to a single number (or index the element you mean)")
    try:
        number = float(value.item() if size == 1 and hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return fail(exercise, f"{what} should be a number, but you gave a "
                              f"{type(value).__name__}: {value!r:.80}",
                    hint="return a plain int or float")
    if not math.isfinite(number):
        return fail(exercise, f"{what} is {number}, not a finite number",
                    hint="look for a division by zero or an overflow")
    return number


def is_number(value: Any) -> bool:
    """True when ``value`` is a real number (not a bool, not a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# -- the registry -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise of a lab: what it is called, how long it takes, what it needs.

    ``names`` are the variables (functions or values) of the learner's notebook that the
    checker takes, in order; ``needs`` is one of :data:`NEEDS`.
    """

    title: str
    minutes: int
    names: tuple[str, ...]
    check: Callable[..., CheckResult]
    needs: str = "cpu"
    kind: str = "write"  # "write", "transfer" (not shown in the chapter) or "predict"

    def unmet(self) -> str | None:
        """Why this runtime cannot grade the exercise, or None when it can."""
        if self.needs == "accelerator":
            from tpu_course import runtime

            platform = runtime.describe().platform
            if platform == "cpu":
                return ("needs a TPU or GPU runtime, and this one is a CPU "
                        "(Colab: Runtime > Change runtime type)")
        elif self.needs == "tpu-compiler":
            from tpu_course import hlo

            problem = hlo.tpu_compiler_problem()
            if problem:
                return f"needs the TPU compiler: {problem}"
        return None

    def run(self, *args: Any, **kwargs: Any) -> CheckResult:
        """The checker's verdict on ``args``; never raises."""
        reason = self.unmet()
        if reason:
            result = skipped(self.title, reason)
        elif any(isinstance(a, NotWritten) for a in (*args, *kwargs.values())):
            result = not_written(self.title)
        else:
            try:
                result = self.check(*args, **kwargs)
            except NotImplementedError:
                result = not_written(self.title)
            except Exception as err:  # noqa: BLE001 - a learner's answer may raise anything
                result = fail(self.title, f"checking your answer raised {type(err).__name__}: "
                                          f"{str(err)[:300]}",
                              hint="run your code on a small input yourself and look at "
                                   "what it returns (its type, its shape)")
            if not isinstance(result, CheckResult):  # a checker bug must not pass silently
                result = fail(self.title, f"the checker returned {type(result).__name__}")
        _LAST[self.title] = result
        return result

    def grade(self, namespace: Mapping[str, Any]) -> CheckResult:
        """Run the checker on the learner's objects looked up by name in ``namespace``."""
        missing = [n for n in self.names if n not in namespace]
        if missing:
            reason = self.unmet()
            if reason:
                return skipped(self.title, reason)
            return not_written(self.title, f"{', '.join(missing)} is not defined: run the "
                                           "exercise's cell")
        return self.run(*(namespace[n] for n in self.names))


class Lab:
    """The exercises of one lab, in order, with the scorecard that grades them all."""

    def __init__(self, number: int, title: str) -> None:
        self.number = number
        self.title = title
        self.exercises: list[Exercise] = []

    def exercise(self, title: str, *, minutes: int, names: tuple[str, ...] | str,
                 needs: str = "cpu", kind: str = "write") -> Callable[[Callable], Callable]:
        """Register a checker as this lab's next exercise; the returned function is the
        checker wrapped so that it never raises (see :meth:`Exercise.run`)."""
        if needs not in NEEDS:
            raise ValueError(f"needs={needs!r}: expected one of {NEEDS}")
        names = (names,) if isinstance(names, str) else tuple(names)

        def register(fn: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
            ex = Exercise(title, minutes, names, fn, needs, kind)
            self.exercises.append(ex)

            @functools.wraps(fn)
            def checked(*args: Any, **kwargs: Any) -> CheckResult:
                return ex.run(*args, **kwargs)

            checked.exercise = ex  # type: ignore[attr-defined]
            return checked

        return register

    @property
    def minutes(self) -> int:
        """The expected time of all exercises together."""
        return sum(e.minutes for e in self.exercises)

    def plan(self) -> str:
        """The lab's exercises with their minutes and needs, as a small text table."""
        width = max((len(e.title) for e in self.exercises), default=10)
        lines = [f"Lab {self.number}: {self.title}: {len(self.exercises)} exercises, "
                 f"about {self.minutes} minutes"]
        for e in self.exercises:
            need = "" if e.needs == "cpu" else f"  (needs {e.needs.replace('-', ' ')})"
            lines.append(f"  {e.title:<{width}}  {e.minutes:>3} min{need}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.plan()

    def grade(self, namespace: Mapping[str, Any]) -> list[CheckResult]:
        """Every exercise's verdict on what ``namespace`` holds."""
        return [e.grade(namespace) for e in self.exercises]

    def scorecard(self, namespace: Mapping[str, Any]) -> "Scorecard":
        """Re-run every checker on ``namespace`` (pass ``globals()``) and total the results."""
        return Scorecard(self, tuple(self.grade(namespace)))


@dataclasses.dataclass(frozen=True)
class Scorecard:
    """One line per exercise and the total: ``Lab N: k of M passed, S skipped``.

    M counts the exercises this runtime can grade; skipped ones are listed with the reason.
    """

    lab: Lab
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> int:
        return sum(r.status == PASSED for r in self.results)

    @property
    def gradable(self) -> int:
        return sum(r.status != SKIPPED for r in self.results)

    @property
    def skipped(self) -> int:
        return sum(r.status == SKIPPED for r in self.results)

    def total(self) -> str:
        text = f"Lab {self.lab.number}: {self.passed} of {self.gradable} passed"
        return text + (f", {self.skipped} skipped" if self.skipped else "")

    def __str__(self) -> str:
        width = max(len(r.exercise) for r in self.results) if self.results else 0
        lines = []
        for r in self.results:
            line = f"  {_MARKS[r.status]:<11} {r.exercise:<{width}}"
            if r.status in (SKIPPED, NOT_WRITTEN, FAILED):
                line += f"  {r.message[:110]}"
            lines.append(line.rstrip())
        return "\n".join([*lines, self.total()])

    def __repr__(self) -> str:
        return str(self)

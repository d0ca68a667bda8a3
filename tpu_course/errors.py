"""The course's own error types, and the checks that raise them.

Every error the package raises on purpose is a :class:`CourseError`, and also the
standard type that fits (``ValueError`` for a value out of range, ``TypeError`` for a
value of the wrong kind), so ``except ValueError`` keeps working. The message names the
argument or field at fault, what was given, what is valid, and what to do.

The checks below are the one place those messages are worded. Pure Python: the numpy-only
layer (``hardware``, ``systolic``, ``roofline``, ``comms``) uses them too.

>>> check_int("batch_size", 64, low=1, where="TrainConfig")
64
>>> check_int("batch_size", 64.0, low=1, where="TrainConfig")
Traceback (most recent call last):
...
tpu_course.errors.CourseTypeError: TrainConfig.batch_size=64.0: expected an integer >= 1, got a float. Write it without a decimal point (64).
>>> check_number("lr", float("nan"), low=0, low_open=True)
Traceback (most recent call last):
...
tpu_course.errors.CourseValueError: lr=nan: expected a finite number > 0.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable


class CourseError(Exception):
    """Base of every error the course raises on purpose (a learner can act on it)."""


class CourseValueError(CourseError, ValueError):
    """A value of the right kind but outside what is valid (negative, NaN, unknown name)."""


class CourseTypeError(CourseError, TypeError):
    """A value of the wrong kind (a string for a number, a float for a count)."""


def _label(name: str, where: str | None) -> str:
    return f"{where}.{name}" if where else name


def _kind(value: Any) -> str:
    return {bool: "a bool", float: "a float", str: "a string", int: "an integer"}.get(
        type(value), f"a {type(value).__name__}")


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")
    return " and ".join(parts)


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None,
              where: str | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]``, else a :class:`CourseError` naming ``name``.

    Accepts Python and numpy integers; refuses bools, floats (even ``64.0``) and strings.
    """
    label = _label(name, where)
    want = "an integer" + (f" {_range(low, high, False, False)}" if low is not None or
                           high is not None else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = ""
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            hint = f" Write it without a decimal point ({int(value)})."
        elif isinstance(value, str):
            hint = " Pass a number, not a string."
        raise CourseTypeError(f"{label}={value!r}: expected {want}, got {_kind(value)}.{hint}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise CourseValueError(f"{label}={value!r}: expected {want}.")
    return value


def check_number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False,
                 where: str | None = None) -> float:
    """``value`` as a finite ``float`` within the bounds, else a :class:`CourseError`.

    ``low_open`` / ``high_open`` exclude the bound itself (``low=0, low_open=True``: > 0).
    Refuses bools, strings, NaN and infinities.
    """
    label = _label(name, where)
    bounds = _range(low, high, low_open, high_open)
    want = "a finite number" + (f" {bounds}" if bounds else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = " Pass a number, not a string." if isinstance(value, str) else ""
        raise CourseTypeError(f"{label}={value!r}: expected {want}, got {_kind(value)}.{hint}")
    x = float(value)
    bad = not math.isfinite(x)
    bad = bad or (low is not None and (x < low or (low_open and x == low)))
    bad = bad or (high is not None and (x > high or (high_open and x == high)))
    if bad:
        raise CourseValueError(f"{label}={value!r}: expected {want}.")
    return x


def check_choice(name: str, value: Any, choices: Iterable[Any], *,
                 where: str | None = None) -> Any:
    """``value`` when it is one of ``choices``, else a :class:`CourseValueError` listing them."""
    allowed = list(choices)
    try:
        ok = value in allowed
    except TypeError:  # an unhashable or incomparable value
        ok = False
    if not ok:
        listing = ", ".join(repr(c) for c in allowed)
        raise CourseValueError(f"{_label(name, where)}={value!r}: expected one of {listing}.")
    return value

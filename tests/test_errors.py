"""``tpu_course.errors``: every message names the argument, the value, what is valid and
what to do; each error is also the standard type that fits."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_course import errors


def test_int_accepts_numpy_integers_and_refuses_floats_bools_strings():
    assert errors.check_int("n", np.int64(3), low=1) == 3
    with pytest.raises(TypeError, match=r"n=8\.0: .* Write it without a decimal point \(8\)"):
        errors.check_int("n", 8.0)
    with pytest.raises(errors.CourseTypeError, match="got a bool"):
        errors.check_int("n", True)
    with pytest.raises(errors.CourseTypeError, match="not a string"):
        errors.check_int("n", "8")
    with pytest.raises(ValueError, match=r"cfg\.n=0: expected an integer >= 1"):
        errors.check_int("n", 0, low=1, where="cfg")


@pytest.mark.parametrize("value, words", [
    (float("inf"), "finite"), (float("nan"), "finite"), (0.0, "> 0"), (1.5, "<= 1"),
])
def test_number_bounds_open_and_closed(value, words):
    with pytest.raises(errors.CourseValueError, match=words):
        errors.check_number("x", value, low=0, high=1, low_open=True)


def test_number_returns_a_float_and_choice_lists_the_options():
    assert errors.check_number("x", np.float32(0.5), low=0) == 0.5
    assert errors.check_choice("mode", "pad", ("drop", "pad")) == "pad"
    with pytest.raises(ValueError, match=r"mode='fill': expected one of 'drop', 'pad'"):
        errors.check_choice("mode", "fill", ("drop", "pad"))
    with pytest.raises(errors.CourseValueError, match="expected one of"):
        errors.check_choice("mode", ["unhashable"], {"drop": 1})

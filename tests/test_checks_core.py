"""The lab registry's one shape: derived names, validated kinds and titles, status-only
results, reveal keyed by lab, predictions locked before their answer shows, hidden inputs
for the grader, and the refusal of the course's own functions as answers."""

from __future__ import annotations

import ast
import functools
import pathlib

import re

import jax
import numpy as np
import pytest

from tpu_course import checks, errors, systolic
from tpu_course.checks import _core
from tpu_course.checks._core import (
    CheckResult, Lab, NotWritten, Verdict, as_number, course_code_used, fail, ok, refuse,
    refuse_course_code,
)

pytestmark = pytest.mark.stack_independent

CHECKS = pathlib.Path(checks.__file__).parent


def toy_lab(number: int = 90) -> Lab:
    lab = Lab(number, "Toy")

    @lab.exercise("Exercise 1 (double it)", minutes=5,
                  hidden=lambda rng: [(f"x = {x}", {"x": int(x)})
                                      for x in rng.integers(10, 1000, 3)])
    def check_double(double, x=3):
        got = as_number("Exercise 1 (double it)", double(x), "double(x)")
        if got != 2 * x:
            return fail("Exercise 1 (double it)", f"double({x}) is not {got:g}",
                        hint="multiply by two", answer=f"double({x}) = {2 * x}")
        return ok("Exercise 1 (double it)", "right")

    @lab.exercise("Exercise 2 (predict a sum)", minutes=5, kind="predict")
    def check_sum(predicted_sum, helper_not_graded=None):
        got = as_number("Exercise 2 (predict a sum)", predicted_sum, "your sum")
        if got != 10:
            refuse("Exercise 2 (predict a sum)", "that is not the sum", answer="the sum is 10")
        return ok("Exercise 2 (predict a sum)", "the sum is 10")

    lab.check_double, lab.check_sum = check_double, check_sum
    return lab


def test_names_come_from_the_checkers_signature():
    lab = toy_lab()
    assert [e.names for e in lab.exercises] == [("double",), ("predicted_sum",)]
    assert lab.exercises[1].predicts == ("predicted_sum",)
    for number in range(1, len(checks.LABS) + 1):  # every real registration derives names
        for e in checks.lab(number).exercises:
            assert e.names and all(not n.startswith("_") for n in e.names), e.title
            assert set(e.predicts) <= set(e.names)
            assert (e.kind == "predict") == bool(e.predicts), e.title


def test_registration_validates_kind_needs_points_and_title_scheme():
    lab = Lab(91, "Bad")
    with pytest.raises(ValueError, match="kind='guess'"):
        lab.exercise("Exercise 1 (x)", minutes=1, kind="guess")
    with pytest.raises(ValueError, match="needs="):
        lab.exercise("Exercise 1 (x)", minutes=1, needs="gpu")
    with pytest.raises(ValueError, match="points="):
        lab.exercise("Exercise 1 (x)", minutes=1, points=0)
    with pytest.raises(ValueError, match='"Exercise 1 '):
        lab.exercise("Ex 1", minutes=1)
    with pytest.raises(ValueError, match="predicts="):
        lab.exercise("Exercise 1 (x)", minutes=1, predicts=("a",))


def test_every_lab_uses_one_title_scheme_and_unique_titles():
    for number in range(1, len(checks.LABS) + 1):
        module = checks.lab(number)
        titles = [e.title for e in module.exercises]
        assert [t.split(" (")[0] for t in titles] == [f"Exercise {i}" for i in
                                                      range(1, len(titles) + 1)]
        chapter = getattr(checks, checks.LABS[number - 1])
        for i, title in enumerate(titles, 1):  # the constant is EXn, in every chapter
            assert getattr(chapter, f"EX{i}") == title


def test_check_result_has_one_source_of_truth():
    assert ok("E", "fine").passed and bool(ok("E", "fine"))
    assert not fail("E", "no").passed
    with pytest.raises(ValueError, match="status="):
        CheckResult("E", "maybe", "?")
    with pytest.raises((TypeError, ValueError)):
        CheckResult("E", True, "x", "passed")  # the old (passed, status) pair is gone


def test_early_exits_are_one_style_verdict():
    lab = toy_lab()
    r = lab.check_sum("10")
    assert r.status == "failed" and "string" in r.message
    r = lab.check_sum(NotWritten("Exercise 2"))
    assert r.status == "not written"
    r = lab.check_double(lambda x: 1 / 0)
    assert r.status == "failed" and "ZeroDivisionError" in r.message
    with pytest.raises(Verdict):
        as_number("E", float("nan"), "x")


def test_no_checker_module_returns_a_result_from_a_helper():
    """One style: helpers raise Verdict; nobody tests isinstance(..., CheckResult)."""
    for path in sorted(CHECKS.glob("ch0*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"
                    and "CheckResult" in ast.unparse(node.args[1])):
                pytest.fail(f"{path.name}:{node.lineno}: {ast.unparse(node)}: raise Verdict "
                            "(refuse, as_number) in the helper instead")


def test_reveal_is_keyed_by_lab_case_insensitive_and_waits_for_an_attempt(capsys):
    one, two = toy_lab(92), toy_lab(93)
    assert "not been checked" in checks.reveal("Exercise 1")
    one.check_double(NotWritten("Exercise 1"))
    assert "after an attempt" in checks.reveal("exercise 1")
    one.check_double("abc")  # failed on its type: nothing compared yet
    assert "could not be compared" in checks.reveal("Exercise 1")
    one.check_double(lambda x: x)
    assert "double(3) = 6" in checks.reveal("EXERCISE 1")
    two.check_double(lambda x: 2 * x)  # the lab checked last is the default
    assert "you passed" in checks.reveal(1)
    assert "double(3) = 6" in checks.reveal("Exercise 1", lab=92)
    assert "double(3) = 6" in one.reveal("Exercise 1 (double it)")
    # not a prefix match of Exercise 1; and no open lab has an Exercise 10
    assert "no lab open in this kernel has an exercise 'Exercise 10'" in checks.reveal(
        "Exercise 10")


def test_reveal_says_when_no_lab_has_that_exercise(capsys):
    lab = toy_lab(97)
    text = checks.reveal("Exercise 9")
    assert "no lab open in this kernel has an exercise 'Exercise 9'" in text
    assert "lab 97 has Exercise 1 to 2" in text and "not been checked" not in text
    assert "lab 97 has no exercise 'Exercise 3'" in checks.reveal("Exercise 3", lab=97)
    assert "reveal(None): name an exercise by its number or title" in checks.reveal(None)
    assert "not been checked" in lab.reveal("Exercise 2")  # it exists: no attempt yet


@pytest.mark.parametrize("number, want", [(1, 1), ("1", 1), (" 3 ", 3), (np.int64(2), 2)])
def test_lab_takes_the_number_also_as_text(number, want):
    assert checks.lab(number).number == want


@pytest.mark.parametrize("number, message", [
    ("one", "Pass the lab's number, e.g. checks.lab(1)"), (1.0, "Pass the lab's number"),
    (True, "Pass the lab's number"), (9, "the labs are 1 to 8"), ("0", "there is no lab '0'"),
])
def test_lab_refuses_what_is_no_lab_by_name(number, message):
    with pytest.raises(errors.CourseValueError, match=re.escape(message)):
        checks.lab(number)


class _RaisingFloat:
    def __float__(self):
        raise RuntimeError("my __float__ is broken")


@pytest.mark.parametrize("value, said", [
    (b"5", "you gave the bytes b'5'"),
    (bytearray(b"5"), "you gave the bytes"),
    (np.array(["5"]), "you gave the string '5' (inside a ndarray)"),
    (np.array("256"), "you gave the string '256'"),
    (np.array([b"5"]), "you gave the bytes b'5'"),
    pytest.param(10 ** 400, "too large for a float", id="10**400"),
    (_RaisingFloat(), "raised RuntimeError: my __float__ is broken"),
])
def test_as_number_refuses_text_and_what_cannot_be_a_float(value, said):
    with pytest.raises(Verdict) as stop:
        as_number("Exercise 1 (x)", value, "the count")
    assert stop.value.result.status == "failed"
    assert said in stop.value.result.message, stop.value.result.message


def test_as_number_still_takes_numbers_in_any_clothes():
    assert [as_number("E", v, "x") for v in (3, 2.5, np.float32(1.5), np.array([4]),
                                             np.int64(7), np.array(2.0))] == [3, 2.5, 1.5, 4, 7, 2]


def test_a_prediction_is_locked_once_the_measurement_is_shown(capsys):
    lab = toy_lab(94)
    assert not lab.predicted("Exercise 2")
    assert "once your prediction is recorded" in capsys.readouterr().out
    lab.predict("Exercise 2", NotWritten("Exercise 2"))
    assert "not written" in capsys.readouterr().out and not lab.predicted(2)
    lab.predict("Exercise 2", 12)
    lab.predict("Exercise 2", 11)  # may change before the measurement shows
    assert lab.predicted("exercise 2")
    lab.predict("Exercise 2", 10)  # after: refused
    assert "locked" in capsys.readouterr().out
    r = lab.check_sum(10)  # edited after seeing the answer: the locked 11 is graded
    assert not r and "recorded before the measurement" in r.message
    card = lab.scorecard({"double": lambda x: 2 * x, "predicted_sum": 10})
    assert [x.status for x in card.results] == ["passed", "failed"]
    with pytest.raises(ValueError, match="not a prediction"):
        lab.predict("Exercise 1", 3)
    with pytest.raises(TypeError, match="takes 1 value"):
        lab.predict("Exercise 2", 3, 4)
    with pytest.raises(ValueError, match="no exercise"):
        lab.predicted("Exercise 9")


def test_without_a_recorded_prediction_the_check_grades_its_argument():
    lab = toy_lab(95)
    assert lab.check_sum(10) and not lab.check_sum(11)


def test_hidden_inputs_are_seeded_per_learner_and_name_the_input_not_the_answer():
    lab = toy_lab(96)
    honest = {"double": lambda x: x + x, "predicted_sum": 10}
    only_three = {"double": lambda x: 6 if x == 3 else 0, "predicted_sum": 10}
    assert [r.status for r in lab.grade(only_three)] == ["passed", "passed"]  # visible only
    seed = checks.grading_seed("ada", 96)
    graded = lab.grade(only_three, seed=seed)
    assert graded[0].status == "failed" and "does not show (x = " in graded[0].message
    assert not graded[0].answer
    assert lab.grade(only_three, seed=seed)[0].message == graded[0].message  # a regrade
    assert all(lab.grade(honest, seed=seed))
    assert "unseen" in lab.grade(honest, seed=seed)[0].message
    assert checks.grading_seed("ada", 1) != checks.grading_seed("ada", 2)


def test_points_default_to_one_and_add_up():
    lab = Lab(97, "Points")
    lab.exercise("Exercise 1 (a)", minutes=1, points=3)(lambda a: ok("Exercise 1 (a)"))
    lab.exercise("Exercise 2 (b)", minutes=1)(lambda b: ok("Exercise 2 (b)"))
    assert [e.points for e in lab.exercises] == [3, 1] and lab.points == 4


# -- the course's own functions -----------------------------------------------------------

def _helper(m, k, n, r, c):
    return systolic.cycle_count(m, k, n, r, c, "ws")


def test_course_code_is_found_directly_and_through_wrappers_and_helpers():
    ref = systolic.cycle_count
    assert course_code_used(ref, [ref]) is ref
    assert course_code_used(functools.partial(ref, dataflow="ws"), [ref]) is ref
    assert course_code_used(functools.partial(lambda f, *a: f(*a), ref), [ref]) is ref
    assert course_code_used(lambda *a: systolic.cycle_count(*a), [ref]) is ref
    assert course_code_used(lambda *a: _helper(*a), [ref]) is ref  # a helper of the learner's
    cc = systolic.cycle_count
    assert course_code_used(lambda *a: cc(*a), [ref]) is ref  # a closure / global alias

    def outer(*a):
        def inner():
            return ref(*a)
        return inner()

    assert course_code_used(outer, [ref]) is ref

    class Answer:
        def __call__(self, *a):
            return _helper(*a)

    assert course_code_used(Answer(), [ref]) is ref
    assert course_code_used(jax.jit(lambda x: _helper(x, 1, 1, 1, 1)), [ref]) is ref


def test_honest_code_and_library_internals_are_not_flagged():
    ref = systolic.cycle_count

    def honest(m, k, n, r, c):
        return r + (-(-k // r) * -(-n // c) - 1) * max(m, r) + m + r + c - 2

    assert course_code_used(honest, [ref]) is None
    # simulate is allowed, even though the course's simulate may use cycle_count inside
    assert course_code_used(lambda a, b: systolic.simulate(a, b, 4, 4), [ref]) is None
    assert course_code_used(lambda x: jax.numpy.dot(x, x), [ref]) is None
    assert course_code_used(42, [ref]) is None


def test_refusal_says_write_it_yourself():
    with pytest.raises(Verdict) as stop:
        refuse_course_code("Exercise 4 (choose)", lambda *a: _helper(*a), systolic.cycle_count)
    assert "course's own function" in stop.value.result.message
    assert "write this yourself" in stop.value.result.hint


def test_names_used_finds_compiler_calls_in_the_learners_code_only():
    def asks(f, *a):
        return jax.jit(f).lower(*a).compile().cost_analysis()

    def via_helper(*a):
        return asks(*a)

    def reasoned(m, k, n):
        return 2 * m * k * n

    assert _core.names_used(via_helper, {"cost_analysis", "compile"}) == "compile"
    assert _core.names_used(reasoned, {"cost_analysis"}) is None
    assert _core.names_used(lambda x: jax.numpy.sum(x), {"compile"}) is None  # jax's inside


def test_each_lab_has_one_title_in_its_registry_and_its_notebooks():
    root = CHECKS.parent.parent
    for number in range(1, len(checks.LABS) + 1):
        title = checks.lab(number).title
        for folder, heading in (("solutions", f"# # Lab {number} (solution): {title}"),
                                ("labs", f"# # Lab {number}: {title}")):
            (twin,) = (root / folder).glob(f"{number:02d}_*.py")
            first = next(ln for ln in twin.read_text().splitlines() if ln.startswith("# # Lab"))
            assert first == heading, f"{twin.name}: {first!r} but the registry says {title!r}"


def test_learner_globals_are_the_learners_namespaces_only():
    found = _core.learner_globals(lambda *a: _helper(*a))
    assert found == [globals()]  # this module's, once, reached through the helper
    assert _core.learner_globals(jax.numpy.dot) == []

"""The assessment engine: declarations validated, outputs as plain data and back, a verdict
that names the known mistake from outputs alone, predictions locked, the scorecard,
reveal, and the wheel holding no keys."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import grading
from tpu_course import checks
from tpu_course.checks import engine
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, NotWritten

pytestmark = pytest.mark.stack_independent

ROOT = pathlib.Path(__file__).resolve().parent.parent


def toy() -> tuple[Lab, Exercise, grading.Key]:
    lab = Lab(90, "Toy")
    check = lab.add(Exercise("Exercise 1 (double it)", minutes=5, provides=("double",),
                             cases=(Case("x = 3", {"x": 3}),), expect=lambda c: 2 * c.args["x"],
                             hint="multiply by two"))
    lab.add(Exercise("Exercise 2 (predict a sum)", minutes=5, kind="predict",
                     provides=("predicted_sum",), probe=engine.values,
                     expect=lambda c: 10, compare=engine.close(0.01)))
    key = grading.Key(hidden=lambda rng: [Case(f"x = {x}", {"x": int(x)})
                                          for x in rng.integers(10, 1000, 3)],
                      mistakes=[Mistake("you squared it", lambda x: x * x),
                                Mistake("you added one", when=lambda got, want, c: got == want - c.args["x"] + 1)])
    return lab, check.exercise, key


def test_declarations_are_validated():
    lab = Lab(91, "Bad")
    with pytest.raises(ValueError, match="Exercise 1"):
        lab.add(Exercise("double it", minutes=1, provides=("f",)))
    with pytest.raises(ValueError, match="kind"):
        Exercise("Exercise 1 (x)", minutes=1, provides=("f",), kind="guess")
    with pytest.raises(ValueError, match="needs"):
        Exercise("Exercise 1 (x)", minutes=1, provides=("f",), needs="quantum")


@pytest.mark.parametrize("value", [
    3, 2.5, None, True, "text", (1, [2.0, {"a": np.int64(3)}]), np.arange(6).reshape(2, 3),
    np.float32(1.5), {(1, 2): "tuple key"}, float("nan"),
])
def test_plain_data_goes_through_json_and_back(value):
    back = engine.loads(engine.dumps(value))
    want = engine.plain(value)
    if isinstance(want, np.ndarray):
        assert back.dtype == want.dtype and np.array_equal(back, want)
    elif isinstance(want, float) and want != want:
        assert back != back
    else:
        assert back == want


def test_objects_are_never_plain_data_and_bad_records_stay_strings():
    assert engine.plain(print) == "<a builtin_function_or_method object>"
    assert engine.plain(np.array([object()], dtype=object)).startswith("<a ")
    assert engine.decode({"__array__": "object", "shape": [1], "b64": ""}).startswith("<unreadable")
    assert engine.decode({"__pickle__": "gASV"}).startswith("<unreadable")
    import ml_dtypes

    bf = np.arange(3, dtype=ml_dtypes.bfloat16)
    assert engine.loads(engine.dumps(bf)).dtype == bf.dtype


def test_a_verdict_names_the_mistake_from_outputs_alone():
    lab, ex, key = toy()
    assert grading.check(ex, key, lambda x: x + x, np.random.default_rng(0)).passed
    squared = grading.check(ex, key, lambda x: x ** 2, np.random.default_rng(0))
    assert squared.status == "failed" and squared.hint == "you squared it"
    plus_one = grading.check(ex, key, lambda x: x + 1, np.random.default_rng(0))
    assert plus_one.hint == "you added one"
    other = grading.check(ex, key, lambda x: 7, np.random.default_rng(0))
    assert other.hint == "multiply by two"
    # Right on the notebook's case, wrong on hidden ones: says which kind of input failed.
    only_three = grading.check(ex, key, lambda x: 6, np.random.default_rng(0))
    assert "does not show" in only_three.message and "x = " in only_three.message


@pytest.mark.parametrize(("answer", "said"), [
    (lambda x: "6", "string"),
    (lambda x: None, "one number"),
    (lambda x: np.array([6, 6]), "shape"),
    (lambda x: 1 / 0, "ZeroDivisionError"),
    (lambda x: float("inf"), "not a finite"),
    (NotWritten("Exercise 1"), "not written"),
])
def test_wrong_kinds_of_answers_get_a_clear_verdict_never_a_traceback(answer, said):
    lab, ex, key = toy()
    result = ex.check(answer)
    assert result.status in ("failed", "not written") and said in str(result), result
    assert "Traceback" not in str(result)


def test_an_endless_loop_is_stopped():
    lab = Lab(92, "Loop")
    check = lab.add(Exercise("Exercise 1 (loop)", minutes=1, provides=("f",),
                             expect=lambda c: 1, time_limit_s=0.5))

    def forever():
        while True:
            pass

    result = check(forever)
    assert result.status == "failed" and "more than 0.5 s" in result.message


def test_a_prediction_is_locked_once_the_measurement_is_shown(capsys):
    lab, ex, key = toy()
    check_sum = lab.exercises[1]
    lab.predict("Exercise 2", 9)
    lab.predict("Exercise 2", 10)  # may change until the measurement
    assert lab.predicted("Exercise 2")
    lab.predict("Exercise 2", 11)
    assert "locked" in capsys.readouterr().out
    result = check_sum.check(11)  # the value changed after the measurement
    assert result.passed and "recorded before" in result.message


def test_scorecard_reveal_and_the_feedback_line(capsys):
    lab, ex, key = toy()
    card = lab.scorecard({"double": lambda x: 3 * x})
    text = str(card)
    assert card.total() == "Lab 90: 0 of 2 passed" and "feedback for you" in text
    assert "grading runs your notebook again" in " ".join(text.split())
    capsys.readouterr()
    assert "6" in checks.reveal(1, lab=90)
    lab.scorecard({"double": lambda x: 2 * x, "predicted_sum": 10})
    assert "nothing to reveal" in checks.reveal("exercise 1", lab=90)


def test_in_a_grading_run_the_notebook_checks_do_not_run_the_learners_code(monkeypatch):
    lab, ex, key = toy()
    calls = []

    def double(x):
        calls.append(x)
        return 2 * x

    assert ex.check(double).passed and calls == [3]
    monkeypatch.setenv(engine.GRADING_RUN, "a-token")  # what the grader's worker sets
    card = lab.scorecard({"double": double, "predicted_sum": 10})
    assert calls == [3] and card.skipped == 2 and card.total() == "Lab 90: 0 of 0 passed, 2 skipped"
    assert "cases of its own" in ex.check(double).message


def test_hidden_cases_come_from_the_secret_not_the_file_name():
    _, ex, key = toy()
    a = grading.cases_for(ex, key, grading.rng_for("s1", "ada", 90, ex.title))
    b = grading.cases_for(ex, key, grading.rng_for("s2", "ada", 90, ex.title))
    c = grading.cases_for(ex, key, grading.rng_for("s1", "ada", 90, ex.title))
    assert a == c and a != b and a[0] == ex.cases[0]


def test_every_lab_has_one_title_scheme_and_visible_data_for_its_cases():
    for number in range(1, len(checks.LABS) + 1):
        lab = checks.lab(number)
        titles = [e.title for e in lab.exercises]
        assert len(set(titles)) == len(titles)
        for i, e in enumerate(lab.exercises, 1):
            assert e.title.startswith(f"Exercise {i} (") and e.provides


def test_no_key_module_is_in_the_package():
    package = ROOT / "tpu_course"
    assert not (package / "checks" / "_answers").exists()
    assert not any("grading" in p.parts for p in package.rglob("*.py"))


@pytest.mark.slow
def test_the_built_wheel_holds_no_answer_keys(tmp_path):
    # sdist first, the wheel from it: what pip builds, never a stale build/ folder's files
    proc = subprocess.run([sys.executable, "-m", "uv", "build", "-q", "--out-dir",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("tpu_course-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("tpu_course/checks/visible/") for n in names)
    assert not [n for n in names if n.startswith("grading/") or "_answers" in n], names
    body = "\n".join(zipfile.ZipFile(wheel).read(n).decode(errors="replace")
                     for n in names if n.startswith("tpu_course/checks/"))
    for reference in ("def make_cycle", "def make_tiled", "KEYS = {"):
        assert reference not in body

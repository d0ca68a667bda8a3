"""What every lab's mistakes test shares: each known mistake and each honest solution fed
through the grading path (visible and hidden cases) and the notebook's check."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

import grading
from tpu_course import checks
from tpu_course.checks import engine

#: The hidden cases of these tests come from a fixed secret (an instructor's is random).
SECRET = "tests"


def mistakes(lab: int, only: Sequence[int] | None = None) -> list[Any]:
    """One pytest param per known mistake of lab ``lab`` (of its exercises numbered in
    ``only``, else all) given as a wrong answer (marked ``mistake``: the checker's logic,
    which the Colab line need not run again)."""
    params = []
    for ex in checks.lab(lab).exercises:
        if only is not None and int(engine.short(ex.title).split()[-1]) not in only:
            continue
        key = grading.keys(lab).get(engine.short(ex.title), grading.Key())
        for i, m in enumerate(key.mistakes):
            if m.answer is not None:
                params.append(pytest.param(ex, key, m, id=f"{engine.short(ex.title)}-{i}",
                                           marks=pytest.mark.mistake))
    return params


def graded(lab: int, title: str, answer: Any, learner: str = "someone") -> engine.CheckResult:
    """``answer`` graded as ``tpu-course grade`` grades it: visible and hidden cases."""
    ex = checks.lab(lab).find(title)
    key = grading.keys(lab).get(engine.short(ex.title), grading.Key())
    return grading.check(ex, key, answer, grading.rng_for(SECRET, learner, lab, ex.title))


def assert_passes(lab: int, title: str, answer: Any) -> None:
    """An honest answer passes grading and the notebook's check."""
    result = graded(lab, title, answer)
    assert result.passed, result
    ex = checks.lab(lab).find(title)
    notebook = ex.check(**grading.as_answer(ex, answer))
    assert notebook.passed, notebook


def assert_mistake_named(ex: engine.Exercise, key: grading.Key, mistake: engine.Mistake) -> None:
    """A known mistake fails grading with its own hint, and the notebook's check with its
    hint where a visible case shows the mistake."""
    result = grading.check(ex, key, mistake.answer, grading.rng_for(SECRET, "m", ex.lab, ex.title))
    assert result.status == "failed", result
    assert result.hint == mistake.hint, result
    notebook = ex.check(**grading.as_answer(ex, mistake.answer))
    if notebook.status == "failed" and "not show" not in notebook.message:
        assert notebook.hint in (mistake.hint, ex.hint) or any(
            notebook.hint == m.hint for m in key.mistakes), notebook


def failed(result: engine.CheckResult, *words: str) -> None:
    """``result`` is a failure whose message or hint says every one of ``words``, in the
    learner's words: no traceback, no path into site-packages."""
    assert result.status == "failed", result
    text = f"{result.message} / {result.hint}"
    assert all(w in text for w in words), result
    assert "Traceback" not in text and "site-packages" not in text, result

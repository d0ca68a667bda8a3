"""What only grading needs: references, hidden cases and known mistakes, one module per lab.

This folder is part of the repository, not of the package learners install (a test holds
the built wheel free of it). ``grading/chNN.py`` holds ``KEYS``: for each exercise of
``tpu_course.checks.chNN.LAB`` (by its short title, ``"Exercise 1"``) a :class:`Key` with
the reference (what a right answer provides: the function, or the values), the hidden
cases drawn from a seed, and the known mistakes, each a wrong answer (or a rule on the
outputs) with the hint that names it. The exercise's public half (what it provides, the
visible cases, the probe, the comparison) is its declaration in the package.

``python -m grading build`` stores what the notebook's checks need of the keys for the
visible cases (the expected outputs and each mistake's output) in
``tpu_course/checks/visible/chNN.json``; ``python -m grading check`` says whether that is
current. The grader (``tpu-course grade``) loads this folder from the checkout it runs in,
or from ``--keys DIR``.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import hashlib
import importlib
import json
import math
import sys
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tpu_course import checks
from tpu_course.checks import engine
from tpu_course.checks.engine import Case, Exercise, Mistake


@dataclasses.dataclass(frozen=True)
class Key:
    """The grading half of one exercise: ``reference`` (a right answer, shaped as the
    learner provides it), ``hidden(rng)`` (cases the notebook does not show), ``mistakes``."""

    reference: Any = None
    hidden: Callable[[np.random.Generator], Sequence[Case]] | None = None
    mistakes: Sequence[Mistake] = ()


def keys(lab: int) -> dict[str, Key]:
    """Lab ``lab``'s keys by short title."""
    return importlib.import_module(f"{__name__}.ch{lab:02d}").KEYS


def as_answer(exercise: Exercise, answer: Any) -> dict[str, Any]:
    """``answer`` as the learner's names: a mapping of them, one object for a one-name
    exercise, or a tuple in the declared order."""
    names = exercise.provides
    if isinstance(answer, Mapping) and set(answer) == set(names):
        return dict(answer)
    if len(names) == 1:
        return {names[0]: answer}
    if isinstance(answer, tuple) and len(answer) == len(names):
        return dict(zip(names, answer))
    raise TypeError(f"{exercise.title}: an answer must provide {names}, not {answer!r:.80}")


def rng_for(secret: str, learner: str, lab: int, title: str) -> np.random.Generator:
    """The hidden cases' generator: from the instructor's secret, never from file names."""
    digest = hashlib.sha256("\0".join([secret, learner, str(lab),
                                       engine.short(title)]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def cases_for(exercise: Exercise, key: Key, rng: np.random.Generator | None) -> list[Case]:
    """The visible cases, then (with ``rng``) the hidden ones."""
    hidden = list(key.hidden(rng)) if rng is not None and key.hidden is not None else []
    return [*exercise.cases, *hidden]


def _output(exercise: Exercise, answer: Any, case: Case) -> Any:
    """``answer``'s output on ``case`` (a :class:`~engine.Raised` when it raised)."""
    try:
        (got,) = exercise.run(as_answer(exercise, answer), [case])
    except NotImplementedError as err:
        return engine.Raised("NotImplementedError", str(err))
    return got


def expected(exercise: Exercise, key: Key, cases: Sequence[Case], *, wants: bool = True
             ) -> tuple[list[Any], list[list[tuple[Mistake, Any]]]]:
    """The expected output of each case (``wants=False``: None, not computed) and each
    mistake's output on it (``NO_OUTPUT`` for a rule), computed here, in the grader's
    process, from the reference and the instrument."""
    if not wants:
        wants = [None] * len(cases)
    elif exercise.expect is not None:
        wants = [_remembered(exercise, exercise.expect, c,
                             lambda c: engine.plain(exercise.expect(c))) for c in cases]
    else:
        wants = [_remembered(exercise, key.reference, c,
                             lambda c: _output(exercise, key.reference, c)) for c in cases]
    known = [*exercise.rules, *key.mistakes]

    def row(c: Case) -> list[tuple[Mistake, Any]]:
        return [(m, engine.NO_OUTPUT if m.answer is None else _remembered(
            exercise, m.answer, c, lambda c, m=m: _output(exercise, m.answer, c)))
                for m in known]
    return wants, _Rows(row, cases)


class _Rows(collections.abc.Sequence):
    """``[row(case) for case in cases]``, each row computed when it is first read: a
    verdict reads the mistakes' outputs only to name a wrong answer, so a right one costs
    no run of the mistakes."""

    def __init__(self, row: Callable[[Case], list], cases: Sequence[Case]) -> None:
        self._row, self._cases, self._done = row, list(cases), {}

    def __len__(self) -> int:
        return len(self._cases)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # an IndexError past the end, as a list's
        if i not in self._done:
            self._done[i] = self._row(self._cases[i])
        return self._done[i]


# Each reference's and mistake's output on a case, computed once per process: a room of
# submissions (and the tests) meet the same visible cases and the same hidden seeds again.
_OUTPUTS: dict[tuple, tuple[Any, Any]] = {}


def _remembered(exercise: Exercise, source: Any, case: Case, compute: Callable) -> Any:
    """``compute(case)``, remembered by exercise, ``source`` (the function that makes the
    output) and the case's contents; cases that cannot be fingerprinted are not kept."""
    fingerprint = _fingerprint((case.label, case.args))
    if fingerprint is None:
        return compute(case)
    key = (exercise.title, id(source), fingerprint)
    kept = _OUTPUTS.get(key)
    if kept is not None and kept[0] is source:  # held, so its id cannot be reused
        return kept[1]
    output = compute(case)
    _OUTPUTS[key] = (source, output)
    return output


def _fingerprint(value: Any) -> str | None:
    """A text that differs whenever ``value``'s contents differ, or None where it cannot
    tell (an object whose repr is its address)."""
    if isinstance(value, (list, tuple)):
        parts = [_fingerprint(v) for v in value]
        return None if None in parts else f"{type(value).__name__}[{','.join(parts)}]"
    if isinstance(value, dict):
        parts = [(_fingerprint(k), _fingerprint(v)) for k, v in value.items()]
        return None if any(None in p for p in parts) else f"dict{parts}"
    if isinstance(value, np.ndarray) or type(value).__module__.startswith(("jax", "jaxlib")):
        try:
            array = np.asarray(value)
        except Exception:  # noqa: BLE001 - a tracer, an abstract value
            return None
        if array.dtype.kind not in "biufc?" and array.dtype.name != "bfloat16":
            return None
        digest = hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()
        return f"array({array.dtype.name},{array.shape},{digest})"
    text = repr(value)
    return None if " at 0x" in text else f"{type(value).__name__}:{text}"


def grade(exercise: Exercise, key: Key, outputs: Sequence[Any], cases: Sequence[Case]
          ) -> engine.CheckResult:
    """The verdict on a submission's outputs (plain data) over ``cases``."""
    reason = exercise.unmet()
    if reason:
        return engine.skipped(exercise.title, reason)
    if len(outputs) != len(cases):
        return engine.fail(exercise.title, f"the submission returned {len(outputs)} outputs "
                                           f"for {len(cases)} inputs")
    wants, mistakes = expected(exercise, key, cases)
    return engine.judge(exercise, cases, outputs, wants, mistakes,
                        hidden_from=len(exercise.cases))


def check(exercise: Exercise, key: Key, answer: Any, rng: np.random.Generator | None = None
          ) -> engine.CheckResult:
    """Grade ``answer`` (trusted code: a key's reference or mistake, a test's honest
    solution) in this process, on the visible cases and, with ``rng``, hidden ones."""
    cases = cases_for(exercise, key, rng)

    def run(case: Case) -> Any:
        (got,) = exercise.run(as_answer(exercise, answer), [case])
        return got
    try:  # a key's own mistake, graded as a submission, runs once per case and process
        outputs = [_remembered(exercise, answer, c, run) for c in cases]
    except NotImplementedError:
        return engine.not_written(exercise.title)
    return grade(exercise, key, outputs, cases)


# -- the visible cases' stored data --------------------------------------------------------


def visible_data(lab: int) -> dict:
    """What lab ``lab``'s notebook checks need of the keys (see the module docstring)."""
    registry = checks.lab(lab)
    table = keys(lab)
    unknown = set(table) - {engine.short(e.title) for e in registry.exercises}
    if unknown:
        raise KeyError(f"grading/ch{lab:02d}.py has keys for no exercise: {sorted(unknown)}")
    data = {}
    for ex in registry.exercises:
        key = table.get(engine.short(ex.title), Key())
        if ex.expect is None and ex.kind == "predict":
            raise ValueError(f"{ex.title}: a prediction's expected value must come from an "
                             "instrument (expect=), or the wheel would hold its answer")
        wants, mistakes = expected(ex, key, ex.cases, wants=ex.expect is None)
        entry = {"mistakes": [[[m.hint, _NO if m.answer is None or (
            isinstance(out, engine.Raised) and out.kind != "Wrong") else engine.encode(out)]
            for m, out in per] for per in mistakes]}
        if ex.expect is None:
            failed = [w for w in wants if isinstance(w, engine.Raised)]
            if failed:
                raise ValueError(f"{ex.title}: the reference failed on a visible case: "
                                 f"{failed[0]}")
            entry["wants"] = [engine.encode(w) for w in wants]
        else:
            entry["wants"] = [None] * len(ex.cases)
        data[ex.title] = entry
    return data


#: A mistake with no output to store on a case (a rule, or a mistake that crashed there).
_NO = engine.STORED_NO_OUTPUT


def _path(lab: int):
    return engine.VISIBLE / f"ch{lab:02d}.json"


def build(labs: Sequence[int]) -> None:
    engine.VISIBLE.mkdir(exist_ok=True)
    for lab in labs:
        _path(lab).write_text(json.dumps(visible_data(lab), indent=1, sort_keys=True) + "\n")
        print(f"wrote {_path(lab)}")


def stale(labs: Sequence[int]) -> list[int]:
    """The labs whose stored visible data differ from what the keys give now."""
    out = []
    for lab in labs:
        try:
            stored = json.loads(_path(lab).read_text())
        except (OSError, ValueError):
            stored = None
        if not _same(stored, json.loads(json.dumps(visible_data(lab), sort_keys=True))):
            out.append(lab)
    return out


def _same(stored: Any, now: Any) -> bool:
    """Stored and recomputed visible data agree: exactly, except floats (loose and inside
    arrays), which may differ in the last bits from one jax or XLA version to the next."""
    if isinstance(stored, dict) and isinstance(now, dict) and "__array__" in stored:
        a, b = engine.decode(stored), engine.decode(now)
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return a == b
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind not in "fc" and a.dtype.name != "bfloat16":
            return bool(np.array_equal(a, b))
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        return bool(np.allclose(a.astype(wide), b.astype(wide), rtol=1e-3, atol=1e-5,
                                equal_nan=True))
    if isinstance(stored, dict) and isinstance(now, dict):
        return stored.keys() == now.keys() and all(_same(stored[k], now[k]) for k in stored)
    if isinstance(stored, list) and isinstance(now, list):
        return len(stored) == len(now) and all(map(_same, stored, now))
    if isinstance(stored, float) and isinstance(now, (int, float)) and not isinstance(now, bool):
        return math.isclose(stored, now, rel_tol=1e-3, abs_tol=1e-5)
    return stored == now


def ported() -> list[int]:
    """The labs that have keys here."""
    return [n for n in range(1, len(checks.LABS) + 1)
            if importlib.util.find_spec(f"{__name__}.ch{n:02d}") is not None]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "check"
    labs = [int(a) for a in args[1:]] or ported()
    if command == "build":
        build(labs)
        return 0
    bad = stale(labs)
    if bad:
        print(f"stale visible data for labs {bad}: run python -m grading build")
        return 1
    print("visible data current for labs", labs)
    return 0

"""What every lab checker is built from: the verdict, the exercise registry, the scorecard.

A lab is a :class:`Lab` (one per chapter, ``checks.chNN.LAB``) holding its
:class:`Exercise` entries: title, minutes, points, what the exercise needs (any runtime,
an accelerator, the TPU compiler), its kind, and the checker. A checker is registered
with :meth:`Lab.exercise`; the learner's names it grades are the checker's parameters
without a default, so a registration never repeats them. The registered function is
wrapped so that it never raises: an unwritten exercise, a learner's exception, a wrong
type or a string where a number belongs all become a :class:`CheckResult` that says what
happened.

One style inside a checker: it returns its verdict at the end (:func:`ok`, :func:`fail`),
and anything that ends it early (a value of the wrong type, a mistake found half-way, the
course's own function handed in as an answer) raises :class:`Verdict` with that result,
as :func:`as_number`, :func:`refuse` and :func:`refuse_course_code` do.

The same registry serves every reader: the check cell after each exercise, the
scorecard at the end of a lab (:meth:`Lab.scorecard`), :func:`reveal`, the lab's plan,
the workshop agendas and the instructor's grader (:meth:`Lab.grade` with a seed, which
also checks every written function on inputs the notebook never shows).

Predictions are locked before their answer shows: :meth:`Lab.predict` records one (it
may be replaced until then), :meth:`Lab.predicted` opens the measurement and locks it,
and the check grades the locked prediction, not a value edited after the answer was on
the screen. The grader re-runs the notebook, so it grades the value in the cell.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
import hashlib
import html
import inspect
import math
import numbers
import sys
import textwrap
import types
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Sequence

PASSED, FAILED, NOT_WRITTEN, SKIPPED = "passed", "failed", "not written", "skipped"
STATUSES = (PASSED, FAILED, NOT_WRITTEN, SKIPPED)
_MARKS = {PASSED: "PASS", FAILED: "FAIL", NOT_WRITTEN: "NOT WRITTEN", SKIPPED: "SKIPPED"}
_COLOURS = {PASSED: "#1a7f37", FAILED: "#cf222e", NOT_WRITTEN: "#9a6700", SKIPPED: "#57606a"}

#: What an exercise can need from the runtime, and how to tell whether it is there.
NEEDS = ("cpu", "accelerator", "tpu-chip", "tpu-compiler")
#: What an exercise asks: code the chapter taught ("write"), the chapter's idea applied to
#: a case it did not show ("apply"), or a number before it is measured ("predict").
#: ("apply", not "transfer": chapter 2's ``transfer`` is host-device copying.)
KINDS = ("write", "apply", "predict")
#: The widest line the plain-text views print (a notebook's code column, CONTRIBUTING).
WIDTH = 88

#: The last result of each exercise, keyed by (lab number, title), for :func:`reveal`.
from tpu_course.checks.engine import _LAST  # noqa: E402  (one registry for reveal)
#: Predictions recorded in this kernel, keyed by (lab number, title): the values and
#: whether the measurement has been shown (then they are locked).
_PREDICTIONS: dict[tuple[int, str], "_Prediction"] = {}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise.

    ``status`` is ``"passed"``, ``"failed"``, ``"not written"`` or ``"skipped"``;
    ``message`` says why; on a failure ``hint`` points at the mistake without giving the
    answer, and ``answer`` (the expected value) is shown only by :func:`reveal`.
    ``bool(result)`` and ``result.passed`` are True only for a pass.
    """

    exercise: str
    status: str
    message: str
    hint: str = ""
    answer: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}: expected one of {STATUSES}")

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        text = f"[{_MARKS[self.status]}] {self.exercise}: {self.message}"
        if self.hint:
            text += f"\n  Hint: {self.hint}"
        if self.answer:
            text += f'\n  (checks.reveal("{_short(self.exercise)}") shows the expected answer)'
        return text

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        colour = _COLOURS[self.status]
        mark = {PASSED: "&#10004; pass", FAILED: "&#10008; not yet"}.get(
            self.status, html.escape(self.status))
        extra = f"<br><i>Hint:</i> {html.escape(self.hint)}" if self.hint else ""
        if self.answer:
            extra += (f'<br><small>checks.reveal("{html.escape(_short(self.exercise))}") shows '
                      "the expected answer</small>")
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


def _short(title: str) -> str:
    """``"Exercise 2 (predict a GEMM)"`` -> ``"Exercise 2"``."""
    return title.split(" (")[0]


def ok(exercise: str, message: str = "correct") -> CheckResult:
    """A passing result."""
    return CheckResult(exercise, PASSED, message)


def fail(exercise: str, message: str, *, hint: str = "", answer: str = "") -> CheckResult:
    """A failing result: ``message`` says what is wrong (not the answer), ``hint`` where to
    look, ``answer`` the expected value, shown only when the learner asks (:func:`reveal`)."""
    return CheckResult(exercise, FAILED, message, hint, answer)


def not_written(exercise: str, detail: str = "") -> CheckResult:
    """The learner has not written this exercise yet (a stub is still in place)."""
    message = "not written yet" + (f": {detail}" if detail else "")
    return CheckResult(exercise, NOT_WRITTEN, message)


def skipped(exercise: str, reason: str) -> CheckResult:
    """This runtime cannot grade the exercise; ``reason`` says what it needs."""
    return CheckResult(exercise, SKIPPED, f"skipped: {reason}")


class Verdict(Exception):
    """Ends a checker early with ``result``: the one way a checker stops before its end.

    The registry's wrapper (:meth:`Exercise.run`) turns it into the checker's return value.
    """

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


def refuse(exercise: str, message: str, *, hint: str = "", answer: str = "") -> NoReturn:
    """End the checker with a failure (raises :class:`Verdict`)."""
    raise Verdict(fail(exercise, message, hint=hint, answer=answer))


def close_enough(got: float, want: float, rel: float) -> bool:
    """True when ``got`` is within a relative tolerance ``rel`` of ``want``.

    >>> close_enough(101.0, 100.0, 0.02), close_enough(110.0, 100.0, 0.05)
    (True, False)
    """
    return abs(got - want) <= rel * abs(want)


def _title_matches(query: Any, title: str) -> bool:
    """``"exercise 2"``, ``"Exercise 2"``, ``2`` or the whole title name exercise 2 (and
    not exercise 20)."""
    if isinstance(query, int) and not isinstance(query, bool):
        query = f"exercise {query}"
    if not isinstance(query, str) or not query.strip():
        return False
    q, t = " ".join(query.lower().split()), title.lower()
    return t == q or (t.startswith(q) and not t[len(q)].isalnum())


def reveal(exercise: str | int, lab: int | None = None) -> str:
    """The expected answer of ``exercise`` (``"Exercise 3"``, its whole title, or ``3``;
    any case), from the last time its check ran in this kernel, once an attempt of yours
    was compared with it. ``lab`` picks the lab when two labs are open in one kernel (the
    default is the one checked last). Printed and returned."""
    matches = [r for (n, title), r in _LAST.items()
               if _title_matches(exercise, title) and lab in (None, n)]
    unknown = None if matches else _no_such_exercise(exercise, lab)
    if unknown:
        text = unknown
    elif not matches:
        text = (f"{exercise!r} has not been checked yet in this kernel: write your attempt, "
                "run its check cell, then ask again.")
    else:
        r = matches[-1]
        if r.status == NOT_WRITTEN:
            text = (f"{r.exercise}: not written yet. The answer is shown after an attempt of "
                    "yours has been checked: write one, run its check cell, then ask again.")
        elif r.status == SKIPPED:
            text = f"{r.exercise}: this runtime cannot check it ({r.message}), so nothing to show."
        elif r.answer:
            text = f"{r.exercise}: {r.answer}"
        elif r.passed:
            text = f"{r.exercise}: you passed; there is nothing to reveal."
        else:
            text = (f"{r.exercise}: your last attempt could not be compared with the expected "
                    f"answer ({r.message}). Fix that, run the check again, then ask again.")
    print(text)
    return text


def _no_such_exercise(exercise: Any, lab: int | None) -> str | None:
    """What to say when no lab open in this kernel (or lab ``lab``) has ``exercise``;
    None when one has it, or when no lab is open yet (nothing to compare with)."""
    open_labs = {n: registry for n, registry in sorted(_LABS.items())
                 if lab in (None, n) and registry.exercises}
    if not open_labs:
        return None
    if any(_title_matches(exercise, e.title) for r in open_labs.values() for e in r.exercises):
        return None
    have = "; ".join(f"lab {n} has Exercise 1 to {len(r.exercises)}"
                     for n, r in open_labs.items())
    if isinstance(exercise, bool) or not isinstance(exercise, (str, int)):
        return (f"reveal({exercise!r}): name an exercise by its number or title, e.g. "
                f"reveal(3) or reveal(\"Exercise 3\") ({have}).")
    where = f"lab {lab}" if lab is not None else "no lab open in this kernel"
    verb = " has no" if lab is not None else " has an"
    return f"{where}{verb} exercise {exercise!r}: {have}."


# -- stubs: one class with the engine's (tpu_course.checks.engine) --

from tpu_course.checks.engine import (  # noqa: E402
    NotWritten, NotWrittenError, is_not_written, skip_if_not_written,
)


# -- reading a learner's answer safely --------------------------------------------------


def as_number(exercise: str, value: Any, what: str) -> float:
    """``value`` as a finite float; anything else ends the check (:class:`Verdict`) with
    a result that says why not.

    Rejects strings (even ``"256"``, also as bytes or inside a one-element array),
    booleans, None, arrays with more than one element, NaN and infinities, numbers too
    large for a float, and objects whose conversion to a number raises, naming ``what``
    was expected.

    >>> as_number("Ex", 3, "the cycle count")
    3.0
    >>> try:
    ...     as_number("Ex", "256", "the cycle count")
    ... except Verdict as stop:
    ...     print(stop.result)
    [FAIL] Ex: the cycle count should be a number, but you gave the string '256'
      Hint: remove the quotes: 256, not "256"
    """
    if isinstance(value, NotWritten):
        raise Verdict(not_written(exercise))
    _refuse_text(exercise, value, what, value)
    if value is None or isinstance(value, bool):
        refuse(exercise, f"{what} should be a number, but you gave {value!r}",
               hint="return (or assign) the number itself")
    try:
        size = getattr(value, "size", None)
    except Exception:  # noqa: BLE001 - a learner's object may raise anything
        size = None
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        size = None
    if size is not None and size != 1:
        refuse(exercise, f"{what} should be one number, but you gave an array of shape "
                         f"{getattr(value, 'shape', '?')}",
               hint="reduce it to a single number (or index the element you mean)")
    try:
        inner = value.item() if size == 1 and hasattr(value, "item") else value
        if inner is not value:  # a one-element array of strings is still a string
            _refuse_text(exercise, inner, what, value)
        number = float(inner)
    except Verdict:
        raise
    except NotImplementedError:  # an unwritten exercise underneath: the checker says so
        raise
    except OverflowError:
        refuse(exercise, f"{what} is too large for a float ({_brief(value)}): no real "
                         "answer is that large", hint="look for an exponent or a product that "
                                                      "grows without bound")
    except (TypeError, ValueError):
        refuse(exercise, f"{what} should be a number, but you gave a "
                         f"{type(value).__name__}: {value!r:.80}",
               hint="return a plain int or float")
    except Exception as err:  # noqa: BLE001 - a learner's __float__ may raise anything
        refuse(exercise, f"{what} should be a number, but turning your "
                         f"{type(value).__name__} into one raised {type(err).__name__}: "
                         f"{str(err)[:120]}", hint="return a plain int or float")
    if not math.isfinite(number):
        refuse(exercise, f"{what} is {number}, not a finite number",
               hint="look for a division by zero or an overflow")
    return number


def _refuse_text(exercise: str, value: Any, what: str, given: Any) -> None:
    """End the check when ``value`` is text (a string or bytes), which ``float()`` would
    read as a number; ``given`` is what the learner passed (it may hold ``value``)."""
    if isinstance(value, str):
        held = "" if given is value else f" (inside a {type(given).__name__})"
        refuse(exercise, f"{what} should be a number, but you gave the string "
                         f"{str(value)!r}{held}",
               hint=f'remove the quotes: {value}, not "{value}"')
    if isinstance(value, (bytes, bytearray)):
        refuse(exercise, f"{what} should be a number, but you gave the bytes {value!r:.80}",
               hint="return the number itself, not its text")


# -- the course's own answers are not answers --------------------------------------------


def _unwrap(fn: Any) -> Any:
    for _ in range(8):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        elif getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        else:
            break
    return fn


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _search(answer: Any, depth: int, value_hit: Callable[[Any], Any],
            names_hit: Callable[[set[str]], Any]) -> Any | None:
    """Walk the code ``answer`` reaches (see :func:`course_code_used`) and return the first
    hit: ``value_hit`` is asked about every object found, ``names_hit`` about the global and
    attribute names of each of the learner's functions."""
    seen: set[int] = set()

    def visit(obj: Any, level: int) -> Any | None:
        hit = value_hit(obj)
        if hit is not None:
            return hit
        if isinstance(obj, functools.partial):  # what a partial binds counts too
            for value in (*obj.args, *obj.keywords.values()):
                found = visit(value, level + 1) if callable(value) else None
                if found is not None:
                    return found
        obj = _unwrap(obj)
        hit = value_hit(obj)
        if hit is not None:
            return hit
        if id(obj) in seen or level > depth or (level and not _learners(obj)):
            return None
        seen.add(id(obj))
        if isinstance(obj, type):  # a class: its methods
            for value in vars(obj).values():
                found = visit(value, level + 1) if callable(value) else None
                if found is not None:
                    return found
            return None
        code = getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType):
            call = inspect.getattr_static(type(obj), "__call__", None)  # an object with __call__
            if call is not None and getattr(call, "__code__", None) is not None:
                return visit(call, level + 1)
            return None
        glob = getattr(obj, "__globals__", {})
        names = {n for c in _codes(code) for n in c.co_names}
        hit = names_hit(names)
        if hit is not None:
            return hit
        values = [glob.get(n, getattr(builtins, n, None)) for n in names]
        values += [cell.cell_contents for cell in (getattr(obj, "__closure__", None) or ())
                   if _filled(cell)]
        values += list(getattr(obj, "__defaults__", None) or ())
        for value in values:
            if isinstance(value, types.ModuleType):
                for n in names:
                    hit = value_hit(getattr(value, n, None))
                    if hit is not None:
                        return hit
            elif callable(value):
                found = visit(value, level + 1)
                if found is not None:
                    return found
        return None

    return visit(answer, 0)


def course_code_used(answer: Any, forbidden: Sequence[Any], *, depth: int = 4) -> Any | None:
    """The first of ``forbidden`` (the course's own functions) that ``answer`` is, or
    calls anywhere in the code it reaches: its body, its nested functions, the functions
    it closes over, the learner's own helpers it calls (up to ``depth`` deep), a
    ``functools.partial`` or a jitted wrapper around any of them, and module attributes
    it names (``systolic.cycle_count``). None when it uses none of them."""
    banned = {id(_unwrap(f)): f for f in forbidden} | {id(f): f for f in forbidden}
    return _search(answer, depth, lambda v: None if v is None else banned.get(id(v)),
                   lambda names: None)


def names_used(answer: Any, names: Iterable[str], *, depth: int = 4) -> str | None:
    """The first (alphabetically) of ``names`` that the code ``answer`` reaches uses as a
    global or an attribute (``"cost_analysis"`` for ``compiled.cost_analysis()``), in its
    own body or the learner's helpers it calls; None when it uses none. For "predict this,
    do not ask the compiler" exercises."""
    wanted = frozenset(names)
    return _search(answer, depth, lambda v: None,
                   lambda found: min(found & wanted) if found & wanted else None)


def learner_globals(answer: Any, *, depth: int = 4) -> list[dict]:
    """The global namespaces of ``answer`` and of the learner's own functions it reaches
    (a notebook's ``__main__``, a test module), found by the walk of
    :func:`course_code_used`: where the names the learner's code reads live (lab 2 points
    the clocks there at a virtual one)."""
    found: list[dict] = []

    def note(obj: Any) -> None:
        obj = _unwrap(obj)
        g = getattr(obj, "__globals__", None)
        if isinstance(g, dict) and _learners(obj) and all(g is not f for f in found):
            found.append(g)

    _search(answer, depth, note, lambda names: None)
    return found


def _learners(obj: Any) -> bool:
    """True for code the learner wrote (a notebook's or a test's), not a library's or the
    course's: :func:`course_code_used` follows only that (``systolic.simulate`` may call
    ``cycle_count``; a learner calling ``simulate`` is not using ``cycle_count``)."""
    module = getattr(obj, "__module__", None) or ""
    root = module.split(".")[0]
    if root == "__main__":
        return True
    if root in ("tpu_course", "builtins", "") or root in sys.stdlib_module_names:
        return False
    path = str(getattr(sys.modules.get(root), "__file__", "") or "")
    return not any(part in path for part in ("site-packages", "dist-packages"))


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True


def refuse_course_code(exercise: str, answer: Any, *forbidden: Any) -> None:
    """End the check (:class:`Verdict`) when ``answer`` is, or uses, one of the course's
    own functions that compute this exercise's result: the learner writes it."""
    used = course_code_used(answer, forbidden)
    if used is not None:
        name = f"{getattr(used, '__module__', '')}.{getattr(used, '__qualname__', used)}"
        name = name.replace("tpu_course.", "").lstrip(".")
        refuse(exercise, f"your answer uses {name}, the course's own function for this result",
               hint="write this yourself from the chapter's idea: that is the course's own "
                    "function, and using it is not an answer")


# -- the registry -----------------------------------------------------------------------

#: Hidden cases of an exercise: ``cases(rng) -> [(what kind of input, checker kwargs)]``.
HiddenCases = Callable[[Any], Sequence[tuple[str, Mapping[str, Any]]]]


def grading_seed(learner: str, lab: int) -> int:
    """The seed of one learner's hidden inputs for lab ``lab``: the same on every regrade,
    different between learners.

    >>> grading_seed("ada", 1) == grading_seed("ada", 1) != grading_seed("bob", 1)
    True
    """
    digest = hashlib.sha256(f"tpu-course/{learner}/lab{lab}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


@dataclasses.dataclass
class _Prediction:
    values: dict[str, Any]
    locked: bool = False


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        import numpy as np

        return bool(np.array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object)))
    except Exception:  # noqa: BLE001 - values a learner made may compare in any way
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001
            return False


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise of a lab: its title, minutes, points, needs, kind and checker.

    ``names`` are the learner's objects the checker takes (its parameters without a
    default), in order; ``predicts`` the ones a "predict" exercise locks (all of them
    unless the registration says which); ``hidden`` draws the inputs the grader also
    checks with (:meth:`Lab.grade` with a seed).
    """

    lab: int
    title: str
    minutes: int
    check: Callable[..., CheckResult]
    needs: str = "cpu"
    kind: str = "write"
    points: int = 1
    predicts: tuple[str, ...] = ()
    hidden: HiddenCases | None = None

    @property
    def names(self) -> tuple[str, ...]:
        params = inspect.signature(self.check).parameters.values()
        return tuple(p.name for p in params if p.default is p.empty
                     and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))

    def unmet(self) -> str | None:
        """Why this runtime cannot grade the exercise, or None when it can."""
        if self.needs in ("accelerator", "tpu-chip"):
            from tpu_course import runtime

            platform = runtime.describe().platform
            if self.needs == "accelerator" and platform == "cpu":
                return ("needs a TPU or GPU runtime, and this one is a CPU "
                        "(Colab: Runtime > Change runtime type)")
            if self.needs == "tpu-chip" and platform != "tpu":
                return (f"needs a TPU runtime, not a GPU, and this one is a {platform.upper()} "
                        "(Colab: Runtime > Change runtime type)")
        elif self.needs == "tpu-compiler":
            from tpu_course import hlo

            problem = hlo.tpu_compiler_problem()
            if problem:
                return f"needs the TPU compiler: {problem}"
        return None

    def _verdict(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> CheckResult:
        reason = self.unmet()
        if reason:
            return skipped(self.title, reason)
        if any(isinstance(a, NotWritten) for a in (*args, *kwargs.values())):
            return not_written(self.title)
        try:
            result = self.check(*args, **kwargs)
        except Verdict as stop:
            result = stop.result
        except NotImplementedError:
            result = not_written(self.title)
        except Exception as err:  # noqa: BLE001 - a learner's answer may raise anything
            result = fail(self.title, f"checking your answer raised {type(err).__name__}: "
                                      f"{str(err)[:300]}",
                          hint="run your code on a small input yourself and look at what it "
                               "returns (its type, its shape)")
        if not isinstance(result, CheckResult):  # a checker bug must not pass silently
            result = fail(self.title, f"the checker returned {type(result).__name__}")
        return result

    def run(self, *args: Any, **kwargs: Any) -> CheckResult:
        """The checker's verdict on ``args``; never raises. A "predict" exercise grades the
        prediction locked by :meth:`Lab.predict` when there is one."""
        args, note = self._locked(args)
        result = self._verdict(args, kwargs)
        if note and result.status in (PASSED, FAILED):
            result = dataclasses.replace(result, message=f"{result.message} ({note})")
        key = (self.lab, self.title)
        _LAST.pop(key, None)
        _LAST[key] = result  # the newest last: reveal's default is the lab checked last
        return result

    def _locked(self, args: Sequence[Any]) -> tuple[tuple[Any, ...], str]:
        recorded = _PREDICTIONS.get((self.lab, self.title))
        if recorded is None:
            return tuple(args), ""
        out, changed = list(args), False
        for i, name in enumerate(self.names[:len(out)]):
            if name in recorded.values:
                changed |= not _same(out[i], recorded.values[name])
                out[i] = recorded.values[name]
        note = ("graded: the prediction you recorded before the measurement was shown, not "
                "the value you changed since" if changed else "")
        return tuple(out), note

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

    def grade_hidden(self, namespace: Mapping[str, Any], seed: int) -> CheckResult:
        """The checker on each hidden input drawn from ``seed``: passes when all pass; a
        failure says what kind of input failed, never its answer."""
        import numpy as np

        args = [namespace[n] for n in self.names]
        index = next(i for i, e in enumerate(_registry_of(self)) if e is self)
        cases = list(self.hidden(np.random.default_rng([seed % 2**63, index])))  # type: ignore[misc]
        for what, kwargs in cases:
            result = self._verdict(args, kwargs)
            if result.status == SKIPPED:
                return result
            if not result.passed:
                return fail(self.title, f"passes the notebook's check, but not on an input the "
                                        f"notebook does not show ({what}): {result.message}",
                            hint=result.hint or "do not rely on the notebook's one example: "
                                                "test your code on other shapes and values")
        return ok(self.title, f"right on the notebook's input and on {len(cases)} unseen ones")


from tpu_course.checks.engine import _LABS  # noqa: E402


def _registry_of(exercise: Exercise) -> list[Exercise]:
    return _LABS[exercise.lab].exercises


class Lab:
    """The exercises of one lab, in order, with the scorecard that grades them all."""

    def __init__(self, number: int, title: str, *, cpu_devices: int = 1) -> None:
        self.number = number
        self.title = title
        #: CPU devices the checks need (the notebook calls ``runtime.simulate_devices``);
        #: the grader's fresh checking process starts with as many.
        self.cpu_devices = cpu_devices
        self.exercises: list[Exercise] = []
        _LABS[number] = self

    def exercise(self, title: str, *, minutes: int, needs: str = "cpu", kind: str = "write",
                 points: int = 1, predicts: Sequence[str] | None = None,
                 hidden: HiddenCases | None = None) -> Callable[[Callable], Callable]:
        """Register a checker as this lab's next exercise (titled ``"Exercise N (...)"``);
        the returned function is the checker wrapped so that it never raises (see
        :meth:`Exercise.run`). ``hidden`` draws the grader's unseen inputs as checker
        keyword arguments; ``predicts`` names what :meth:`predict` locks."""
        number = len(self.exercises) + 1
        if not _title_matches(number, title) or title == f"Exercise {number}":
            raise ValueError(f"exercise {number} of lab {self.number} is titled {title!r}: "
                             f'write "Exercise {number} (what it asks)"')
        if needs not in NEEDS:
            raise ValueError(f"needs={needs!r}: expected one of {NEEDS}")
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
        if not isinstance(points, int) or isinstance(points, bool) or points < 1:
            raise ValueError(f"points={points!r}: expected a whole number of at least 1")
        if predicts is not None and kind != "predict":
            raise ValueError(f"predicts= is for kind='predict' exercises, not {kind!r}")

        def register(fn: Callable[..., CheckResult]) -> Callable[..., CheckResult]:
            ex = Exercise(self.number, title, minutes, fn, needs, kind, points, (), hidden)
            locked = tuple(predicts) if predicts is not None else (
                ex.names if kind == "predict" else ())
            unknown = set(locked) - set(ex.names)
            if unknown:
                raise ValueError(f"predicts={sorted(unknown)} are not parameters of {fn.__name__}")
            ex = dataclasses.replace(ex, predicts=locked)
            self.exercises.append(ex)

            @functools.wraps(fn)
            def checked(*args: Any, **kwargs: Any) -> CheckResult:
                return ex.run(*args, **kwargs)

            checked.exercise = ex  # type: ignore[attr-defined]
            return checked

        return register

    def find(self, exercise: str | int) -> Exercise:
        """The exercise named ``exercise`` (``"Exercise 2"``, its title or ``2``)."""
        found = [e for e in self.exercises if _title_matches(exercise, e.title)]
        if len(found) != 1:
            raise ValueError(f"lab {self.number} has no exercise {exercise!r}: its exercises "
                             f"are {', '.join(_short(e.title) for e in self.exercises)}")
        return found[0]

    # -- predictions ----------------------------------------------------------------

    def predict(self, exercise: str | int, *values: Any) -> None:
        """Record your prediction for a "predict" exercise, in the order of its names
        (``LAB.predict("Exercise 2", predicted_128, predicted_256, finishes_first)``).

        You may change it and record again until the measurement is shown
        (:meth:`predicted`); from then on it is locked, and the check grades it."""
        ex = self.find(exercise)
        if ex.kind != "predict":
            raise ValueError(f"{ex.title} is not a prediction; only these are: "
                             + ", ".join(_short(e.title) for e in self.exercises
                                         if e.kind == "predict"))
        if len(values) != len(ex.predicts):
            raise TypeError(f"{_short(ex.title)} takes {len(ex.predicts)} value(s), "
                            f"{', '.join(ex.predicts)}; you gave {len(values)}")
        if any(isinstance(v, NotWritten) for v in values):
            print(f"{ex.title}: not written yet: write your prediction above, then run this "
                  "cell again.")
            return
        named = dict(zip(ex.predicts, values))
        shown = ", ".join(f"{k} = {_brief(v)}" for k, v in named.items())
        key = (self.number, ex.title)
        old = _PREDICTIONS.get(key)
        if old is not None and old.locked:
            same = all(_same(old.values[k], v) for k, v in named.items())
            print(f"{ex.title}: your prediction is locked, since its measurement has been "
                  "shown" + ("." if same else
                             "; the check grades the one recorded before it, not this one."))
            return
        _PREDICTIONS[key] = _Prediction(named)
        head = f"recorded for {_short(ex.title)}:"
        if len(f"{head} {shown}.") <= WIDTH:
            print(f"{head} {shown}.")
        else:  # one value a line, each cut to the width
            print("\n".join([head] + [_fit(f"  {k} = {_brief(v)}") for k, v in named.items()]))
        print("You can change it until the measurement is shown; then it is locked.")

    def predicted(self, exercise: str | int) -> bool:
        """True once a prediction for ``exercise`` is recorded, which locks it: the cell
        that shows the measurement runs under ``if LAB.predicted("Exercise N"):``.
        Otherwise say what to do first and return False."""
        ex = self.find(exercise)
        recorded = _PREDICTIONS.get((self.number, ex.title))
        if recorded is None:
            print(f"{_short(ex.title)}: the measurement is shown once your prediction is "
                  f"recorded: write it, run its predict cell, then this one.")
            return False
        recorded.locked = True
        return True

    @property
    def minutes(self) -> int:
        """The expected time of all exercises together."""
        return sum(e.minutes for e in self.exercises)

    @property
    def points(self) -> int:
        """The points of all exercises together."""
        return sum(e.points for e in self.exercises)

    def plan(self) -> str:
        """The lab's exercises with their minutes and needs, as a small text table."""
        width = max((len(e.title) for e in self.exercises), default=10)
        head = f"Lab {self.number}: {self.title}:"
        size = f"{len(self.exercises)} exercises, about {self.minutes} minutes"
        lines = [f"{head} {size}"] if len(f"{head} {size}") <= WIDTH else [head, size]
        for e in self.exercises:
            need = "" if e.needs == "cpu" else f" (needs {e.needs.replace('-', ' ')})"
            lines.append(f"  {e.title:<{width}}  {e.minutes:>3} min{need}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.plan()

    def reveal(self, exercise: str | int) -> str:
        """:func:`reveal` for this lab's exercise."""
        return reveal(exercise, self.number)

    def grade(self, namespace: Mapping[str, Any], *, seed: int | None = None
              ) -> list[CheckResult]:
        """Every exercise's verdict on what ``namespace`` holds. With a ``seed`` (the
        grader's, :func:`grading_seed`), an exercise with hidden inputs that passes its
        visible check is checked on those too and passes only when both pass."""
        results = []
        for e in self.exercises:
            result = e.grade(namespace)
            if seed is not None and result.passed and e.hidden is not None:
                result = e.grade_hidden(namespace, seed)
            results.append(result)
        return results

    def scorecard(self, namespace: Mapping[str, Any]) -> "Scorecard":
        """Re-run every checker on ``namespace`` (pass ``globals()``) and total the results."""
        return Scorecard(self, tuple(self.grade(namespace)))


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fit(line: str) -> str:
    """``line``, cut to :data:`WIDTH` characters with "..." when longer."""
    return line if len(line) <= WIDTH else line[:WIDTH - 3] + "..."


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
            message = r.message if r.status in (SKIPPED, NOT_WRITTEN, FAILED) else ""
            if len(f"{line}  {message}") <= WIDTH or not message:
                lines.append(f"{line}  {message}".rstrip())
            else:  # the message on the lines below, wrapped to the width
                lines.append(line.rstrip())
                lines += textwrap.wrap(textwrap.shorten(message, 2 * (WIDTH - 14)), WIDTH,
                                       initial_indent=" " * 14, subsequent_indent=" " * 14)
        return "\n".join([*lines, self.total()])

    def __repr__(self) -> str:
        return str(self)

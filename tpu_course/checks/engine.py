"""The assessment engine: an exercise is a declaration, checked the same way everywhere.

An :class:`Exercise` says what the learner provides (``provides``: the names of a function
or of values), the inputs it is tried on (``cases``: visible :class:`Case` objects), how
the learner's code is run on one case (``probe``: it returns plain data, never an
object), how an output is compared with the expected one (``compare``) and, where a
course instrument computes the expected output (``expect``: the simulator, ``jnp``, XLA's
cost analysis, the benchmark harness), that instrument. Nothing here holds an answer:
references, hidden cases and known mistakes live in the repository's ``grading/`` folder,
which is not part of the installed package. What the notebook needs of them for the
visible cases (the expected outputs, and what each known mistake outputs, so that a hint
can name it) is stored as data in ``checks/visible/chNN.json`` (``python -m grading
build`` writes it; a test keeps it current).

Two ways to run the same declaration:

* **In the notebook** (:meth:`Exercise.check`, what a check cell calls): the probe runs
  the learner's code on the visible cases in the learner's own kernel and the verdict
  comes at once, with the hint of the mistake the outputs match. It is feedback: a learner
  can fool their own notebook, and only fools themselves.
* **In grading** (``tpu-course grade``): the submission runs in a sandboxed worker that
  runs the probes and writes their outputs as data (:func:`encode`); the checking process
  reads that data (:func:`decode`: JSON and raw array bytes, nothing executable), computes
  the expected outputs itself on visible and hidden cases, and calls :func:`judge`. It
  never imports, executes or unpickles anything from the submission.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import html
import json
import math
import numbers
import os
import pathlib
import signal
import textwrap
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

PASSED, FAILED, NOT_WRITTEN, SKIPPED = "passed", "failed", "not written", "skipped"
STATUSES = (PASSED, FAILED, NOT_WRITTEN, SKIPPED)
_MARKS = {PASSED: "PASS", FAILED: "FAIL", NOT_WRITTEN: "NOT WRITTEN", SKIPPED: "SKIPPED"}
_COLOURS = {PASSED: "#1a7f37", FAILED: "#cf222e", NOT_WRITTEN: "#9a6700", SKIPPED: "#57606a"}
#: What an exercise can need from the runtime.
NEEDS = ("cpu", "accelerator", "tpu-chip", "tpu-compiler")
#: What an exercise asks: code the chapter taught ("write"), the chapter's idea applied to
#: a case it did not show ("apply"), or a number before it is measured ("predict").
KINDS = ("write", "apply", "predict")
#: The widest line the plain-text views print.
WIDTH = 88
#: Set by ``tpu-course grade`` in the processes that run a submission. There the notebook's
#: checks skip at once instead of running the learner's code on the visible cases (its
#: scorecard again): the grader makes its verdicts from its own cases, in its own process.
GRADING_RUN = "TPU_COURSE_GRADE_TOKEN"

#: Where the visible cases' expected outputs are stored (one JSON file per lab).
VISIBLE = pathlib.Path(__file__).with_name("visible")


# -- verdicts ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The verdict on one exercise: ``status`` (passed, failed, not written, skipped),
    ``message`` (why), on a failure a ``hint`` that names the mistake without the answer,
    and ``answer`` (the expected output), shown only by :func:`reveal`."""

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
            text += f'\n  (checks.reveal("{short(self.exercise)}") shows the expected answer)'
        return text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = _COLOURS[self.status]
        mark = {PASSED: "&#10004; pass", FAILED: "&#10008; not yet"}.get(
            self.status, html.escape(self.status))
        extra = f"<br><i>Hint:</i> {html.escape(self.hint)}" if self.hint else ""
        if self.answer:
            extra += (f'<br><small>checks.reveal("{html.escape(short(self.exercise))}") '
                      "shows the expected answer</small>")
        return (f'<div style="border-left:4px solid {colour};padding:4px 8px">'
                f"<b style='color:{colour}'>{mark}</b> <b>{html.escape(self.exercise)}</b>: "
                f"{html.escape(self.message)}{extra}</div>")

    def assert_passed(self) -> "CheckResult":
        """Raise ``AssertionError`` with the message when the check did not pass."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


def short(title: str) -> str:
    """``"Exercise 2 (predict a GEMM)"`` -> ``"Exercise 2"``."""
    return title.split(" (")[0]


def ok(exercise: str, message: str = "correct") -> CheckResult:
    return CheckResult(exercise, PASSED, message)


def fail(exercise: str, message: str, *, hint: str = "", answer: str = "") -> CheckResult:
    return CheckResult(exercise, FAILED, message, hint, answer)


def not_written(exercise: str, detail: str = "") -> CheckResult:
    return CheckResult(exercise, NOT_WRITTEN, "not written yet" + (f": {detail}" if detail else ""))


def skipped(exercise: str, reason: str) -> CheckResult:
    return CheckResult(exercise, SKIPPED, f"skipped: {reason}")


class Wrong(Exception):
    """Raised by a probe or a ``compare`` when an output cannot be compared at all (a
    string where a number belongs, a wrong shape): ``str(err)`` says what is wrong, and
    ``hint`` what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


# -- stubs the lab generator writes --------------------------------------------------------


class NotWrittenError(NotImplementedError):
    """Raised when code uses the value of an exercise the learner has not written yet."""


class NotWritten:
    """The value an unwritten exercise leaves in a lab (``x = NotWritten("Exercise 2")``):
    using it in any way raises :class:`NotWrittenError`."""

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
        print(f"skipped: {what.replace(': write your code here', ' is not written yet')}")


# -- plain data: what crosses from the learner's process to the checker's ----------------


class Raised:
    """What a probe returns in place of an output when the learner's code raised."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind, self.message = kind, message

    def __repr__(self) -> str:
        return f"{self.kind}: {self.message}"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Raised) and (self.kind, self.message) == (other.kind,
                                                                         other.message)


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain data: None, bools, ints, floats, strings, tuples, lists, dicts of
    those and numpy arrays (JAX arrays and numpy scalars become these). Anything else (a
    function, a module, a learner's class) becomes the string ``"<a TYPE object>"``, which
    no comparison accepts as a number or an array."""
    import numpy as np

    if depth > 12:
        return "<nested too deeply>"
    if value is None or isinstance(value, (bool, str, Raised)):
        return value
    if isinstance(value, NotWritten):
        raise NotWrittenError(f"{value.exercise} is not written yet")
    if isinstance(value, numbers.Integral) and type(value).__module__ in ("builtins", "numpy"):
        return int(value)
    if isinstance(value, numbers.Real) and type(value).__module__ in ("builtins", "numpy"):
        return float(value)
    if isinstance(value, (list, tuple)):
        items = [plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {plain(k, depth + 1) if isinstance(k, (str, int, tuple)) else repr(k):
                plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, np.ndarray) or type(value).__module__.startswith(("jax", "jaxlib")):
        try:
            array = np.asarray(value)
        except Exception:  # noqa: BLE001 - a tracer, a deleted buffer
            return f"<a {type(value).__name__} object>"
        if array.dtype.kind in "biufcV" or array.dtype.name == "bfloat16":
            return array.copy()
    return f"<a {type(value).__name__} object>"


def encode(value: Any) -> Any:
    """Plain data as JSON-ready values (arrays as dtype, shape and base64 bytes)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return {"__array__": data.dtype.name, "shape": list(value.shape),
                "b64": base64.b64encode(data.tobytes()).decode()}
    if isinstance(value, Raised):
        return {"__raised__": value.kind, "message": value.message}
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"__dict__": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    return value


def _dtype(name: str) -> Any:
    import numpy as np

    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "uint4"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    dtype = np.dtype(name)
    if dtype.kind not in "biufc":
        raise ValueError(f"not a numeric dtype: {name}")
    return dtype


def decode(data: Any) -> Any:
    """The inverse of :func:`encode`. Reads numbers, strings and raw array bytes only: a
    malformed record becomes a string that no comparison accepts."""
    import numpy as np

    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data if data is None or isinstance(data, (bool, int, float, str)) else repr(data)
    try:
        if "__array__" in data:
            dtype = _dtype(str(data["__array__"]))
            shape = tuple(int(n) for n in data["shape"])
            raw = base64.b64decode(str(data["b64"]))
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if "__raised__" in data:
            return Raised(str(data["__raised__"]), str(data.get("message", "")))
        if "__tuple__" in data:
            return tuple(decode(v) for v in data["__tuple__"])
        if "__dict__" in data:
            return {_key(decode(k)): decode(v) for k, v in data["__dict__"]}
        if "__float__" in data:
            return float(str(data["__float__"]))
    except (KeyError, TypeError, ValueError) as err:
        return f"<unreadable data: {err}>"
    return f"<unreadable data: {sorted(map(str, data))[:5]}>"


def _key(k: Any) -> Any:
    return k if isinstance(k, (str, int, tuple)) or k is None else repr(k)


def dumps(value: Any) -> str:
    return json.dumps(encode(plain(value)))


def loads(text: str) -> Any:
    return decode(json.loads(text))


# -- reading a learner's output -------------------------------------------------------------


def number(value: Any, what: str) -> float:
    """``value`` as a finite float, or :class:`Wrong` saying why it is not one (a string,
    a bool, None, an array of several numbers, NaN)."""
    import numpy as np

    if isinstance(value, (np.ndarray, np.generic)) and value.size == 1 \
            and value.dtype.kind in "biuf":
        value = value.reshape(()).item()
    if isinstance(value, str):
        if value.startswith("<a "):
            raise Wrong(f"{what} should be a number, but it is {value[1:-1]}",
                        "return (or assign) the number itself")
        raise Wrong(f"{what} should be a number, but it is the string {value!r:.60}",
                    f'remove the quotes: {value}, not "{value}"')
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        shape = getattr(value, "shape", None)
        kind = f"an array of shape {shape}" if shape is not None else repr(value)[:60]
        raise Wrong(f"{what} should be one number, but it is {kind}",
                    "return (or assign) a single int or float")
    if not math.isfinite(value):
        raise Wrong(f"{what} is {value}, not a finite number",
                    "look for a division by zero or an overflow")
    return float(value)


def array(value: Any, what: str, shape: Sequence[int] | None = None) -> Any:
    """``value`` as a numeric numpy array (of ``shape``), or :class:`Wrong`."""
    import numpy as np

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = np.asarray(value)
    if isinstance(value, (list, tuple)):
        try:
            value = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            pass
    if not isinstance(value, np.ndarray):
        raise Wrong(f"{what} should be an array, but it is {_brief(value)}",
                    "return the array itself")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise Wrong(f"{what} has shape {tuple(value.shape)}, expected {tuple(shape)}",
                    "print the shape of what you return on a small input")
    return value


def _brief(value: Any, limit: int = 80) -> str:
    import numpy as np

    if isinstance(value, np.ndarray) and value.size > 12:
        return f"array of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- comparisons: None when the output is right, else what is wrong -------------------------

Compare = Callable[[Any, Any, "Case"], "str | None"]


def close(rtol: float = 1e-6, atol: float = 0.0, what: str = "your output",
          dtype: bool = False) -> Compare:
    """Numbers and arrays (also inside tuples and dicts) within ``rtol``/``atol`` of the
    expected; with ``dtype=True`` arrays must also have the expected dtype."""

    def compare(got: Any, want: Any, case: "Case") -> str | None:
        return _close(got, want, rtol, atol, what, dtype)

    return compare


def _close(got: Any, want: Any, rtol: float, atol: float, what: str, dtype: bool) -> str | None:
    import numpy as np

    if isinstance(want, tuple) and len(want) and not isinstance(want, np.ndarray):
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            raise Wrong(f"{what} should be {len(want)} values, but it is {_brief(got)}",
                        f"return a tuple of {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            problem = _close(g, w, rtol, atol, f"{what}[{i}]", dtype)
            if problem:
                return problem
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(map(str, got)) != set(map(str, want)):
            keys = sorted(map(str, got)) if isinstance(got, dict) else _brief(got)
            raise Wrong(f"{what} should be a dict with keys {sorted(map(str, want))}, not {keys}",
                        "return a dict with exactly those keys")
        by_name = {str(k): v for k, v in got.items()}
        for k, w in want.items():
            problem = _close(by_name[str(k)], w, rtol, atol, f"{what}[{k!r}]", dtype)
            if problem:
                return problem
        return None
    if isinstance(want, (str, bool)) or want is None:
        return None if got == want else f"{what} is {_brief(got)}, expected another value"
    if isinstance(want, np.ndarray):
        g = array(got, what, want.shape)
        if dtype and g.dtype != want.dtype:
            return f"{what} has dtype {g.dtype}, but it should keep {want.dtype}"
        if g.dtype.kind not in "biuf" and g.dtype.name != "bfloat16":
            raise Wrong(f"{what} has dtype {g.dtype}: expected numbers", "return numbers")
        gf, wf = g.astype(np.float64), want.astype(np.float64)
        bad = ~np.isclose(gf, wf, rtol=rtol, atol=atol, equal_nan=False)
        if not bad.any():
            return None
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        return (f"{what} differs from the expected output in {int(bad.sum())} of {bad.size} "
                f"places (first at index {where}: {gf[where]:.6g})")
    g = number(got, what)
    if math.isclose(g, float(want), rel_tol=rtol, abs_tol=atol):
        return None
    return f"{what} is {g:.6g}, which is not within {rtol:.0%} of the expected value"


def equal(what: str = "your answer") -> Compare:
    """Exactly the expected (numbers compared as numbers, arrays element by element)."""
    return close(0.0, 0.0, what)


# -- declarations ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One input: ``label`` says what kind of input it is (shown when it fails, e.g. "a
    non-square 3x5 array"), ``args`` are plain data the probe passes on."""

    label: str
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Mistake:
    """A known wrong answer and the hint that names it. ``answer`` is the mistaken code or
    values (what a learner who made it would provide: the learner's names, or a single
    object for a one-name exercise); ``when(got, want, case)`` is the same mistake as a
    rule on the outputs. Recognised from outputs only, never from names or source."""

    hint: str
    answer: Any = None
    when: Callable[[Any, Any, Case], bool] | None = None


#: The output of a mistake given as a rule (``when=``): there is none to compare with.
NO_OUTPUT = object()
#: How the stored visible data writes :data:`NO_OUTPUT`.
STORED_NO_OUTPUT = "<no output>"


def call(answer: Mapping[str, Any], case: Case) -> Any:
    """The default probe: the learner's one function called with the case's arguments."""
    (fn,) = answer.values()
    return fn(**case.args)


def values(answer: Mapping[str, Any], case: Case) -> Any:
    """The probe of a value exercise: the learner's values, in the order declared."""
    return tuple(answer.values()) if len(answer) > 1 else next(iter(answer.values()))


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise, declared once (see the module's docstring)."""

    title: str
    minutes: int
    provides: tuple[str, ...]
    kind: str = "write"
    needs: str = "cpu"
    points: int = 1
    cases: tuple[Case, ...] = (Case("your answer"),)
    probe: Callable[[Mapping[str, Any], Case], Any] = call
    compare: Compare = equal()
    expect: Callable[[Case], Any] | None = None
    rules: tuple[Mistake, ...] = ()
    hint: str = "try your code on the failing input yourself and compare with the chapter"
    #: What a pass teaches, appended to its message ("the bigger array wins on time ...").
    success: str = ""
    time_limit_s: float = 60.0
    lab: int = 0

    def __post_init__(self) -> None:
        if self.needs not in NEEDS:
            raise ValueError(f"needs={self.needs!r}: expected one of {NEEDS}")
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: expected one of {KINDS}")
        if isinstance(self.provides, str):
            object.__setattr__(self, "provides", (self.provides,))

    @property
    def names(self) -> tuple[str, ...]:
        return self.provides

    def unmet(self) -> str | None:
        """Why this runtime cannot check the exercise, or None."""
        if self.needs in ("accelerator", "tpu-chip"):
            import jax

            platform = jax.default_backend()
            if self.needs == "accelerator" and platform == "cpu":
                return ("needs a TPU or GPU runtime, and this one is a CPU "
                        "(Colab: Runtime > Change runtime type)")
            if self.needs == "tpu-chip" and platform != "tpu":
                return (f"needs a TPU runtime, and this one is a {platform.upper()} "
                        "(Colab: Runtime > Change runtime type)")
        elif self.needs == "tpu-compiler":
            from tpu_course import hlo

            problem = hlo.tpu_compiler_problem()
            if problem:
                return f"needs the TPU compiler: {problem}"
        return None

    def run(self, answer: Mapping[str, Any], cases: Sequence[Case] | None = None) -> list[Any]:
        """The probe's plain-data output on each case (``Raised`` where the learner's code
        raised; :class:`NotWrittenError` when an unwritten stub was reached)."""
        outputs = []
        for case in self.cases if cases is None else cases:
            try:
                with time_limit(self.time_limit_s):
                    outputs.append(plain(self.probe(answer, case)))
            except NotImplementedError:
                raise
            except Wrong as err:
                outputs.append(Raised("Wrong", f"{err}|{err.hint}"))
            except BaseException as err:
                if isinstance(err, KeyboardInterrupt) and not isinstance(err, _Timeout):
                    raise
                outputs.append(Raised(type(err).__name__, str(err)[:300]))
        return outputs

    def check(self, *given: Any, **named: Any) -> CheckResult:
        """The notebook's check: the learner's ``provides`` (in order, or by name) on the
        visible cases, judged against the stored expected outputs. Never raises."""
        if len(given) > len(self.provides) or set(named) - set(self.provides):
            return fail(self.title, f"the check takes {', '.join(self.provides)}; it was "
                                    f"given {len(given) + len(named)} value(s)",
                        hint="run the check cell as the lab wrote it")
        answer = dict(zip(self.provides, given)) | named
        missing = [n for n in self.provides if n not in answer]
        if missing:
            return not_written(self.title, f"{', '.join(missing)} is not defined: run the "
                                           "exercise's cell")
        answer, note = _locked(self, answer)
        result = self._verdict(answer)
        if note and result.status in (PASSED, FAILED):
            result = dataclasses.replace(result, message=f"{result.message} ({note})")
        _LAST.pop((self.lab, self.title), None)
        _LAST[(self.lab, self.title)] = result
        return result

    def _verdict(self, answer: Mapping[str, Any]) -> CheckResult:
        if os.environ.get(GRADING_RUN):  # the grader judges this run: no need to run it twice
            return skipped(self.title, "the grader checks this notebook on cases of its own")
        reason = self.unmet()
        if reason:
            return skipped(self.title, reason)
        if any(isinstance(v, NotWritten) for v in answer.values()):
            return not_written(self.title)
        try:
            outputs = self.run(answer)
        except NotImplementedError:
            return not_written(self.title)
        try:
            wants, mistakes = expected(self, self.cases)
        except LookupError as err:
            return skipped(self.title, str(err))
        return judge(self, self.cases, outputs, wants, mistakes)


def expected(exercise: Exercise, cases: Sequence[Case]) -> tuple[list[Any], list[list[tuple[Mistake, Any]]]]:
    """The expected output of each visible case and, per case, each known mistake with its
    output (None for a rule): from the exercise's instrument, else the stored data."""
    rules = [(m, NO_OUTPUT) for m in exercise.rules]
    if exercise.expect is not None:
        stored = _stored(exercise, required=False)
        hints = stored["mistakes"] if stored else [[] for _ in cases]
        return ([plain(exercise.expect(c)) for c in cases],
                [rules + [(Mistake(h), out) for h, out in per] for per in hints])
    stored = _stored(exercise, required=True)
    return stored["wants"], [rules + [(Mistake(h), out) for h, out in per]
                             for per in stored["mistakes"]]


@functools.lru_cache(maxsize=None)
def _visible_file(lab: int) -> dict:
    path = VISIBLE / f"ch{lab:02d}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _stored(exercise: Exercise, required: bool) -> dict | None:
    entry = _visible_file(exercise.lab).get(exercise.title)
    if entry is None or len(entry["wants"]) != len(exercise.cases):
        if required:
            raise LookupError("this installation holds no expected outputs for it (a grading "
                              "sandbox hides them)")
        return None
    return {"wants": [decode(w) for w in entry["wants"]],
            "mistakes": [[(h, NO_OUTPUT if o == STORED_NO_OUTPUT else decode(o)) for h, o in per]
                         for per in entry["mistakes"]]}


def judge(exercise: Exercise, cases: Sequence[Case], outputs: Sequence[Any],
          wants: Sequence[Any], mistakes: Sequence[Sequence[tuple[Mistake, Any]]],
          hidden_from: int | None = None) -> CheckResult:
    """The verdict on outputs already computed: passed when every case's output is right;
    otherwise the first wrong case, what is wrong, and the hint of the known mistake its
    output matches (``mistakes[i]`` lists ``(Mistake, its output on case i)``; a rule's
    output is :data:`NO_OUTPUT`). Cases from ``hidden_from`` on are called "not shown in the notebook"."""
    title = exercise.title
    for i, (case, got, want) in enumerate(zip(cases, outputs, wants)):
        where = case.label if hidden_from is None or i < hidden_from else (
            f"an input the notebook does not show ({case.label})")
        if isinstance(got, Raised):
            named = _recognise(exercise, cases, outputs, wants, mistakes, i)
            message, _, hint = got.message.partition("|")
            if named:
                return fail(title, f"on {where}: {message}", hint=named)
            if got.kind == "Wrong":
                return fail(title, f"on {where}: {message}", hint=hint or exercise.hint)
            if got.kind in ("_Timeout", "TimeoutError"):
                return fail(title, f"on {where}: {got.message}",
                            hint="look for a loop that never ends, or one that runs far "
                                 "more often than it needs to")
            return fail(title, f"on {where} your code raised {got.kind}: {got.message}",
                        hint="run your code on this input yourself and read the error")
        try:
            problem = exercise.compare(got, want, case)
        except Wrong as err:
            return fail(title, f"on {where}: {err}", hint=err.hint or exercise.hint)
        if problem is None:
            continue
        hint = _recognise(exercise, cases, outputs, wants, mistakes, i)
        return fail(title, f"on {where}: {problem}", hint=hint or exercise.hint,
                    answer=_brief(want, 400))
    extra = "" if hidden_from is None or hidden_from >= len(cases) else (
        f", {len(cases) - hidden_from} of them not shown in the notebook")
    message = f"right on all {len(cases)} inputs{extra}" if len(cases) > 1 else "correct"
    return ok(title, f"{message}: {exercise.success}" if exercise.success else message)


def _matches(exercise: Exercise, mistake: Mistake, output: Any, got: Any, want: Any,
             case: Case) -> bool:
    """Whether the learner's output ``got`` is what ``mistake`` gives (``output``)."""
    try:
        if mistake.when is not None:  # a rule reads outputs, not errors
            return not isinstance(got, Raised) and bool(mistake.when(got, want, case))
        if output is NO_OUTPUT:
            return False
        if isinstance(output, Raised) or isinstance(got, Raised):
            return isinstance(output, Raised) and output == got
        return exercise.compare(got, output, case) is None
    except Exception:  # noqa: BLE001 - a rule that cannot read this output does not match
        return False


def _recognise(exercise: Exercise, cases: Sequence[Case], outputs: Sequence[Any],
               wants: Sequence[Any], mistakes: Sequence[Sequence[tuple[Mistake, Any]]],
               i: int) -> str:
    """The hint of the known mistake that gives the learner's output on case ``i``; of
    several, the one that also explains the most of the other cases."""
    def explains(k: int, j: int) -> bool:
        if j >= len(mistakes) or k >= len(mistakes[j]):
            return False
        mistake, output = mistakes[j][k]
        return _matches(exercise, mistake, output, outputs[j], wants[j], cases[j])

    found = [k for k in range(len(mistakes[i]) if i < len(mistakes) else 0) if explains(k, i)]
    if not found:
        return ""
    best = max(found, key=lambda k: sum(explains(k, j) for j in range(len(cases)) if j != i))
    return mistakes[i][best][0].hint


# -- time limits (a learner's loop that never ends) --------------------------------------------


class _Timeout(KeyboardInterrupt):
    """Raised by :func:`time_limit` (a KeyboardInterrupt, so that ``except Exception`` in a
    learner's loop does not swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Stop code that runs longer than ``seconds`` (main thread only: a notebook's cells)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def stop(*_: Any) -> None:
        raise _Timeout(f"your code ran for more than {seconds:g} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- predictions, the scorecard, reveal --------------------------------------------------------

#: The last result of each exercise, keyed by (lab number, title), for :func:`reveal`.
_LAST: dict[tuple[int, str], CheckResult] = {}
#: Predictions recorded in this kernel: (lab, title) -> [values, locked].
_PREDICTIONS: dict[tuple[int, str], list] = {}
_LABS: dict[int, "Lab"] = {}


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # noqa: BLE001 - arrays, odd objects
        return False


def _locked(exercise: Exercise, answer: dict) -> tuple[dict, str]:
    recorded = _PREDICTIONS.get((exercise.lab, exercise.title))
    if recorded is None or not recorded[1]:
        return answer, ""
    changed = any(not _same(answer.get(k), v) for k, v in recorded[0].items())
    note = ("graded: the prediction you recorded before the measurement was shown, not the "
            "value you changed since" if changed else "")
    return answer | recorded[0], note


def _title_matches(query: Any, title: str) -> bool:
    if isinstance(query, int) and not isinstance(query, bool):
        query = f"exercise {query}"
    if not isinstance(query, str) or not query.strip():
        return False
    q, t = " ".join(query.lower().split()), title.lower()
    return t == q or (t.startswith(q) and not t[len(q)].isalnum())


class Lab:
    """The exercises of one lab, in order, with its scorecard."""

    def __init__(self, number: int, title: str, *, cpu_devices: int = 1) -> None:
        self.number, self.title, self.cpu_devices = number, title, cpu_devices
        self.exercises: list[Exercise] = []
        _LABS[number] = self

    def add(self, exercise: Exercise) -> Callable[..., CheckResult]:
        """Register the next exercise (titled ``"Exercise N (...)"``); returns its check,
        the function a check cell calls with the learner's names."""
        n = len(self.exercises) + 1
        if not _title_matches(n, exercise.title) or exercise.title == f"Exercise {n}":
            raise ValueError(f"exercise {n} of lab {self.number} is titled "
                             f'{exercise.title!r}: write "Exercise {n} (what it asks)"')
        exercise = dataclasses.replace(exercise, lab=self.number)
        self.exercises.append(exercise)

        def check(*given: Any, **named: Any) -> CheckResult:
            return exercise.check(*given, **named)

        check.exercise = exercise  # type: ignore[attr-defined]
        check.__doc__ = f"{exercise.title}: check {', '.join(exercise.provides)}."
        return check

    def find(self, exercise: str | int) -> Exercise:
        found = [e for e in self.exercises if _title_matches(exercise, e.title)]
        if len(found) != 1:
            raise ValueError(f"lab {self.number} has no exercise {exercise!r}: its exercises "
                             f"are {', '.join(short(e.title) for e in self.exercises)}")
        return found[0]

    def predict(self, exercise: str | int, *given: Any) -> None:
        """Record your prediction (in the order of the exercise's names). You may record
        again until the measurement is shown (:meth:`predicted`); then it is locked."""
        ex = self.find(exercise)
        if ex.kind != "predict" or len(given) != len(ex.provides):
            print(f"{short(ex.title)} takes {len(ex.provides)} value(s), "
                  f"{', '.join(ex.provides)}; you gave {len(given)}.")
            return
        if any(isinstance(v, NotWritten) for v in given):
            print(f"{ex.title}: not written yet: write your prediction above, then run this "
                  "cell again.")
            return
        key = (self.number, ex.title)
        old = _PREDICTIONS.get(key)
        if old is not None and old[1]:
            print(f"{ex.title}: your prediction is locked, since its measurement has been "
                  "shown; the check grades the one recorded before it.")
            return
        _PREDICTIONS[key] = [dict(zip(ex.provides, given)), False]
        shown = ", ".join(f"{k} = {_brief(v, 60)}" for k, v in zip(ex.provides, given))
        print("\n".join(textwrap.wrap(f"recorded for {short(ex.title)}: {shown}.", WIDTH)))
        print("You can change it until the measurement is shown; then it is locked.")

    def predicted(self, exercise: str | int) -> bool:
        """True once a prediction is recorded, which locks it (the measurement cell runs
        under ``if LAB.predicted("Exercise N"):``); otherwise say what to do first."""
        ex = self.find(exercise)
        recorded = _PREDICTIONS.get((self.number, ex.title))
        if recorded is None:
            print(f"{short(ex.title)}: the measurement is shown once your prediction is "
                  "recorded: write it, run its predict cell, then this one.")
            return False
        recorded[1] = True
        return True

    @property
    def minutes(self) -> int:
        return sum(e.minutes for e in self.exercises)

    @property
    def points(self) -> int:
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

    __repr__ = plan

    def reveal(self, exercise: str | int) -> str:
        return reveal(exercise, self.number)

    def grade(self, namespace: Mapping[str, Any]) -> list[CheckResult]:
        """Every exercise's notebook check on what ``namespace`` holds."""
        results = []
        for e in self.exercises:
            if all(n in namespace for n in e.provides):
                results.append(e.check(*(namespace[n] for n in e.provides)))
            else:
                reason = e.unmet()
                results.append(skipped(e.title, reason) if reason else not_written(e.title))
        return results

    def scorecard(self, namespace: Mapping[str, Any]) -> "Scorecard":
        """Re-run every check on ``namespace`` (pass ``globals()``) and total them."""
        return Scorecard(self, tuple(self.grade(namespace)))


@dataclasses.dataclass(frozen=True)
class Scorecard:
    """One line per exercise and the total: ``Lab N: k of M passed``."""

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
        width = max((len(r.exercise) for r in self.results), default=0)
        lines = []
        for r in self.results:
            line = f"  {_MARKS[r.status]:<11} {r.exercise:<{width}}"
            message = r.message if r.status != PASSED else ""
            if len(f"{line}  {message}") <= WIDTH or not message:
                lines.append(f"{line}  {message}".rstrip())
            else:
                lines.append(line.rstrip())
                lines += textwrap.wrap(textwrap.shorten(message, 2 * (WIDTH - 14)), WIDTH,
                                       initial_indent=" " * 14, subsequent_indent=" " * 14)
        note = ("These checks are feedback for you, on the inputs this notebook shows; "
                "grading runs your notebook again and tries inputs it does not show.")
        return "\n".join([*lines, self.total(), *textwrap.wrap(note, WIDTH)])

    __repr__ = __str__


def reveal(exercise: str | int, lab: int | None = None) -> str:
    """The expected answer of ``exercise`` (``"Exercise 3"``, its title or ``3``) from the
    last time its check ran in this kernel on an attempt of yours. Printed and returned."""
    matches = [r for (n, title), r in _LAST.items()
               if _title_matches(exercise, title) and lab in (None, n)]
    if not matches:
        known = [e for n, registry in _LABS.items() if lab in (None, n)
                 for e in registry.exercises if _title_matches(exercise, e.title)]
        text = (f"{exercise!r} has not been checked yet in this kernel: write your attempt, "
                "run its check cell, then ask again." if known or not _LABS else
                f"no open lab has an exercise {exercise!r}: name it by its number, e.g. "
                "reveal(3).")
    else:
        r = matches[-1]
        text = {NOT_WRITTEN: f"{r.exercise}: not written yet. The answer is shown after an "
                             "attempt of yours has been checked.",
                SKIPPED: f"{r.exercise}: this runtime cannot check it, so nothing to show.",
                PASSED: f"{r.exercise}: you passed; there is nothing to reveal."}.get(
            r.status, f"{r.exercise}: {r.answer}" if r.answer else
            f"{r.exercise}: your last attempt could not be compared with the expected answer "
            f"({r.message}). Fix that, run the check again, then ask again.")
    print(text)
    return text


# -- handing a lab in ----------------------------------------------------------------------

#: The output data type (and metadata key) that carries a hand-in record in the .ipynb.
HAND_IN_TYPE = "application/vnd.tpu-course.hand-in+json"
#: Where a learner's id may come from when the hand-in cell does not give it.
HAND_IN_ENV = "TPU_COURSE_LEARNER"


def hand_in(lab: Any, learner: Any = None) -> None:
    """Mark this notebook as ``learner``'s hand-in of ``lab`` (a :class:`Lab` or its
    number): an output of this cell carries ``{"tpu_course": {"learner", "lab",
    "handed_in"}}`` in its metadata, which Jupyter, Colab and Kaggle save in the .ipynb
    and the grader reads. ``learner`` defaults to the ``TPU_COURSE_LEARNER`` environment
    variable; with neither, it prints how to give one and records nothing. It never
    waits for input, so "Run all" runs through it."""
    import datetime
    import os

    number = getattr(lab, "number", lab)
    given = learner if isinstance(learner, str) and learner.strip() else os.environ.get(
        HAND_IN_ENV, "")
    who = " ".join(str(given).split())
    if not who or len(who) > 128 or not who.isprintable():
        said = ("is not a usable id (at most 128 characters, on one line)" if who else
                "has no id yet")
        print(textwrap.fill(
            f"This hand-in {said}: write the id your instructor asked for (your course "
            "login or e-mail) between the quotes above, e.g. MY_ID = \"ada.lovelace\", and "
            f"run this cell again (or set the {HAND_IN_ENV} environment variable).", WIDTH))
        return
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = {"learner": who, "lab": number, "handed_in": when}
    text = (textwrap.fill(f"Lab {number} handed in as {who!r} at {when}. Now save the "
                          "notebook with this output in it:", WIDTH) + "\n"
            "  Colab:   File > Download > Download .ipynb\n"
            "  Kaggle:  File > Download notebook\n"
            "  Jupyter: File > Save Notebook (the .ipynb file is what you hand in)\n"
            + textwrap.fill("then upload that file where your instructor asked (a shared "
                            "folder or the course's assignment page). Run this cell again "
                            "after any change.", WIDTH))
    try:
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None:
        print(text)
        return
    display({"text/plain": text, HAND_IN_TYPE: record}, raw=True,
            metadata={"tpu_course": record})

"""Lab 2 (measure a runtime yourself): each exercise declared once.

Exercises 2 and 3 run the learner's timer on a *virtual clock*: the probe hands it an
instrumented function (or ``jax.device_put``) built fresh for each input, whose calls
take known, varying times and finish only when waited for, and points the clocks the
learner's code reads (``time``, ``timeit`` and what was imported from them) at that clock.
It returns what the timer returned and what the clock saw (which calls each timed interval
held, whether the timer waited); ``expect`` times a fresh instrument of the same input in
the checker's process. A typed-in or cached time does not follow the hidden inputs, whose
speeds come from the grader's secret. References, hidden cases and known mistakes live in
the repository's ``grading/ch02.py`` (see :mod:`tpu_course.checks.engine`).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
import timeit
import types
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from tpu_course import hardware
from tpu_course.checks.engine import Case, Exercise, Lab, Mistake, Wrong, close, equal, number

LAB = Lab(2, "Measure a runtime yourself")

EX3 = "Exercise 3 (host-to-device bandwidth)"
#: Exercise 3's measurement cell copies this array (float32: 64 MiB); Exercise 4 predicts
#: a copy of the other (float32: 256 MiB).
BANDWIDTH_SHAPE = (4096, 4096)
COPY_SHAPE = (8192, 8192)


# -- Exercise 1: matmul FLOPs ------------------------------------------------------------------

check_matmul_flops = LAB.add(Exercise(
    "Exercise 1 (matmul FLOPs)", minutes=5, provides=("matmul_flops",),
    cases=tuple(Case(f"({m}x{k}) @ ({k}x{n})", {"m": m, "k": k, "n": n})
                for m, k, n in ((2, 3, 4), (128, 256, 512), (1, 1000, 7))),
    probe=lambda answer, case: number(answer["matmul_flops"](*case.args.values()),
                                      "your FLOP count"),
    compare=equal("your FLOP count"), hint="count the outputs, then the work per output"))


# -- the virtual clock of Exercises 2 and 3 ----------------------------------------------------


class _Clock:
    """Moves only when the instrumented work says so; logs ``("read", t)``, ``("start", k)``
    (call or copy k began) and ``("wait", leaf)``."""

    def __init__(self) -> None:
        self.now, self.events = 1000.0, []

    def read(self) -> float:
        self.now += 1e-6  # a reading takes a microsecond
        self.events.append(("read", self.now))
        return self.now

    def read_ns(self) -> int:
        return int(self.read() * 1e9)


class _Pending:
    """One leaf of an instrumented result (a copy: ``value``'s attributes), ready at
    ``ready_at``; waiting for it, or reading it into NumPy, moves the clock."""

    def __init__(self, clock: _Clock, ready_at: float, leaf: str, value: Any = None) -> None:
        self._clock, self._ready_at, self._leaf, self._value = clock, ready_at, leaf, value

    def block_until_ready(self) -> "_Pending":
        self._clock.now = max(self._clock.now, self._ready_at)
        self._clock.events.append(("wait", self._leaf))
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.block_until_ready()
        return np.asarray(np.zeros((2, 2)) if self._value is None else self._value, dtype)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._value, name)


class _Work:
    """Call (or copy) ``k`` returns after ``dispatch_s`` (the first also compiles for
    ``first_s``) and is done ``seconds(k)`` after the one before it."""

    def __init__(self, clock: _Clock, seconds: Callable[[int], float], first_s: float = 0.0,
                 dispatch_s: float = 40e-6) -> None:
        self.clock, self.seconds, self.first_s, self.dispatch_s = clock, seconds, first_s, dispatch_s
        self.calls, self.busy_until = 0, 0.0

    def start(self) -> float:
        self.calls += 1
        self.clock.events.append(("start", self.calls))
        self.clock.now += self.dispatch_s + (self.first_s if self.calls == 1 else 0.0)
        self.busy_until = max(self.clock.now, self.busy_until) + self.seconds(self.calls)
        return self.busy_until


@contextlib.contextmanager
def _virtual_time(fn: Any, clock: _Clock, swaps: Mapping[int, Any] | None = None
                  ) -> Iterator[None]:
    """While the learner's ``fn`` runs, the clocks it can read are ``clock``: the modules
    ``time`` and ``timeit`` and the functions imported from them, found by identity in the
    namespaces of ``fn`` and of the functions its closure holds, and in ``sys.modules``
    (an ``import time`` inside it); the objects in ``swaps`` (by id) are swapped too."""
    fake_time, fake_timeit = types.ModuleType("time"), types.ModuleType("timeit")
    fake_time.__dict__.update(vars(time), perf_counter_ns=clock.read_ns, time_ns=clock.read_ns,
                              monotonic_ns=clock.read_ns, perf_counter=clock.read,
                              time=clock.read, monotonic=clock.read)
    fake_timeit.__dict__.update(vars(timeit), default_timer=clock.read)
    table = {id(time): fake_time, id(timeit): fake_timeit, **(swaps or {})}
    table |= {id(getattr(time, n)): getattr(fake_time, n) for n in (
        "perf_counter", "time", "monotonic", "perf_counter_ns", "time_ns", "monotonic_ns")}
    table[id(timeit.default_timer)] = clock.read
    inner = [getattr(c, "cell_contents", None) for c in getattr(fn, "__closure__", None) or ()]
    spaces = {id(g): g for f in (fn, *inner) if isinstance(g := getattr(
        getattr(f, "func", f), "__globals__", None), dict)}
    patched = [(g, k, v) for g in (*spaces.values(), sys.modules) for k, v in list(g.items())
               if id(v) in table and not str(k).startswith("__")]
    for g, k, v in patched:
        g[k] = table[id(v)]
    try:
        yield
    finally:
        for g, k, v in reversed(patched):
            g[k] = v


def _observed(clock: _Clock, value: Any, what: str) -> dict:
    """The learner's value and what the clock saw: the timed intervals (seconds, how many
    calls started in them, whether the first did), whether the clock was read, and what
    was waited for."""
    intervals, last, started = [], None, []
    for event in clock.events:
        if event[0] == "read":
            if last is not None and started:
                intervals.append((event[1] - last, len(started), 1 in started))
            last, started = event[1], []
        elif event[0] == "start" and last is not None:
            started.append(event[1])
    waits = {e[1] for e in clock.events if e[0] == "wait"}
    return {"value": number(value, what), "calls": sum(e[0] == "start" for e in clock.events),
            "read": last is not None, "intervals": intervals,
            "waited": "all" if "big" in waits else "one leaf" if waits else "none"}


def _band(want: Mapping[str, Any], value: float, factor: float = 1.0) -> bool:
    """Whether ``value / factor`` lies among what the instrument measured (5 % margins)."""
    return 0.95 * min(want["each"]) <= value / factor <= 1.05 * max(want["each"])


def _judge(rules: tuple, generic: str) -> tuple[Callable, tuple[Mistake, ...]]:
    """One table of ``(when(got, want, case), message, hint)``, used twice: the compare
    returns the first message that applies (else the generic one when the value is not
    among the measured ones), and each row is a rule that names its mistake."""

    def compare(got: Any, want: Any, case: Case) -> str | None:
        message = next((m for when, m, _ in rules if when(got, want, case)), None)
        if message is None and not _band(want, got["value"]):
            message = generic.format(ratio=got["value"] / statistics.median(want["each"]))
        return message

    return compare, tuple(Mistake(hint, when=when) for when, _, hint in rules)


def _timed_alone(clock: _Clock, start: Callable[[], Any], n: int) -> list[float]:
    """The instrument's timer: ``start()`` once untimed, then ``n`` times one by one, then
    ``n`` in flight together: the seconds of each, and per call of the group."""
    wait = lambda out: [leaf.block_until_ready() for leaf in (
        out.values() if isinstance(out, dict) else out if isinstance(out, tuple) else [out])]
    wait(start())
    each = []
    for _ in range(n):
        t0 = clock.read()
        wait(start())
        each.append(clock.read() - t0)
    t0, group = clock.read(), [start() for _ in range(n)]
    [wait(out) for out in group]
    return [*each, (clock.read() - t0) / n]


# -- Exercise 2: timing a call -------------------------------------------------------------------

#: How each call after the first varies around the case's ``work_s``.
_WORK_FACTORS = (1.0, 1.24, 0.86, 1.12, 0.92, 1.18, 0.81, 1.07, 0.95, 1.3)
BLOCK_HINT = ("jax.block_until_ready(result) waits for every leaf of a dict or tuple (a "
              "pytree); result.block_until_ready() exists only on a single array")


def _device(case: Case) -> tuple[_Clock, Callable, tuple]:
    """A fresh instrumented jitted function for ``case`` and the arguments it takes."""
    clock = _Clock()
    work = _Work(clock, lambda k: case.args["work_s"] * _WORK_FACTORS[k % 10],
                 case.args["compile_s"])
    args = tuple(np.full((2, 2), i, np.float32) for i in range(case.args["nargs"]))

    def fn(*given: Any) -> Any:
        if len(given) != len(args) or any(g is not a for g, a in zip(given, args)):
            raise TypeError(f"fn takes the {len(args)} argument(s) time_call was given")
        done = work.start()
        small, big = _Pending(clock, clock.now, "small"), _Pending(clock, done, "big")
        return {"dict": {"small": small, "big": big}, "tuple": (small, big),
                "array": big}[case.args["result"]]

    return clock, fn, args


def _probe_timer(answer: Mapping[str, Any], case: Case) -> dict:
    clock, fn, args = _device(case)
    try:
        with _virtual_time(answer["time_call"], clock):
            value = answer["time_call"](fn, *args)
    except AttributeError as err:
        if "block_until_ready" not in str(err):
            raise
        raise Wrong(f"your timer raised AttributeError: {err}: fn returns a "
                    f"{case.args['result']} of arrays here", BLOCK_HINT) from None
    return _observed(clock, value, "the seconds per call")


def measure_calls(case: Case) -> dict:
    """The instrument: a fresh function of ``case`` timed by the checker (seconds a call)."""
    clock, fn, args = _device(case)
    return {"each": _timed_alone(clock, lambda: fn(*args), len(_WORK_FACTORS))}


def _total(g: dict) -> list[float]:
    return [s for s, n, _ in g["intervals"] if n > 1] + [sum(s for s, *_ in g["intervals"])]


_TIMER_RULES = (
    (lambda g, w, c: g["calls"] == 0, "your function never called fn",
     "call fn(*args) and time it"),
    (lambda g, w, c: g["waited"] == "none", "your timer never waited for the result",
     "JAX returns before the device has finished: wrap the call in "
     "jax.block_until_ready(...) before stopping the clock"),
    (lambda g, w, c: g["waited"] == "one leaf", "your timer waited for one leaf of the "
     "result only", f"you waited for one leaf (result['small']?): {BLOCK_HINT}"),
    (lambda g, w, c: not g["read"], "your answer was not measured: your code read no clock "
     "while it ran", "read time.perf_counter() before the calls and again after waiting for "
     "them; return what it measured, not a number you typed"),
    (lambda g, w, c: not g["intervals"], "none of your clock readings surround a call of fn",
     "start = time.perf_counter(); call and wait; time.perf_counter() - start"),
    (lambda g, w, c: g["calls"] == 1, "you called fn once: that one call includes the "
     "compilation", "call it once untimed (warm-up), then time several calls"),
    (lambda g, w, c: any(first for *_, first in g["intervals"]), "your timed region "
     "includes the first call of fn, which compiles: this time was not warmed up",
     "call fn once and wait for it BEFORE you start the clock (warm-up); then time the calls "
     "after it (a median does not remove the compile when it sits inside a timed region)"),
    (lambda g, w, c: sum(n for _, n, _ in g["intervals"]) == 1, "you timed a single call "
     "after the warm-up", "one sample can be a hiccup: time several calls and take the "
     "median (or the minimum)"),
    (lambda g, w, c: not _band(w, g["value"]) and any(
        math.isclose(g["value"], s, rel_tol=0.05) for s in _total(g)), "you returned the "
     "total time of the calls you timed", "divide the total by the number of calls you timed"),
    (lambda g, w, c: _band(w, g["value"], 1e3), "your time is about 1000x a call's",
     "that is milliseconds: return seconds"),
    (lambda g, w, c: _band(w, g["value"], 1e6), "your time is about a million times a "
     "call's", "that is microseconds: return seconds"),
    (lambda g, w, c: 0 < g["value"] < 0.7 * min(w["each"]) and any(
        math.isclose(g["value"], s / n, rel_tol=0.1) for s, n, _ in g["intervals"]),
     "your time is shorter than a call takes: your clock stopped before the work was done",
     "stop the clock only after jax.block_until_ready(result) has returned"),
)
_timer_compare, _TIMER_NAMED = _judge(
    _TIMER_RULES, "your time is {ratio:.3g}x the median of the calls the checker timed")

check_time_call = LAB.add(Exercise(
    "Exercise 2 (timing a call)", minutes=15, provides=("time_call",),
    cases=(Case("a function of one argument returning a dict: 31 ms a call, 0.6 s to compile",
                {"work_s": 0.031, "compile_s": 0.6, "nargs": 1, "result": "dict"}),),
    probe=_probe_timer, expect=measure_calls, compare=_timer_compare, rules=_TIMER_NAMED,
    success="warmed up, several calls timed, the whole result waited for",
    hint="return what your timer measured (the median, or the minimum, of the per-call "
         "times): a number typed in does not follow the function when its speed changes"))


# -- Exercise 3: host-to-device bandwidth ------------------------------------------------------

#: How each copy's time varies: the first pays for warming the allocator up.
_COPY_FACTORS = (3.0, 1.0, 1.08, 0.93, 1.04, 0.97, 1.1, 0.9, 1.02)


def _link(case: Case) -> tuple[_Clock, Callable, np.ndarray]:
    """A fresh host array of ``case`` and a ``device_put`` whose copies land ``bytes /
    link_bytes_per_s`` (times the copy's factor) after the one before."""
    clock = _Clock()
    host = np.ones(case.args["shape"], case.args["dtype"])
    rate = case.args["link_bytes_per_s"]
    work = _Work(clock, lambda k: 30e-6 + host.nbytes / rate * _COPY_FACTORS[min(k, 9) - 1],
                 dispatch_s=20e-6)
    return clock, lambda x, *a, **kw: _Pending(clock, work.start(), "big", np.asarray(x)), host


def _probe_bandwidth(answer: Mapping[str, Any], case: Case) -> dict:
    import jax

    clock, device_put, host = _link(case)
    real, jax.device_put = jax.device_put, device_put
    try:
        with _virtual_time(answer["h2d_bandwidth"], clock, {id(real): device_put}):
            value = answer["h2d_bandwidth"](host)
    finally:
        jax.device_put = real
    return _observed(clock, value, "the bandwidth")


def measure_link(case: Case) -> dict:
    """The instrument: a fresh link of ``case`` timed by the checker (bytes per second)."""
    clock, device_put, host = _link(case)
    return {"each": [host.nbytes / s for s in _timed_alone(
        clock, lambda: device_put(host), len(_COPY_FACTORS) - 1)]}


def _units(factor: Any, message: str, hint: str) -> tuple:
    return (lambda g, w, c: _band(w, g["value"], factor(c) if callable(factor) else factor),
            message, hint)


def _nbytes(case: Case) -> int:
    return math.prod(case.args["shape"]) * np.dtype(case.args["dtype"]).itemsize


_LINK_RULES = (
    (lambda g, w, c: g["calls"] == 0, "your code never called jax.device_put",
     "copy the array with jax.device_put(host_array): the check follows those copies"),
    (lambda g, w, c: g["waited"] == "none", "your timer never waited for a copy to land: "
     "jax.device_put returns before the copy is done, so you timed the call, not the copy",
     "jax.device_put(host_array).block_until_ready() inside the timed region, before you "
     "stop the clock"),
    (lambda g, w, c: not g["read"], "your answer was not measured: your code read no clock "
     "while it copied", "time each copy with time.perf_counter() and return bytes / seconds"),
    (lambda g, w, c: not g["intervals"], "none of your clock readings surround a copy",
     "start = time.perf_counter(); copy and wait; time.perf_counter() - start"),
    (lambda g, w, c: g["value"] > 1.5 * max(w["each"]) and not _band(w, g["value"], 8),
     "your bandwidth is faster than the link: your clock stopped before the copy had "
     "landed", "wait for the copy (block_until_ready) inside the timed region, then read "
     "the clock"),
    _units(lambda c: 1 / np.dtype(c.args["dtype"]).itemsize, "that is elements per second, "
           "not bytes per second", "bandwidth counts bytes: host_array.nbytes / seconds "
           "(host_array.size counts elements)"),
    _units(8, "that is bits per second, 8x the bytes per second",
           "bandwidth here is bytes per second: host_array.nbytes / seconds, no factor 8"),
    _units(1 / 8, "that is 8x too small: bytes divided by 8",
           "bandwidth here is bytes per second: host_array.nbytes / seconds"),
    (lambda g, w, c: _band(w, g["value"], 1e-9) or _band(w, g["value"], 2**-30),
     "that is GB/s (or GiB/s), not bytes per second",
     "return bytes per second (1e9 B/s = 1 GB/s, 2**30 B/s = 1 GiB/s)"),
    _units(1e-6, "that is MB/s, not bytes per second", "return bytes per second"),
    _units(1e-3, "that is 1000x too small: bytes per millisecond?",
           "divide by the seconds the copy took, not milliseconds"),
    (lambda g, w, c: 0.9 * _nbytes(c) / max(w["each"]) <= g["value"]
     <= 1.1 * _nbytes(c) / min(w["each"]), "that is the seconds a copy took, not a bandwidth",
     "bandwidth = host_array.nbytes / seconds"),
    (lambda g, w, c: not _band(w, g["value"]) and any(
        _band(w, g["value"], 1 / n) for _, n, _ in g["intervals"] if n > 1),
     "you divided the bytes of one copy by the time of several",
     "divide by the number of copies you timed (or time them one by one)"),
    (lambda g, w, c: not _band(w, g["value"]) and any(f for *_, f in g["intervals"]),
     "your answer includes the first copy, which is slower (it warms the allocator up)",
     "make one untimed copy first, then time the others"),
)
_link_compare, _LINK_NAMED = _judge(
    _LINK_RULES, "your bandwidth is {ratio:.3g}x the median of the copies the checker timed")

check_h2d_bandwidth = LAB.add(Exercise(
    EX3, minutes=10, provides=("h2d_bandwidth",),
    cases=(Case("a float32 2048 x 1024 array (8 MiB) on a 7.3 GB/s link",
                {"shape": (2048, 1024), "dtype": "float32", "link_bytes_per_s": 7.3e9}),),
    probe=_probe_bandwidth, expect=measure_link, compare=_link_compare, rules=_LINK_NAMED,
    success="bytes per second of warm copies, each waited for",
    hint="bytes of the array / seconds of one copy, from your own timing; a number typed "
         "in does not follow the link"))


# -- Exercise 4: predict a copy ------------------------------------------------------------------


def copy_seconds(shape: tuple[int, ...], repeats: int = 3) -> float:
    """The instrument: seconds to copy a float32 array of ``shape`` to the default device
    now, the median of ``repeats`` copies after a warm-up."""
    from tpu_course import transfer

    host = np.ones(shape, np.float32)
    transfer.time_h2d(host)
    return statistics.median(transfer.time_h2d(host) for _ in range(repeats))


def _copy_ratio(got: Any, case: Case) -> float:
    """The prediction over the arithmetic from the learner's own bandwidth."""
    return got[0] / (math.prod(case.args["shape"]) * 4 / got[1])


def _copy_compare(got: Any, want: float, case: Case) -> str | None:
    predicted, bandwidth = got
    if bandwidth <= 0:
        raise Wrong("your measured bandwidth is not positive: fix Exercise 3 first",
                    "bandwidth = h2d_bandwidth(...), in bytes per second")
    if predicted <= 0:
        return "a time must be positive"
    arithmetic = math.prod(case.args["shape"]) * 4 / bandwidth
    if not math.isclose(predicted, arithmetic, rel_tol=0.25):
        return f"your prediction is {predicted / arithmetic:.3g}x bytes / your bandwidth"
    if not 1 / 5 <= arithmetic / want <= 5:
        return (f"your bandwidth, {bandwidth / 1e9:.3g} GB/s, says a copy takes "
                f"{arithmetic * 1e3:.3g} ms; copies timed now take {want * 1e3:.3g} ms")
    return None


def _ratio_rule(factor: float, hint: str) -> Mistake:
    return Mistake(hint, when=lambda got, want, case: math.isclose(
        _copy_ratio(got, case), factor, rel_tol=0.1))


check_copy_prediction = LAB.add(Exercise(
    "Exercise 4 (predict a copy)", minutes=10, kind="predict",
    provides=("predicted_copy_s", "bandwidth"),
    cases=(Case(f"a float32 {COPY_SHAPE[0]} x {COPY_SHAPE[1]} array", {"shape": COPY_SHAPE}),),
    probe=lambda answer, case: (number(answer["predicted_copy_s"], "predicted_copy_s"),
                                number(answer["bandwidth"], "your measured bandwidth")),
    expect=lambda case: copy_seconds(case.args["shape"]), compare=_copy_compare,
    success="a large copy takes its bytes over the link's bandwidth, give or take how busy "
            "the machine is",
    rules=(_ratio_rule(0.5, "you counted 2 bytes per element (bf16?): this array is "
                            "float32, 4 bytes each"),
           _ratio_rule(0.25, "count bytes, not elements (x 4 for float32), of the whole "
                             "8192 x 8192 array (not Exercise 3's smaller one)"),
           _ratio_rule(1 / 8, "bytes / (bytes per second): did you divide by a bandwidth in "
                              "bits per second?"),
           _ratio_rule(8, "you counted bits: the bandwidth is in bytes per second"),
           _ratio_rule(2, "float32 is 4 bytes per element, not 8"),
           _ratio_rule(1e3, "that is milliseconds: give seconds"),
           _ratio_rule(1e-3, "give seconds, bytes / (bytes per second)"),
           Mistake("time = bytes / (bytes per second), not bandwidth / bytes",
                   when=lambda got, want, case: math.isclose(
                       got[0], got[1] / (math.prod(case.args["shape"]) * 4), rel_tol=0.1)),
           Mistake("bandwidth = h2d_bandwidth(...) as Exercise 3 measured it, on this runtime",
                   when=lambda got, want, case: math.isclose(_copy_ratio(got, case), 1,
                                                             rel_tol=0.25))),
    hint="time = bytes / bandwidth: the bytes of a float32 8192 x 8192 array, divided by the "
         "`bandwidth` you measured in Exercise 3"))


# -- Exercise 5: fraction of peak -----------------------------------------------------------------

#: The chips of the hardware table with a dense bf16 peak.
PEAK_CHIPS = tuple(c for c in ("v5e", "v4", "v5p", "v6e", "a100", "h100", "v3", "7x")
                   if hardware.bf16_matrix_peak(hardware.get(c)) is not None)


def _other_chip(got: Any, want: Any, case: Case) -> bool:
    flops, seconds, chip = (case.args[k] for k in ("flops", "seconds", "chip"))
    return any(math.isclose(got, flops / seconds / hardware.get(c).peak_bf16_flops_per_s,
                            rel_tol=1e-6) for c in PEAK_CHIPS if c != chip)


check_fraction_of_peak = LAB.add(Exercise(
    "Exercise 5 (fraction of peak)", minutes=5, provides=("fraction_of_peak",),
    cases=(Case("an 8192^3 matmul in 10 ms on a v5e",
                {"flops": 2 * 8192**3, "seconds": 0.01, "chip": "v5e"}),),
    probe=lambda answer, case: number(answer["fraction_of_peak"](*case.args.values()),
                                      "the fraction"),
    compare=close(1e-6, what="your fraction"),
    rules=(Mistake("take the peak of the chip you are given: hardware.get(chip)",
                   when=_other_chip),),
    hint="take the peak from tpu_course.hardware.get(chip).peak_bf16_flops_per_s"))


# -- Exercise 6: where this chip reaches half its peak -------------------------------------------

#: The sweep's sizes, and how far a rate may be from half the peak (machines vary).
SWEEP = (128, 256, 512, 1024, 2048, 4096, 8192)
SLACK = 1.5


def sweep_fractions() -> dict[int, float]:
    """The instrument: each square bf16 matmul's rate over this chip's bf16 peak, timed
    with the course's harness (``tpu_course.bench``)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import bench, runtime

    described = runtime.describe()
    if described.platform == "cpu":
        return {}  # nothing to sweep: the check is skipped before this is read
    peak = hardware.bf16_matrix_peak(described.chip)
    if peak is None:
        raise LookupError("this chip has no bf16 matrix peak in the table (bf16 is emulated "
                          "there), so half of it is not defined")
    out = {}
    for n in SWEEP:
        a = jnp.ones((n, n), jnp.bfloat16)
        r = bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=5, warn=False)
        out[n] = 2 * n**3 / r.median_s / peak
    return out


def _half_compare(got: Any, want: Mapping[int, float], case: Case) -> str | None:
    if got is None:
        return None if want[SWEEP[-1]] < 0.5 * SLACK else (
            f"an 8192 matmul reaches {want[SWEEP[-1]]:.0%} of the peak here")
    if got not in want:
        raise Wrong(f"{got} is not a size of the sweep {SWEEP}", "give the side n of the "
                    "n x n matmul, or None")
    if want[got] < 0.5 / SLACK:
        return f"a {got}x{got} matmul reaches only {want[got]:.0%} of the peak here"
    smaller = want.get(got // 2, 0.0)
    if smaller >= 0.5 * SLACK:
        return f"a smaller matmul, {got // 2}x{got // 2}, already reaches {smaller:.0%}"
    return None


check_half_peak = LAB.add(Exercise(
    "Exercise 6 (where this chip reaches half its peak)", minutes=15, kind="apply",
    needs="accelerator", provides=("half_peak_n",),
    probe=lambda answer, case: None if answer["half_peak_n"] is None else int(
        number(answer["half_peak_n"], "half_peak_n")),
    expect=lambda case: sweep_fractions(), compare=_half_compare,
    hint="compare each size's FLOP/s with the chip's bf16 peak (hardware), not with the best "
         "rate your sweep saw, and take the FIRST size that gets to 50 %"))

"""Checkers for lab 2: FLOP counts, timing a call correctly, transfer bandwidth, peak.

The timing and bandwidth checkers grade what the learner's timer measured, not a CPU
timing: they hand the learner's code a *virtual clock* in place of ``time.perf_counter``
(and ``time.time``, ``time.monotonic``, ``timeit.default_timer``, under whatever name the
learner's code holds them) and instrumented work that moves it. ``check_time_call`` hands
over a function whose first call "compiles" and whose later calls take known, varying
times, finishing asynchronously; ``check_h2d_bandwidth`` replaces ``jax.device_put`` by a
copy that has landed only once the learner waits for it. Every clock reading, call, copy
and wait is logged, so the check knows which calls each timed interval held, whether the
first call was timed, whether the timer waited, and what the learner's own samples were:
a constant, a total not divided by the count, elements for bytes, bits or milliseconds
are each named, and the verdict does not depend on how busy the machine is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import time
import timeit
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from tpu_course import hardware, roofline
from tpu_course.checks._answers import ch02 as reference
from tpu_course.checks._core import (
    CheckResult,
    Lab,
    as_number,
    close_enough,
    learner_globals,
    ok,
    refuse,
    refuse_course_code,
    skipped,
)

LAB = Lab(2, "Measure a runtime yourself")

EX1 = "Exercise 1 (matmul FLOPs)"
EX2 = "Exercise 2 (timing a call)"
EX3 = "Exercise 3 (host-to-device bandwidth)"
EX4 = "Exercise 4 (predict a copy)"
EX5 = "Exercise 5 (fraction of peak)"
EX6 = "Exercise 6 (where this chip reaches half its peak)"

#: Exercise 3 measures on this array shape (float32: 64 MiB), Exercise 4 predicts this one.
BANDWIDTH_SHAPE = (4096, 4096)
COPY_SHAPE = (8192, 8192)  # float32: 256 MiB


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


# -- Exercise 1 ------------------------------------------------------------------------


def _hidden_shapes(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    m, k, n = (int(v) for v in rng.integers(2, 3000, 3))
    return [("another matmul shape, with m, k and n all different",
             {"shapes": ((m, k, n), (int(rng.integers(1, 9)), 1, int(rng.integers(100, 999))))})]


@LAB.exercise(EX1, minutes=5, kind="write", hidden=_hidden_shapes)
def check_matmul_flops(matmul_flops: Callable[[int, int, int], Any],
                       shapes: Sequence[tuple[int, int, int]] = ((2, 3, 4), (128, 256, 512),
                                                                 (1, 1000, 7))) -> CheckResult:
    """Exercise 1: FLOPs of an (m x k) @ (k x n) matmul are 2·m·k·n."""
    from tpu_course import hlo

    refuse_course_code(EX1, matmul_flops, reference.matmul_flops, roofline.matmul_flops,
                       hlo.inspect)
    for m, k, n in shapes:
        want = 2 * m * k * n
        got = as_number(EX1, matmul_flops(m, k, n), f"matmul_flops({m}, {k}, {n})")
        if got == want:
            continue
        answer = f"({m}x{k}) @ ({k}x{n}): {want:,} FLOPs"
        if got == m * k * n:
            refuse(EX1, f"for {m}x{k} @ {k}x{n} you counted multiply-accumulates",
                   hint="each MAC is a multiply and an add: 2 FLOPs", answer=answer)
        if got in (2 * m * n, 2 * m * k, 2 * k * n, m * n, m * k, k * n):
            refuse(EX1, f"for {m}x{k} @ {k}x{n} one dimension is missing",
                   hint="every output element c[i,j] needs k multiply-adds", answer=answer)
        refuse(EX1, f"for ({m}x{k}) @ ({k}x{n}) your count is off by a factor of "
                    f"{got / want:.3g}", hint="count the outputs, then the work per output",
               answer=answer)
    return ok(EX1, "2·m·k·n: one multiply and one add per (i, j, k) triple.")


# -- the virtual clock of Exercises 2 and 3 ----------------------------------------------


class _Clock:
    """A clock that moves only when the instrumented work says so, and logs every event:
    ``("read", t)`` when the learner's code reads it, ``("call", k)`` / ``("copy", k)``
    when work is started, ``("wait", k, leaf)`` when the learner waits for it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.events: list[tuple[Any, ...]] = []

    def read(self) -> float:
        self.now += 1e-6  # a reading takes a microsecond, so two readings differ
        self.events.append(("read", self.now))
        return self.now

    def read_ns(self) -> int:
        return int(self.read() * 1e9)

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)


@contextlib.contextmanager
def _virtual_time(answer: Any, clock: _Clock, swaps: dict[int, Any] | None = None
                  ) -> Iterator[None]:
    """Point the clocks the learner's code can read (``time``, ``timeit`` and the
    functions imported from them, in its own namespaces) at ``clock`` while it runs; also
    swap the other objects in ``swaps`` (by id). Everything is put back afterwards."""
    fake_time = types.ModuleType("time")
    fake_time.__dict__.update(vars(time))
    fake_timeit = types.ModuleType("timeit")
    fake_timeit.__dict__.update(vars(timeit))
    table: dict[int, Any] = {id(time): fake_time, id(timeit): fake_timeit}
    for name in ("perf_counter", "time", "monotonic"):
        setattr(fake_time, name, clock.read)
        table[id(getattr(time, name))] = clock.read
    for name in ("perf_counter_ns", "time_ns", "monotonic_ns"):
        setattr(fake_time, name, clock.read_ns)
        table[id(getattr(time, name))] = clock.read_ns
    fake_timeit.default_timer = clock.read
    table[id(timeit.default_timer)] = clock.read
    table.update(swaps or {})
    patched: list[tuple[dict, str, Any]] = []
    try:
        for g in learner_globals(answer, depth=3):
            for name, value in list(g.items()):
                new = table.get(id(value))
                if new is not None and not name.startswith("__"):
                    patched.append((g, name, value))
                    g[name] = new
        yield
    finally:
        for g, name, value in reversed(patched):
            g[name] = value


@dataclasses.dataclass
class _Interval:
    """The time between two consecutive clock readings and the work started in it."""

    seconds: float
    started: list[int]  # call or copy numbers started between the two readings


def _intervals(events: list[tuple[Any, ...]], kind: str) -> list[_Interval]:
    """The intervals between consecutive readings that started at least one ``kind``."""
    out, last, started = [], None, []
    for event in events:
        if event[0] == "read":
            if last is not None and started:
                out.append(_Interval(event[1] - last, started))
            last, started = event[1], []
        elif event[0] == kind and last is not None:
            started.append(event[1])
    return out


# -- Exercise 2 ------------------------------------------------------------------------

#: How each call after the first varies around ``work_s``: a real timer tracks this, a
#: typed-in number does not.
_WORK_FACTORS = (1.0, 1.24, 0.86, 1.12, 0.92, 1.18, 0.81, 1.07, 0.95, 1.3)
_DISPATCH_S = 40e-6  # a call returns after this, with its work still queued


@dataclasses.dataclass
class _Pending:
    """One leaf of an instrumented call's result: ready at ``ready_at`` (virtual time)."""

    ready_at: float
    device: _Device
    call: int
    leaf: str

    def block_until_ready(self) -> _Pending:
        self.device.clock.wait_until(self.ready_at)
        self.device.clock.events.append(("wait", self.call, self.leaf))
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # np.asarray waits
        self.block_until_ready()
        return np.zeros((2, 2), dtype or np.float32)


@dataclasses.dataclass
class _Device:
    """The function the learner's timer is handed: call ``k`` (from 1) returns after
    ``_DISPATCH_S`` with a dict of two leaves, a small one ready at once and a big one
    ready when its work is done; the device runs one call's work at a time. The first call
    also compiles (``compile_s``, before it returns), as a jitted function's does."""

    clock: _Clock
    compile_s: float
    work_s: float
    calls: int = 0
    busy_until: float = 0.0

    def work_of(self, call: int) -> float:
        return self.work_s * _WORK_FACTORS[call % len(_WORK_FACTORS)]

    def __call__(self, *args: Any) -> dict[str, _Pending]:
        self.calls += 1
        k = self.calls
        self.clock.events.append(("call", k))
        if k == 1:
            self.clock.now += self.compile_s
        self.clock.now += _DISPATCH_S
        self.busy_until = max(self.clock.now, self.busy_until) + self.work_of(k)
        return {"small": _Pending(self.clock.now, self, k, "small"),
                "big": _Pending(self.busy_until, self, k, "big")}


def _hidden_timing(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    return [("a slower function with a longer compile",
             {"work_s": float(rng.uniform(0.08, 0.4)), "compile_s": float(rng.uniform(2, 6))}),
            ("a fast function (a few milliseconds a call)",
             {"work_s": float(rng.uniform(0.002, 0.008)), "compile_s": 0.3})]


_BLOCK_HINT = ("jax.block_until_ready(result) waits for every leaf of a dict or tuple "
               "(a pytree); result.block_until_ready() exists only on a single array")


@LAB.exercise(EX2, minutes=15, kind="write", hidden=_hidden_timing)
def check_time_call(time_call: Callable[..., Any], work_s: float = 0.031,
                    compile_s: float = 0.6) -> CheckResult:
    """Exercise 2: seconds per call, after an untimed warm-up, waiting for the whole result.

    The learner's ``time_call(fn, x)`` gets an instrumented ``fn`` (:class:`_Device`) and a
    virtual clock: the first call compiles for ``compile_s``, later calls take ``work_s``
    times a factor that varies from call to call. It passes when the first call is outside
    every timed interval, more than one call is timed, the timer waited for the whole
    result, and the answer is one of the per-call times the learner's own readings saw
    (their median, mean or minimum all are) and not shorter than the work.
    """
    from tpu_course import bench

    refuse_course_code(EX2, time_call, reference.time_call, bench.benchmark)
    clock = _Clock()
    device = _Device(clock, compile_s, work_s)
    try:
        with _virtual_time(time_call, clock):
            value = time_call(device, np.ones((2, 2), np.float32))
    except AttributeError as err:
        if "block_until_ready" not in str(err):
            raise
        refuse(EX2, f"your timer raised AttributeError: {err}: fn returns a dict of arrays here",
               hint=_BLOCK_HINT)
    got = as_number(EX2, value, "the seconds per call")
    warm = [device.work_of(k) for k in range(2, max(device.calls, 2) + 1)]
    answer = (f"about {_ms(statistics.median(warm))} per call ({_ms(min(warm))} to "
              f"{_ms(max(warm))}); the first call took {compile_s:.1f} s more (compiling)")
    if device.calls == 0:
        refuse(EX2, "your function never called fn", hint="call fn(*args) and time it",
               answer=answer)
    waits = {(e[1], e[2]) for e in clock.events if e[0] == "wait"}
    if not any(leaf == "big" for _, leaf in waits):
        hint = (f"you waited for one leaf of the result only (result['small']?): {_BLOCK_HINT}"
                if waits else
                "JAX returns before the device has finished: wrap the call in "
                "jax.block_until_ready(...) before stopping the clock")
        refuse(EX2, "your timer never waited for the result to be ready", hint=hint,
               answer=answer)
    if not any(e[0] == "read" for e in clock.events):
        refuse(EX2, "your answer was not measured: your code read no clock while it ran",
               hint="read time.perf_counter() before the calls and again after waiting for "
                    "them; return what it measured, not a number you typed", answer=answer)
    timed = _intervals(clock.events, "call")
    if not timed:
        refuse(EX2, "none of your clock readings surround a call of fn",
               hint="start = time.perf_counter(); call and wait; time.perf_counter() - start",
               answer=answer)
    if device.calls == 1:
        refuse(EX2, "you called fn once: that one call includes the compilation",
               hint="call it once untimed (warm-up), then time several calls", answer=answer)
    if any(1 in iv.started for iv in timed):
        refuse(EX2, "your timed region includes the first call of fn, which compiles: this "
                    "time was not warmed up",
               hint="call fn once and wait for it BEFORE you start the clock (warm-up); then "
                    "time the calls after it (a median does not remove the compile when it "
                    "sits inside a timed region)", answer=answer)
    n_timed = sum(len(iv.started) for iv in timed)
    if n_timed == 1:
        refuse(EX2, "you timed a single call after the warm-up",
               hint="one sample can be a hiccup: time several calls and take the median "
                    "(or the minimum)", answer=answer)
    if got <= 0:
        refuse(EX2, f"a time must be positive, you returned {got!r}", answer=answer)
    per_call = [iv.seconds / len(iv.started) for iv in timed]
    low, high = 0.95 * min(per_call), 1.05 * max(per_call)
    if not low <= got <= high:
        totals = [iv.seconds for iv in timed if len(iv.started) > 1]
        totals.append(sum(iv.seconds for iv in timed))
        if any(close_enough(got, t, 0.05) for t in totals):
            refuse(EX2, f"you returned the total time of the {n_timed} calls you timed, not "
                        "the time of one call",
                   hint=f"divide the total by the number of calls you timed ({n_timed})",
                   answer=answer)
        if low <= got / 1e3 <= high:
            refuse(EX2, "your time is about 1000x the per-call times your timer measured",
                   hint="that is milliseconds: return seconds", answer=answer)
        if low <= got / 1e6 <= high:
            refuse(EX2, "your time is about a million times the per-call times your timer "
                        "measured", hint="that is microseconds: return seconds", answer=answer)
        mid = statistics.median(per_call)
        refuse(EX2, f"your answer is {got / mid:.3g}x the median of the per-call times your "
                    "own timer measured: it is not one of them",
               hint="return what your timer measured (the median, or the minimum, of the "
                    "per-call times): a number typed in, or computed some other way, does "
                    "not follow the function when its speed changes", answer=answer)
    if got < 0.7 * min(warm):
        refuse(EX2, f"your time is {statistics.median(warm) / got:.3g}x shorter than a call "
                    "takes: your clock stopped before the work was done",
               hint="stop the clock only after jax.block_until_ready(result) has returned",
               answer=answer)
    return ok(EX2, f"{_ms(got)} per call: warmed up (the compiling first call untimed), "
                   f"{n_timed} timed calls, waiting for the whole result; your number is what "
                   "your timer measured")


# -- Exercise 3 ------------------------------------------------------------------------

#: How each copy's time varies: the first pays for warming the allocator up.
_COPY_FACTORS = (3.0, 1.0, 1.08, 0.93, 1.04, 0.97, 1.1, 0.9, 1.02)
_COPY_LATENCY_S = 30e-6


class _Copy:
    """What the check's ``jax.device_put`` returns: the real device array, landed (in
    virtual time) at ``ready_at``; ``block_until_ready()`` (or ``jax.block_until_ready``,
    or reading it into NumPy) waits for it. Other attributes are the array's."""

    def __init__(self, array: Any, ready_at: float, link: _Link, copy: int) -> None:
        self._array, self._ready_at, self._link, self._copy = array, ready_at, link, copy

    def block_until_ready(self) -> Any:
        self._link.clock.wait_until(self._ready_at)
        self._link.clock.events.append(("wait", self._copy, "copy"))
        return self._array

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.block_until_ready(), dtype)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._array, name)

    def __repr__(self) -> str:
        return f"<a device_put copy in flight, {self._array.shape} {self._array.dtype}>"


@dataclasses.dataclass
class _Link:
    """The host-to-device link of the check: ``device_put`` makes the real copy, returns
    at once, and the copy lands ``bytes / bytes_per_s`` (times the copy's factor) later,
    one copy at a time."""

    clock: _Clock
    bytes_per_s: float
    original: Callable[..., Any]
    copies: int = 0
    busy_until: float = 0.0

    def seconds_of(self, copy: int, nbytes: int) -> float:
        factor = _COPY_FACTORS[min(copy, len(_COPY_FACTORS)) - 1]
        return _COPY_LATENCY_S + nbytes / self.bytes_per_s * factor

    def device_put(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        self.copies += 1
        k = self.copies
        self.clock.events.append(("copy", k))
        out = self.original(x, *args, **kwargs)
        self.clock.now += 20e-6
        nbytes = int(getattr(x, "nbytes", 0) or np.asarray(x).nbytes)
        self.busy_until = max(self.clock.now, self.busy_until) + self.seconds_of(k, nbytes)
        return _Copy(out, self.busy_until, self, k)


def _hidden_bandwidth(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    rows, cols = (int(v) for v in rng.integers(200, 900, 2))
    return [("a float16 array of another shape on a slower link",
             {"shape": (rows, cols), "dtype": "float16",
              "link_bytes_per_s": float(rng.uniform(1.5e9, 4e9))}),
            ("a float64 array on a faster link",
             {"shape": (cols, 300), "dtype": "float64",
              "link_bytes_per_s": float(rng.uniform(15e9, 40e9))})]


@LAB.exercise(EX3, minutes=10, kind="write", hidden=_hidden_bandwidth)
def check_h2d_bandwidth(h2d_bandwidth: Callable[[np.ndarray], Any],
                        shape: tuple[int, ...] = BANDWIDTH_SHAPE, dtype: str = "float32",
                        link_bytes_per_s: float = 7.3e9) -> CheckResult:
    """Exercise 3: host-to-device bandwidth in bytes per second for one array.

    During the check ``jax.device_put`` makes the real copy but returns before it has
    "landed": the copy takes ``nbytes / link_bytes_per_s`` (the first one 3x longer) of the
    virtual clock the learner's code reads, and counts only once waited for. The answer
    must be the array's bytes over one of the per-copy times the learner's readings saw
    (warm copies), and not faster than the link.
    """
    import jax

    from tpu_course import bench, transfer

    refuse_course_code(EX3, h2d_bandwidth, reference.h2d_bandwidth, transfer.time_h2d,
                       transfer.measure_transfers, bench.benchmark)
    host = np.ones(shape, dtype)
    clock = _Clock()
    link = _Link(clock, link_bytes_per_s, jax.device_put)
    jax.device_put = link.device_put
    try:
        with _virtual_time(h2d_bandwidth, clock, {id(link.original): link.device_put}):
            value = h2d_bandwidth(host)
    finally:
        jax.device_put = link.original
    got = as_number(EX3, value, "the bandwidth")
    per_copy = host.nbytes / link.seconds_of(2, host.nbytes)
    answer = (f"this link moves about {per_copy / 1e9:.3g} GB/s: {host.nbytes:,} bytes in "
              f"about {_ms(host.nbytes / per_copy)} per copy (the first copy 3x slower)")
    if link.copies == 0:
        refuse(EX3, "your code never called jax.device_put",
               hint="copy the array with jax.device_put(host_array): the check follows those "
                    "copies", answer=answer)
    if not any(e[0] == "wait" for e in clock.events):
        refuse(EX3, "your timer never waited for a copy to land: jax.device_put returns "
                    "before the copy is done, so what you timed is the call, not the copy",
               hint="jax.device_put(host_array).block_until_ready() (or "
                    "jax.block_until_ready(...)) inside the timed region, before you stop "
                    "the clock", answer=answer)
    if not any(e[0] == "read" for e in clock.events):
        refuse(EX3, "your answer was not measured: your code read no clock while it copied",
               hint="time each copy with time.perf_counter() and return bytes / seconds",
               answer=answer)
    timed = _intervals(clock.events, "copy")
    if not timed:
        refuse(EX3, "none of your clock readings surround a copy",
               hint="start = time.perf_counter(); copy and wait; time.perf_counter() - start",
               answer=answer)
    if got <= 0:
        refuse(EX3, "a bandwidth must be positive", answer=answer)
    warm = [iv for iv in timed if 1 not in iv.started] or timed
    rates = [host.nbytes * len(iv.started) / iv.seconds for iv in warm]
    low, high = 0.95 * min(rates), 1.05 * max(rates)
    if low <= got <= high:
        if got > 1.5 * per_copy:
            refuse(EX3, f"your bandwidth is {got / per_copy:.3g}x faster than the link: your "
                        "clock stopped before the copy had landed",
                   hint="wait for the copy (block_until_ready) inside the timed region, then "
                        "read the clock", answer=answer)
        return ok(EX3, f"{got / 1e9:.3g} GB/s in bytes per second, from the copies your code "
                       "timed after a warm-up, waiting for each to land")
    mid = statistics.median(rates)
    ratio = got / mid
    if any(close_enough(got, host.nbytes / iv.seconds, 0.05) for iv in timed
           if len(iv.started) > 1):
        refuse(EX3, "you divided the bytes of one copy by the time of several",
               hint="divide by the number of copies you timed (or time them one by one)",
               answer=answer)
    itemsize = host.dtype.itemsize
    named = [
        (1 / itemsize, "that is elements per second, not bytes per second",
         (f"bandwidth counts bytes: host_array.nbytes / seconds (host_array.size counts "
          f"elements, {itemsize} bytes each here)")),
        (8, "that is bits per second, 8x the bytes per second",
         "bandwidth here is bytes per second: host_array.nbytes / seconds, no factor 8"),
        (1 / 8, "that is 8x too small: bytes divided by 8",
         "bandwidth here is bytes per second: host_array.nbytes / seconds"),
        (1e-9, "that is GB/s (or GiB/s), not bytes per second",
         "return bytes per second (1e9 B/s = 1 GB/s)"),
        (2**-30, "that is GB/s (or GiB/s), not bytes per second",
         "return bytes per second (2**30 B/s = 1 GiB/s)"),
        (1e-6, "that is MB/s, not bytes per second", "return bytes per second"),
        (1e-3, "that is 1000x too small: bytes per millisecond?",
         "divide by the seconds the copy took, not milliseconds"),
    ]
    for factor, message, hint in named:
        if low <= got / factor <= high:
            refuse(EX3, message, hint=hint, answer=answer)
    seconds = [iv.seconds / len(iv.started) for iv in warm]
    if 0.9 * min(seconds) <= got <= 1.1 * max(seconds):
        refuse(EX3, "that is the seconds a copy took, not a bandwidth",
               hint="bandwidth = host_array.nbytes / seconds", answer=answer)
    all_rates = [host.nbytes * len(iv.started) / iv.seconds for iv in timed]
    if warm is not timed and 0.95 * min(all_rates) <= got <= 1.05 * max(all_rates):
        refuse(EX3, "your answer includes the first copy, which is slower (it warms the "
                    "allocator up)", hint="make one untimed copy first, then time the others",
               answer=answer)
    refuse(EX3, f"your bandwidth is {ratio:.3g}x the median of the copies your own timer "
                "measured: it is not one of them",
           hint="bytes of the array / seconds of one copy, from your own timing; a number "
                "typed in does not follow the link", answer=answer)


# -- Exercise 4 ------------------------------------------------------------------------


@LAB.exercise(EX4, minutes=10, kind="predict", predicts=("predicted_copy_s",))
def check_copy_prediction(predicted_copy_s: Any, bandwidth: Any,
                          shape: tuple[int, int] = COPY_SHAPE, rel: float = 0.25,
                          repeats: int = 3) -> CheckResult:
    """Exercise 4: the predicted seconds to copy a float32 array of ``shape`` to the device,
    graded as arithmetic from the learner's own measured ``bandwidth`` (Exercise 3's
    result): bytes / bandwidth, within ``rel`` (room for a rounded bandwidth). A busy
    machine cannot fail a right prediction; a factor of 2 (bf16's bytes), 4 (elements or
    the other array), 8 (bits) or 1000 (milliseconds) is named. The message then sets it
    beside ``repeats`` copies timed now (after a warm-up), which do not change the grade."""
    from tpu_course import transfer

    got = as_number(EX4, predicted_copy_s, "the predicted seconds")
    bw = as_number(EX4, bandwidth, "your measured bandwidth (`bandwidth`, from Exercise 3)")
    if bw <= 0:
        refuse(EX4, "your measured bandwidth is not positive: fix Exercise 3 first",
               hint="bandwidth = h2d_bandwidth(...) in bytes per second")
    nbytes = math.prod(shape) * 4
    want = nbytes / bw
    answer = (f"{nbytes:,} bytes / {bw / 1e9:.3g} GB/s = {_ms(want)}")
    if got <= 0:
        refuse(EX4, "a time must be positive", answer=answer)
    ratio = got / want
    if close_enough(ratio, 1, rel):
        host = np.ones(shape, np.float32)
        transfer.time_h2d(host)  # warm-up
        measured = statistics.median(transfer.time_h2d(host) for _ in range(repeats))
        return ok(EX4, f"predicted {_ms(got)} from your bandwidth; {repeats} copies timed now "
                       f"take {_ms(measured)} ({measured / got:.2f}x your prediction): a "
                       "large copy takes its bytes divided by the link's bandwidth, give or "
                       "take how busy the machine is")
    named = [
        (0.5, "your prediction is half of bytes / bandwidth",
         "you counted 2 bytes per element (bf16?): this array is float32, 4 bytes each"),
        (0.25, "your prediction is a quarter of bytes / bandwidth",
         (f"count bytes, not elements (x 4 for float32), of the whole {shape[0]} x "
          f"{shape[1]} array (not Exercise 3's smaller one)")),
        (1 / 8, "your prediction is 8x too short",
         "bytes / (bytes per second): did you divide by a bandwidth in bits per second?"),
        (8, "your prediction is 8x too long",
         "you counted bits: the bandwidth is in bytes per second, so divide the bytes"),
        (2, "your prediction is twice bytes / bandwidth",
         "float32 is 4 bytes per element, not 8"),
        (1e3, "your prediction is 1000x bytes / bandwidth",
         "that is milliseconds: give seconds"),
        (1e-3, "your prediction is 1000x too short", "give seconds"),
    ]
    for factor, message, hint in named:
        if close_enough(ratio, factor, 0.1):
            refuse(EX4, message, hint=hint, answer=answer)
    if close_enough(got, bw / nbytes, 0.1):
        refuse(EX4, "you divided the bandwidth by the bytes",
               hint="time = bytes / (bytes per second)", answer=answer)
    refuse(EX4, f"your prediction is {ratio:.3g}x the arithmetic from your own bandwidth "
                f"(tolerance {rel:.0%})",
           hint=f"time = bytes / bandwidth: the bytes of a float32 {shape[0]} x {shape[1]} "
                "array, divided by the `bandwidth` you measured in Exercise 3",
           answer=answer)


# -- Exercise 5 ------------------------------------------------------------------------

_PEAK_CHIPS = tuple(c for c in ("v4", "v5p", "v6e", "a100", "h100", "v3", "7x")
                    if hardware.bf16_matrix_peak(hardware.get(c)) is not None)


def _hidden_peak(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    chip = str(rng.choice(_PEAK_CHIPS))
    return [("another chip of the hardware table, another matmul and time",
             {"chip": chip, "flops": float(2 * int(rng.integers(1000, 9000)) ** 3),
              "seconds": float(rng.uniform(0.002, 0.2))})]


@LAB.exercise(EX5, minutes=5, kind="write", hidden=_hidden_peak)
def check_fraction_of_peak(fraction_of_peak: Callable[[float, float, str], Any],
                           flops: float = 2 * 8192**3, seconds: float = 0.01,
                           chip: str = "v5e") -> CheckResult:
    """Exercise 5: achieved FLOP/s over the chip's dense bf16 peak, as a fraction."""
    refuse_course_code(EX5, fraction_of_peak, reference.fraction_of_peak)
    spec = hardware.get(chip)
    peak = hardware.bf16_matrix_peak(spec)
    want = flops / seconds / peak
    got = as_number(EX5, fraction_of_peak(flops, seconds, chip), "the fraction")
    answer = f"{flops:.3g} FLOPs in {seconds:.3g} s on a {chip}: {want:.3f} of the peak"
    if np.isclose(got, want, rtol=1e-6):
        return ok(EX5, f"{got:.3f} of the {chip}'s {peak / 1e12:.0f} TFLOP/s.")
    if np.isclose(got, 100 * want, rtol=1e-6):
        refuse(EX5, "that is a percentage", hint="return a fraction between 0 and 1",
               answer=answer)
    if np.isclose(got, 1 / want, rtol=1e-6):
        refuse(EX5, "that is the inverse of the fraction",
               hint="divide achieved FLOP/s (flops / seconds) by the peak", answer=answer)
    if np.isclose(got, flops * seconds / peak, rtol=1e-6):
        refuse(EX5, "you multiplied by the time", hint="achieved FLOP/s is flops / seconds",
               answer=answer)
    others = [c for c in ("v5e", "v6e", "v4", "v5p", "h100", "a100", "v3", "7x") if c != chip]
    peaks = [hardware.bf16_matrix_peak(hardware.get(c)) for c in others]
    if any(np.isclose(got, flops / seconds / p, rtol=1e-6) for p in peaks if p):
        refuse(EX5, f"for a {chip} you divided by another chip's peak",
               hint="take the peak of the chip you are given: hardware.get(chip)",
               answer=answer)
    refuse(EX5, f"for a {chip} your fraction is {got / want:.3g}x the right one",
           hint="take the peak from tpu_course.hardware.get(chip).peak_bf16_flops_per_s",
           answer=answer)


# -- Exercise 6 ------------------------------------------------------------------------


@LAB.exercise(EX6, minutes=15, needs="accelerator", kind="apply")
def check_half_peak(half_peak_n: Any, slack: float = 1.5) -> CheckResult:
    """Exercise 6: the smallest square bf16 matmul size n (from the sweep's powers of two)
    at which this chip reaches half its dense bf16 peak, or None if none up to 8192 does.

    Graded with :func:`tpu_course.bench.benchmark` at n and n/2: n must reach half the
    peak within ``slack`` (at least 0.5/1.5 of the peak) and n/2 must not clearly reach it
    (below 0.5 x 1.5 of the peak)."""
    import jax
    import jax.numpy as jnp

    from tpu_course import bench, runtime

    chip = runtime.describe().chip
    peak = hardware.bf16_matrix_peak(chip)
    if peak is None:
        what = chip.display_name if chip else runtime.describe().device_kind
        return skipped(EX6, f"{what} has no bf16 matrix peak in the table (bf16 is emulated "
                            "there), so half of it is not defined")

    def rate(n: int) -> float:
        a = jnp.ones((n, n), jnp.bfloat16)
        r = bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=5, warn=False)
        return 2 * n**3 / r.median_s

    if half_peak_n is None:
        best = rate(8192)
        if best < 0.5 * peak * slack:
            return ok(EX6, f"none: even 8192 reaches only {best / peak:.0%} of the peak")
        refuse(EX6, f"an 8192 matmul reaches {best / peak:.0%} of the peak",
               hint="look again at your sweep: which size first gets to 50 %?",
               answer=f"n=8192 reaches {best / peak:.0%} of the peak")
    n = int(as_number(EX6, half_peak_n, "the matrix size"))
    if n < 128 or n > 16384:
        refuse(EX6, f"{n} is outside the sweep (128 to 8192)",
               hint="give the side n of the n x n matmul")
    at_n = rate(n)
    below = rate(n // 2) if n >= 256 else 0.0
    answer = f"n={n}: {at_n / peak:.0%} of the peak; n={n // 2}: {below / peak:.0%}"
    if at_n < 0.5 * peak / slack:
        refuse(EX6, f"a {n}x{n} matmul reaches only {at_n / peak:.0%} of the peak here",
               hint="compare with the chip's bf16 peak (hardware), not with the best rate "
                    "your sweep saw", answer=answer)
    if below >= 0.5 * peak * slack:
        refuse(EX6, f"a smaller matmul, {n // 2}x{n // 2}, already reaches "
                    f"{below / peak:.0%} of the peak", hint="the FIRST size that gets there",
               answer=answer)
    return ok(EX6, f"{answer} (tolerance {slack:g}x on the rates)")


def __getattr__(name: str) -> Any:
    if name == "bf16_peak":  # chapter 2 and this checker share one function
        raise AttributeError("tpu_course.checks.ch02.bf16_peak moved to tpu_course.hardware: "
                             "use `from tpu_course import hardware` and "
                             "hardware.bf16_matrix_peak(chip)")
    raise AttributeError(f"module 'tpu_course.checks.ch02' has no attribute {name!r}")

"""Lab 2 (measure a runtime yourself): each exercise declared once. Exercises 2 and 3 run the
learner's timer on a virtual clock, with a fresh instrumented function (or ``jax.device_put``)
per input; ``expect`` times a fresh one in the checker. Keys: ``grading/ch02.py``."""

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
#: Exercise 3's cell copies the first (float32: 64 MiB); Exercise 4 predicts the second.
BANDWIDTH_SHAPE, COPY_SHAPE = (4096, 4096), (8192, 8192)

check_matmul_flops = LAB.add(Exercise(
    "Exercise 1 (matmul FLOPs)", minutes=5, provides=("matmul_flops",),
    cases=tuple(Case(f"({m}x{k}) @ ({k}x{n})", {"m": m, "k": k, "n": n})
                for m, k, n in ((2, 3, 4), (128, 256, 512), (1, 1000, 7))),
    probe=lambda answer, case: number(answer["matmul_flops"](*case.args.values()),
                                      "your FLOP count"),
    compare=equal("your FLOP count"), hint="count the outputs, then the work per output"))


# -- the virtual clock of Exercises 2 and 3 ----------------------------------------------------

class _Clock:
    """Moves 1 us a reading and to the end of what is waited for. Call k returns after
    ``dispatch_s`` (+ ``first_s`` the first time) and is done ``seconds(k)`` after the one
    before. Records each timed interval (seconds, calls started, whether the first was)."""

    def __init__(self, seconds: Callable[[int], float], first_s: float = 0.0,
                 dispatch_s: float = 40e-6) -> None:
        self.seconds, self.first_s, self.dispatch_s = seconds, first_s, dispatch_s
        self.now, self.calls, self.busy_until, self.last = 1000.0, 0, 0.0, None
        self.started, self.intervals, self.waited = [], [], set()

    def read(self) -> float:
        self.now += 1e-6
        if self.started:
            self.intervals.append((self.now - self.last, len(self.started), 1 in self.started))
        self.last, self.started = self.now, []
        return self.now

    def start(self, value: Any = None) -> _Pending:  # its result: the leaf "big"
        self.calls += 1
        if self.last is not None:
            self.started.append(self.calls)
        self.now += self.dispatch_s + (self.first_s if self.calls == 1 else 0.0)
        self.busy_until = max(self.now, self.busy_until) + self.seconds(self.calls)
        return _Pending(self, self.busy_until, "big", value)

    def timed(self, call: Callable[[], Any], k: int = 1) -> float:
        """The instrument: seconds per call of ``k`` calls in flight together, waited for."""
        t0 = self.read()
        [call() for _ in range(k)]
        self.now = max(self.now, self.busy_until)
        return (self.read() - t0) / k


class _Pending:
    """A leaf of a result (a copy: ``value``'s attributes), ready at ``ready_at``."""

    def __init__(self, clock: _Clock, ready_at: float, leaf: str, value: Any = None) -> None:
        self._clock, self._ready_at, self._leaf, self._value = clock, ready_at, leaf, value

    def block_until_ready(self) -> _Pending:
        self._clock.now = max(self._clock.now, self._ready_at)
        self._clock.waited.add(self._leaf)
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.block_until_ready()
        return np.asarray(np.zeros((2, 2)) if self._value is None else self._value, dtype)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._value, name)


@contextlib.contextmanager
def _virtual_time(fn: Any, clock: _Clock, put: Callable | None) -> Iterator[None]:
    """While ``fn`` runs, ``time``, ``timeit`` and their clocks (by identity, in the globals of
    ``fn`` and of its closure's functions, and ``sys.modules``) read ``clock``; ``put`` (if
    any) replaces ``jax.device_put``, there and in ``jax``."""
    import jax

    ns = lambda: int(clock.read() * 1e9)
    fakes = {n: f for c in ("perf_counter", "time", "monotonic") for n, f in
             ((c, clock.read), (f"{c}_ns", ns))}
    fake_time, fake_timeit = types.ModuleType("time"), types.ModuleType("timeit")
    fake_time.__dict__.update(vars(time), **fakes)
    fake_timeit.__dict__.update(vars(timeit), default_timer=clock.read)
    table = {id(time): fake_time, id(timeit): fake_timeit, **({id(jax.device_put): put} if put
             else {}), **{id(getattr(time, n)): f for n, f in fakes.items()}}
    inner = [getattr(c, "cell_contents", None) for c in getattr(fn, "__closure__", None) or ()]
    spaces = {id(g): g for f in (fn, *inner) if isinstance(g := getattr(
        getattr(f, "func", f), "__globals__", None), dict)}
    patched = [(g, k, v) for g in (*spaces.values(), sys.modules, *([vars(jax)] if put else []))
               for k, v in list(g.items()) if id(v) in table and not str(k).startswith("__")]
    for g, k, v in patched:
        g[k] = table[id(v)]
    try:
        yield
    finally:
        for g, k, v in reversed(patched):
            g[k] = v

def _band(want: Mapping[str, Any], value: float, factor: float = 1.0) -> bool:
    """Whether ``value / factor`` lies among what the instrument measured (5 % margins)."""
    return 0.95 * min(want["each"]) <= value / factor <= 1.05 * max(want["each"])

def _units(factor: Any, message: str, hint: str) -> tuple:
    """The rule of a value off by ``factor`` (or ``factor(case)``): a unit mistake."""
    return (lambda g, w, c: _band(w, g["value"], factor(c) if callable(factor) else factor),
            message, hint)

def _timing(title: str, minutes: int, name: str, build: Callable, rules: tuple, generic: str,
            case: Case, rate: Callable | None = None, **kw: Any) -> Callable:
    """A timing exercise: ``build(case)`` gives a fresh clock, the timer's arguments, the
    instrumented call and the ``device_put`` to swap in (or None); ``rate`` turns seconds into
    the answer's unit. Rows of ``rules``, ``(when(got, want, case), message, hint)``, each name
    a mistake; the compare says the first message that applies, else ``generic`` off band."""
    def probe(answer: Mapping[str, Any], case: Case) -> dict:
        clock, args, _, put = build(case)
        try:
            with _virtual_time(answer[name], clock, put):
                value = answer[name](*args)
        except AttributeError as err:
            if "block_until_ready" not in str(err):
                raise
            raise Wrong(f"your timer raised AttributeError: {err}", _BLOCK) from None
        waited = "all" if "big" in clock.waited else "one leaf" if clock.waited else "none"
        return {"value": number(value, f"what {name} returned"), "calls": clock.calls,
                "read": clock.last is not None, "intervals": clock.intervals, "waited": waited}

    def measure(case: Case) -> dict:  # after a warm-up, 8 calls one by one, then 8 together
        clock, _, call, _ = build(case)
        seconds = [clock.timed(call) for _ in range(9)][1:] + [clock.timed(call, 8)]
        return {"each": [rate(case, s) if rate else s for s in seconds]}

    def compare(got: Any, want: Any, case: Case) -> str | None:
        message = next((m for when, m, _ in rules if when(got, want, case)), None)
        if message is None and not _band(want, got["value"]):
            message = generic.format(ratio=got["value"] / statistics.median(want["each"]))
        return message
    return LAB.add(Exercise(title, minutes=minutes, provides=(name,), cases=(case,), probe=probe,
                            expect=measure, compare=compare, **kw,
                            rules=tuple(Mistake(hint, when=when) for when, _, hint in rules)))


# -- Exercise 2: timing a call -------------------------------------------------------------------

#: How each call after the first varies around the case's ``work_s``.
_WORK_FACTORS = (1.0, 1.24, 0.86, 1.12, 0.92, 1.18, 0.81, 1.07, 0.95, 1.3)
_BLOCK = ("jax.block_until_ready(result) waits for every leaf of a dict or tuple (a pytree); "
          "result.block_until_ready() exists only on a single array")

def _device(case: Case) -> tuple:
    """A fresh instrumented jitted function for ``case`` and the arguments it takes."""
    a = case.args
    clock = _Clock(lambda k: a["work_s"] * _WORK_FACTORS[k % 10], a["compile_s"])
    args = tuple(np.full((2, 2), i, np.float32) for i in range(a["nargs"]))

    def fn(*given: Any) -> Any:
        if len(given) != len(args) or any(g is not x for g, x in zip(given, args)):
            raise TypeError(f"fn takes the {len(args)} argument(s) time_call was given")
        big, small = clock.start(), _Pending(clock, clock.now, "small")
        return {"dict": {"small": small, "big": big}, "tuple": (small, big), "array": big}[
            a["result"]]
    return clock, (fn, *args), lambda: fn(*args), None

#: The seconds of each interval that timed several calls, and of all intervals together.
_total = lambda g: [s for s, n, _ in g["intervals"] if n > 1] + [sum(s for s, *_ in g["intervals"])]
_TIMER_RULES = (
    (lambda g, w, c: g["calls"] == 0, "your function never called fn", "call fn(*args), time it"),
    (lambda g, w, c: g["waited"] == "none", "your timer never waited for the result", "JAX "
     "returns before the device is done: jax.block_until_ready(...) before stopping the clock"),
    (lambda g, w, c: g["waited"] == "one leaf", "your timer waited for one leaf of the result "
     "only (result['small']?)", _BLOCK),
    (lambda g, w, c: not g["read"], "your answer was not measured: your code read no clock",
     "read time.perf_counter() before the calls and after waiting for them; return what it "
     "measured, not a number you typed"),
    (lambda g, w, c: not g["intervals"], "none of your clock readings surround a call of fn",
     "start = time.perf_counter(); call and wait; time.perf_counter() - start"),
    (lambda g, w, c: g["calls"] == 1, "you called fn once: that one call includes the "
     "compilation", "call it once untimed (warm-up), then time several calls"),
    (lambda g, w, c: any(first for *_, first in g["intervals"]), "your timed region includes the "
     "first call of fn, which compiles", "call fn and wait for it BEFORE you start the clock "
     "(warm-up): a median does not remove a compile inside the timed region"),
    (lambda g, w, c: sum(n for _, n, _ in g["intervals"]) == 1, "you timed a single call after "
     "the warm-up", "one sample can be a hiccup: time several calls, take the median (or min)"),
    (lambda g, w, c: not _band(w, g["value"]) and any(math.isclose(g["value"], s, rel_tol=0.05)
     for s in _total(g)), "you returned the total time of the calls you timed",
     "divide the total by the number of calls you timed"),
    _units(1e3, "your time is about 1000x a call's", "that is milliseconds: return seconds"),
    _units(1e6, "your time is about 1e6 x a call's", "that is microseconds: return seconds"),
    (lambda g, w, c: 0 < g["value"] < 0.7 * min(w["each"]) and any(math.isclose(
        g["value"], s / n, rel_tol=0.1) for s, n, _ in g["intervals"]), "your time is shorter "
     "than a call: your clock stopped before the work was done",
     "stop the clock only after jax.block_until_ready(result) has returned"))

check_time_call = _timing(
    "Exercise 2 (timing a call)", 15, "time_call", _device, _TIMER_RULES,
    "your time is {ratio:.3g}x the median of the calls the checker timed",
    Case("a function of one argument returning a dict: 31 ms a call, 0.6 s to compile",
         {"work_s": 0.031, "compile_s": 0.6, "nargs": 1, "result": "dict"}),
    success="warmed up, several calls timed, the whole result waited for",
    hint="return what your timer measured (the median, or the minimum, of the per-call "
         "times): a number typed in does not follow the function when its speed changes")


# -- Exercise 3: host-to-device bandwidth ------------------------------------------------------

#: How each copy's time varies: the first pays for warming the allocator up.
_COPY_FACTORS = (3.0, 1.0, 1.08, 0.93, 1.04, 0.97, 1.1, 0.9, 1.02)

def _link(case: Case) -> tuple:
    """A fresh host array and a ``device_put`` whose copies land ``bytes / link_bytes_per_s``
    (times the copy's factor) after the one before."""
    host = np.ones(case.args["shape"], case.args["dtype"])
    per_copy = host.nbytes / case.args["link_bytes_per_s"]
    clock = _Clock(lambda k: 30e-6 + per_copy * _COPY_FACTORS[min(k, 9) - 1], dispatch_s=20e-6)
    put = lambda x, *a, **kw: clock.start(np.asarray(x))
    return clock, (host,), lambda: put(host), put

def _nbytes(case: Case) -> int:
    return math.prod(case.args["shape"]) * np.dtype(case.args.get("dtype", "float32")).itemsize

_PER_S = "bandwidth here is bytes per second: host_array.nbytes / seconds"
_LINK_RULES = (
    (lambda g, w, c: g["calls"] == 0, "your code never called jax.device_put", "copy the array "
     "with jax.device_put(host_array): the check follows those copies"),
    (lambda g, w, c: g["waited"] == "none", "your timer never waited for a copy to land: you "
     "timed the call, not the copy", "jax.device_put(host_array).block_until_ready() inside "
     "the timed region, before you stop the clock"),
    (lambda g, w, c: not g["read"], "your answer was not measured: your code read no clock",
     "time each copy with time.perf_counter() and return bytes / seconds"),
    (lambda g, w, c: not g["intervals"], "none of your clock readings surround a copy",
     "start = time.perf_counter(); copy and wait; time.perf_counter() - start"),
    (lambda g, w, c: g["value"] > 1.5 * max(w["each"]) and not _band(w, g["value"], 8),
     "your bandwidth is faster than the link: your clock stopped before the copy had landed",
     "wait for the copy (block_until_ready) inside the timed region, then read the clock"),
    _units(lambda c: 1 / np.dtype(c.args["dtype"]).itemsize, "that is elements per second",
           "bandwidth counts bytes: host_array.nbytes, not host_array.size, over seconds"),
    _units(8, "that is bits per second, 8x the bytes per second", f"{_PER_S}, no factor 8"),
    _units(1 / 8, "that is 8x too small: bytes divided by 8", _PER_S),
    (lambda g, w, c: _band(w, g["value"], 1e-9) or _band(w, g["value"], 2**-30), "that is GB/s "
     "(or GiB/s)", "return bytes per second (1e9 B/s = 1 GB/s, 2**30 B/s = 1 GiB/s)"),
    _units(1e-6, "that is MB/s, not bytes per second", "return bytes per second"),
    _units(1e-3, "that is 1000x too small: bytes per millisecond?", "divide by seconds"),
    (lambda g, w, c: 0.9 * _nbytes(c) / max(w["each"]) <= g["value"] <= 1.1 * _nbytes(c) / min(
        w["each"]), "that is the seconds a copy took", "bandwidth = host_array.nbytes / seconds"),
    (lambda g, w, c: not _band(w, g["value"]) and any(_band(w, g["value"], 1 / n) for _, n, _
     in g["intervals"] if n > 1), "you divided the bytes of one copy by the time of several",
     "divide by the number of copies you timed (or time them one by one)"),
    (lambda g, w, c: not _band(w, g["value"]) and any(f for *_, f in g["intervals"]), "your "
     "answer includes the first copy, slower as it warms the allocator up", "make one untimed "
     "copy first, then time the others"))

check_h2d_bandwidth = _timing(
    EX3, 10, "h2d_bandwidth", _link, _LINK_RULES,
    "your bandwidth is {ratio:.3g}x the median of the copies the checker timed",
    Case("a float32 2048 x 1024 array (8 MiB) on a 7.3 GB/s link",
         {"shape": (2048, 1024), "dtype": "float32", "link_bytes_per_s": 7.3e9}),
    rate=lambda case, seconds: _nbytes(case) / seconds,
    success="bytes per second of warm copies, each waited for",
    hint="bytes of the array / seconds of one copy, from your own timing; a number typed "
         "in does not follow the link")


# -- Exercise 4: predict a copy ------------------------------------------------------------------

def copy_seconds(shape: tuple[int, ...], repeats: int = 3) -> float:
    """The instrument: the median seconds of ``repeats`` copies of a float32 array of
    ``shape`` to the default device now, after a warm-up copy."""
    from tpu_course import transfer

    host = np.ones(shape, np.float32)
    return statistics.median([transfer.time_h2d(host) for _ in range(repeats + 1)][1:])

def _copy_compare(got: Any, want: float, case: Case) -> str | None:
    predicted, bandwidth = got
    if bandwidth <= 0:
        raise Wrong("your measured bandwidth is not positive: fix Exercise 3 first",
                    "bandwidth = h2d_bandwidth(...), in bytes per second")
    arithmetic = _nbytes(case) / bandwidth
    if not math.isclose(predicted, arithmetic, rel_tol=0.25):
        return f"your prediction is {predicted / arithmetic:.3g}x bytes / your bandwidth"
    return None if 1 / 5 <= arithmetic / want <= 5 else (
        f"your bandwidth, {bandwidth / 1e9:.3g} GB/s, says a copy takes {arithmetic * 1e3:.3g} "
        f"ms; copies timed now take {want * 1e3:.3g} ms")

#: Predictions ``factor`` x bytes / bandwidth, and what each says.
_RATIOS = ((0.5, "you counted 2 bytes per element (bf16?): this array is float32, 4 bytes each"),
           (0.25, "count bytes, not elements (x 4 for float32), of the whole 8192 x 8192 array "
                  "(not Exercise 3's smaller one)"),
           (1 / 8, "bytes / (bytes per second): did you divide by a bandwidth in bits per second?"),
           (8, "you counted bits: the bandwidth is in bytes per second"),
           (2, "float32 is 4 bytes per element, not 8"),
           (1e3, "that is milliseconds: give seconds"),
           (1e-3, "give seconds, bytes / (bytes per second)"),
           (1, "bandwidth = h2d_bandwidth(...) as Exercise 3 measured it, on this runtime"))
_BACKWARDS = Mistake("time = bytes / (bytes per second), not bandwidth / bytes", when=lambda
                     got, want, case: math.isclose(got[0], got[1] / _nbytes(case), rel_tol=0.1))

check_copy_prediction = LAB.add(Exercise(
    "Exercise 4 (predict a copy)", minutes=10, kind="predict",
    provides=("predicted_copy_s", "bandwidth"),
    cases=(Case(f"a float32 {COPY_SHAPE[0]} x {COPY_SHAPE[1]} array", {"shape": COPY_SHAPE}),),
    probe=lambda answer, case: (number(answer["predicted_copy_s"], "predicted_copy_s"),
                                number(answer["bandwidth"], "your measured bandwidth")),
    expect=lambda case: copy_seconds(case.args["shape"]), compare=_copy_compare,
    success="a large copy takes its bytes over the link's bandwidth, give or take how busy "
            "the machine is",
    rules=(_BACKWARDS, *(Mistake(hint, when=lambda got, want, case, f=f: math.isclose(
        got[0] * got[1] / _nbytes(case), f, rel_tol=0.25 if f == 1 else 0.1))
        for f, hint in _RATIOS)),
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
SWEEP, SLACK = (128, 256, 512, 1024, 2048, 4096, 8192), 1.5

def sweep_fractions() -> dict[int, float]:
    """The instrument: each square bf16 matmul's rate (``tpu_course.bench``) over this chip's
    bf16 peak."""
    import jax
    import jax.numpy as jnp

    from tpu_course import bench, runtime

    peak = hardware.bf16_matrix_peak(runtime.describe().chip)  # (a CPU is skipped before)
    if peak is None:
        raise LookupError("this chip has no bf16 matrix peak in the table (bf16 is emulated "
                          "there), so half of it is not defined")

    def seconds(n: int) -> float:
        a = jnp.ones((n, n), jnp.bfloat16)
        return bench.benchmark(jax.jit(jnp.matmul), a, a, repeats=5, warn=False).median_s
    return {n: 2 * n**3 / seconds(n) / peak for n in SWEEP}

def _half_compare(got: Any, want: Mapping[int, float], case: Case) -> str | None:
    if got is None:
        top = want[SWEEP[-1]]
        return None if top < 0.5 * SLACK else f"an 8192 matmul reaches {top:.0%} of the peak here"
    if got not in want:
        raise Wrong(f"{got} is not a size of the sweep {SWEEP}", "give the side n of the "
                    "n x n matmul, or None")
    if want[got] < 0.5 / SLACK:
        return f"a {got}x{got} matmul reaches only {want[got]:.0%} of the peak here"
    smaller = want.get(got // 2, 0.0)
    return f"a smaller matmul, {got // 2}x{got // 2}, already reaches {smaller:.0%}" if (
        smaller >= 0.5 * SLACK) else None

check_half_peak = LAB.add(Exercise(
    "Exercise 6 (where this chip reaches half its peak)", minutes=15, kind="apply",
    needs="accelerator", provides=("half_peak_n",),
    probe=lambda answer, case: None if answer["half_peak_n"] is None else int(
        number(answer["half_peak_n"], "half_peak_n")),
    expect=lambda case: sweep_fractions(), compare=_half_compare,
    hint="compare each size's FLOP/s with the chip's bf16 peak (hardware), not with the best "
         "rate your sweep saw, and take the FIRST size that gets to 50 %"))

"""Checkers for lab 2: FLOP counts, timing a call correctly, transfer bandwidth, peak.

The timing and bandwidth checkers do not judge by a CPU timing alone (a shared CPU is
too noisy to tell a factor of 8 from noise): they instrument what the learner's code
calls. ``check_time_call`` hands over a function whose "compile" (first call) and "work"
(every later call, finished asynchronously) take known times and which records every
call and every wait; ``check_h2d_bandwidth`` wraps ``jax.device_put`` for the duration of
the check and records how long each copy took, so an answer in bits/s, GB/s or seconds
cannot land inside the tolerance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from typing import Any, Callable, Iterator

import numpy as np

from tpu_course import hardware
from tpu_course.checks._core import CheckResult, Lab, as_number, fail, ok, skipped

LAB = Lab(2, "Getting a TPU and a first JAX program")

EX1 = "Exercise 1 (matmul FLOPs)"
EX2 = "Exercise 2 (timing a call)"
EX3 = "Exercise 3 (host-to-device bandwidth)"
EX4 = "Exercise 4 (predict a copy)"
EX5 = "Exercise 5 (fraction of peak)"
EX6 = "Exercise 6 (where this chip reaches half its peak)"

#: Exercise 3 measures on this array shape (float32: 64 MiB), Exercise 4 predicts this one.
BANDWIDTH_SHAPE = (4096, 4096)
COPY_SHAPE = (8192, 8192)  # float32: 256 MiB


def bf16_peak(chip: hardware.Chip | None) -> float | None:
    """The chip's dense bf16 peak in FLOP/s, or None (no chip, or no bf16 matrix units:
    a T4 emulates bf16)."""
    return None if chip is None else getattr(chip, "peak_bf16_flops_per_s", None)


# -- Exercise 1 ------------------------------------------------------------------------


@LAB.exercise(EX1, minutes=5, kind="write")
def check_matmul_flops(matmul_flops: Callable[[int, int, int], Any]) -> CheckResult:
    """Exercise 1: FLOPs of an (m x k) @ (k x n) matmul are 2·m·k·n."""
    for m, k, n in ((2, 3, 4), (128, 256, 512), (1, 1000, 7)):
        want = 2 * m * k * n
        got = as_number(EX1, matmul_flops(m, k, n), f"matmul_flops({m}, {k}, {n})")
        if isinstance(got, CheckResult):
            return got
        if got == want:
            continue
        answer = f"({m}x{k}) @ ({k}x{n}): {want:,} FLOPs"
        if got == m * k * n:
            return fail(EX1, f"for {m}x{k} @ {k}x{n} you counted multiply-accumulates",
                        hint="each MAC is a multiply and an add: 2 FLOPs", answer=answer)
        if got in (2 * m * n, 2 * m * k, 2 * k * n):
            return fail(EX1, f"for {m}x{k} @ {k}x{n} one dimension is missing",
                        hint="every output element c[i,j] needs k multiply-adds",
                        answer=answer)
        return fail(EX1, f"for ({m}x{k}) @ ({k}x{n}) your count is off by a factor of "
                         f"{got / want:.3g}", hint="count the outputs, then the work per output",
                    answer=answer)
    return ok(EX1, "2·m·k·n: one multiply and one add per (i, j, k) triple.")


# -- Exercise 2 ------------------------------------------------------------------------


@dataclasses.dataclass
class _Pending:
    """One leaf of an instrumented call's result: ready at ``ready_at`` (perf_counter)."""

    ready_at: float
    log: "_CallLog"
    call: int
    leaf: str

    def block_until_ready(self) -> "_Pending":
        wait = self.ready_at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        self.log.waited.add((self.call, self.leaf))
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # np.asarray waits
        self.block_until_ready()
        return np.zeros((2, 2), dtype or np.float32)


@dataclasses.dataclass
class _CallLog:
    """What the learner's timer did with the instrumented function."""

    compile_s: float
    work_s: float
    calls: int = 0
    busy_until: float = 0.0
    waited: set = dataclasses.field(default_factory=set)

    def __call__(self, *args: Any) -> dict[str, _Pending]:
        """Call ``n``: the first "compiles" (blocks for ``compile_s``, as a jit's first call
        does); every call queues ``work_s`` of device work and returns at once with a
        dict of two leaves, a small one ready now and a big one ready when the work is."""
        now = time.perf_counter()
        if self.calls == 0:
            time.sleep(self.compile_s)
            now = time.perf_counter()
        self.calls += 1
        self.busy_until = max(now, self.busy_until) + self.work_s
        return {"small": _Pending(now, self, self.calls, "small"),
                "big": _Pending(self.busy_until, self, self.calls, "big")}


@LAB.exercise(EX2, minutes=15, kind="write")
def check_time_call(time_call: Callable[..., Any], work_s: float = 0.02,
                    compile_s: float = 0.6) -> CheckResult:
    """Exercise 2: seconds per call, after a warm-up, waiting for the whole result.

    The learner's ``time_call(fn, x)`` gets an instrumented ``fn``: its first call takes
    ``compile_s`` (a compile), each call's "big" output is ready ``work_s`` after the
    device is free. Passing needs at least three calls (a warm-up and more than one timed
    call), every output waited for, and an answer within 2x of ``work_s``. A mean that
    includes the first call is ``work_s + compile_s / n``: 30x ``work_s`` spread over up to
    15 calls still lands more than 2x off.
    """
    log = _CallLog(compile_s, work_s)
    value = time_call(log, np.ones((2, 2), np.float32))
    got = as_number(EX2, value, "the seconds per call")
    if isinstance(got, CheckResult):
        return got
    answer = f"the instrumented call takes {work_s * 1e3:.0f} ms (its first call {compile_s:.1f} s)"
    if log.calls == 0:
        return fail(EX2, "your function never called fn", hint="call fn(*args) and time it")
    big_waits = {c for c, leaf in log.waited if leaf == "big"}
    small_waits = {c for c, leaf in log.waited if leaf == "small"}
    if not big_waits:
        hint = ("you waited for one leaf of the result only (result['small']?): "
                "jax.block_until_ready(result) waits for every leaf of a dict or tuple"
                if small_waits else
                "JAX returns before the device has finished: wrap the call in "
                "jax.block_until_ready(...) before stopping the clock")
        return fail(EX2, "your timer never waited for the result to be ready", hint=hint,
                    answer=answer)
    if log.calls == 1:
        return fail(EX2, "you called fn once: that one call includes the compilation",
                    hint="call it once untimed (warm-up), then time several calls",
                    answer=answer)
    if log.calls == 2:
        return fail(EX2, "you timed a single call after the warm-up",
                    hint="one sample can be a hiccup: time several calls and take the median "
                         "(or the minimum)", answer=answer)
    if got <= 0:
        return fail(EX2, f"a time must be positive, you returned {got!r}")
    ratio = got / work_s
    if ratio < 0.5:
        if got * 1e3 < work_s * 1e3 / 100:
            hint = "that is milliseconds or a dispatch time: return seconds, measured after the wait"
        else:
            hint = "stop the clock only after jax.block_until_ready(result) has returned"
        return fail(EX2, f"your time is {1 / ratio:.1f}x shorter than the call takes",
                    hint=hint, answer=answer)
    if ratio > 2:
        if got > 1:
            hint = "is that in milliseconds? return seconds"
        elif abs(got - (work_s + compile_s / log.calls)) <= 0.5 * got:
            hint = ("your average includes the first call, which compiles: call fn once "
                    "before you start the clock (warm-up)")
        else:
            hint = "time the calls one by one and take the median"
        return fail(EX2, f"your time is {ratio:.1f}x longer than the call takes", hint=hint,
                    answer=answer)
    return ok(EX2, f"within 2x of the {work_s * 1e3:.0f} ms the instrumented function takes "
                   f"per call: warmed up, {log.calls - 1} timed calls, waiting for every output")


# -- Exercise 3 ------------------------------------------------------------------------


@contextlib.contextmanager
def _recorded_device_put(record: list[float]) -> Iterator[None]:
    """Patch ``jax.device_put`` to wait for each copy and record its seconds."""
    import jax

    original = jax.device_put

    def device_put(x: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = jax.block_until_ready(original(x, *args, **kwargs))
        record.append(time.perf_counter() - start)
        return out

    jax.device_put = device_put
    try:
        yield
    finally:
        jax.device_put = original


def _units_hint(ratio: float) -> str | None:
    if 5 <= ratio <= 13:
        return "that looks like bits per second: bandwidth here is array.nbytes / seconds"
    if 1 / 13 <= ratio <= 1 / 5:
        return "a factor 8 too small: did you divide the bytes by 8?"
    if ratio < 1e-6:
        return ("that looks like GB/s or seconds: return bytes per second "
                "(array.nbytes / seconds)")
    return None


@LAB.exercise(EX3, minutes=10, kind="write")
def check_h2d_bandwidth(h2d_bandwidth: Callable[[np.ndarray], Any],
                        shape: tuple[int, int] = BANDWIDTH_SHAPE) -> CheckResult:
    """Exercise 3: host-to-device bandwidth in bytes per second for one array.

    The copies the learner's code makes are timed by a wrapped ``jax.device_put``; the
    learner's answer must lie between the bandwidth of the slowest recorded copy / 2 and
    that of the fastest x 1.5 (a timer around a copy can only make it look slower).
    """
    host = np.random.default_rng(1).random(shape, dtype=np.float32)
    copies: list[float] = []
    with _recorded_device_put(copies):
        value = h2d_bandwidth(host)
    got = as_number(EX3, value, "the bandwidth")
    if isinstance(got, CheckResult):
        return got
    if not copies:
        from tpu_course import transfer

        copies = [transfer.time_h2d(host) for _ in range(5)]
        note = " (your code did not call jax.device_put, so the check timed its own copies)"
    else:
        note = ""
    fastest, slowest = host.nbytes / min(copies), host.nbytes / max(copies)
    answer = (f"the copies took {min(copies) * 1e3:.2f} to {max(copies) * 1e3:.2f} ms for "
              f"{host.nbytes:,} bytes: {slowest / 1e9:.2f} to {fastest / 1e9:.2f} GB/s")
    if got <= 0:
        return fail(EX3, "a bandwidth must be positive", answer=answer)
    if slowest / 2 <= got <= fastest * 1.5:
        return ok(EX3, "in bytes per second, within the range of the copies your code "
                       f"made{note}")
    ratio = got / statistics.median([host.nbytes / c for c in copies])
    hint = _units_hint(ratio) or (
        "faster than any copy really was: wait for the copy (block_until_ready) inside the "
        "timed region" if got > fastest else
        "slower than the copies: time only the device_put and its wait, after a warm-up copy")
    return fail(EX3, f"your bandwidth is {ratio:.3g}x the bandwidth of the copies your "
                     f"code made{note}", hint=hint, answer=answer)


# -- Exercise 4 ------------------------------------------------------------------------


@LAB.exercise(EX4, minutes=10, kind="predict")
def check_copy_prediction(predicted_copy_s: Any, shape: tuple[int, int] = COPY_SHAPE,
                          slack: float = 3.0, repeats: int = 5) -> CheckResult:
    """Exercise 4: the predicted seconds to copy a float32 array of ``shape`` to the device,
    against ``repeats`` measured copies (after one warm-up). It passes within a factor
    ``slack`` of the range of the copies: from the fastest / ``slack`` to the slowest x
    ``slack`` (a busy machine's memory copies vary by more than 3x from one to the next, so
    a single median would fail a right prediction made a minute earlier)."""
    from tpu_course import transfer

    got = as_number(EX4, predicted_copy_s, "the predicted seconds")
    if isinstance(got, CheckResult):
        return got
    host = np.random.default_rng(2).random(shape, dtype=np.float32)
    transfer.time_h2d(host)
    copies = [transfer.time_h2d(host) for _ in range(repeats)]
    fastest, slowest, measured = min(copies), max(copies), statistics.median(copies)
    answer = (f"{host.nbytes:,} bytes took {fastest * 1e3:.1f} to {slowest * 1e3:.1f} ms "
              f"(median {measured * 1e3:.1f} ms of {repeats} copies)")
    if got <= 0:
        return fail(EX4, "a time must be positive", answer=answer)
    ratio = got / measured
    if fastest / slack <= got <= slowest * slack:
        return ok(EX4, f"predicted {got * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms "
                       f"({ratio:.2f}x; tolerance {slack:g}x): a large copy takes its bytes "
                       "divided by the link's bandwidth")
    if 5 <= 1 / ratio <= 13:
        hint = "a factor of 8 short: a bandwidth in bits/s? bytes = elements x 4 for float32"
    elif 5 <= ratio <= 13:
        hint = "a factor of 8 long: did you count bits instead of bytes?"
    elif 300 <= ratio <= 3000 or 300 <= 1 / ratio <= 3000:
        hint = "a factor of about 1000: milliseconds vs seconds?"
    elif 3 <= ratio <= 5 or 3 <= 1 / ratio <= 5:
        hint = ("float32 is 4 bytes per element; count the elements of the whole array, "
                f"{shape[0]} x {shape[1]}")
    else:
        hint = "time = bytes / (bytes per second), with the bandwidth you measured"
    return fail(EX4, f"your prediction is {ratio:.3g}x the measured time (tolerance "
                     f"{slack:g}x)", hint=hint, answer=answer)


# -- Exercise 5 ------------------------------------------------------------------------


@LAB.exercise(EX5, minutes=5, kind="write")
def check_fraction_of_peak(fraction_of_peak: Callable[[float, float, str], Any]) -> CheckResult:
    """Exercise 5: achieved FLOP/s over the chip's dense bf16 peak, as a fraction."""
    chip = hardware.get("v5e")
    flops, seconds = 2 * 8192**3, 0.01
    peak = bf16_peak(chip)
    want = flops / seconds / peak
    got = as_number(EX5, fraction_of_peak(flops, seconds, "v5e"), "the fraction")
    if isinstance(got, CheckResult):
        return got
    answer = f"{flops:.3g} FLOPs in {seconds} s on a v5e: {want:.3f} of the peak"
    if np.isclose(got, want, rtol=1e-6):
        return ok(EX5, f"{got:.3f} of the v5e's {peak / 1e12:.0f} TFLOP/s.")
    if np.isclose(got, 100 * want, rtol=1e-6):
        return fail(EX5, "that is a percentage", hint="return a fraction between 0 and 1",
                    answer=answer)
    if np.isclose(got, 1 / want, rtol=1e-6):
        return fail(EX5, "that is the inverse of the fraction",
                    hint="divide achieved FLOP/s (flops / seconds) by the peak", answer=answer)
    if np.isclose(got, flops * seconds / peak, rtol=1e-6):
        return fail(EX5, "you multiplied by the time", hint="achieved FLOP/s is flops / seconds",
                    answer=answer)
    return fail(EX5, f"for a v5e your fraction is {got / want:.3g}x the right one",
                hint="take the peak from tpu_course.hardware.get(chip).peak_bf16_flops_per_s",
                answer=answer)


# -- Exercise 6 ------------------------------------------------------------------------


@LAB.exercise(EX6, minutes=15, needs="accelerator", kind="transfer")
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
    peak = bf16_peak(chip)
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
        return fail(EX6, f"an 8192 matmul reaches {best / peak:.0%} of the peak",
                    hint="look again at your sweep: which size first gets to 50 %?")
    n = as_number(EX6, half_peak_n, "the matrix size")
    if isinstance(n, CheckResult):
        return n
    n = int(n)
    if n < 128 or n > 16384:
        return fail(EX6, f"{n} is outside the sweep (128 to 8192)", hint="give the side n of "
                         "the n x n matmul")
    at_n = rate(n)
    below = rate(n // 2) if n >= 256 else 0.0
    answer = f"n={n}: {at_n / peak:.0%} of the peak; n={n // 2}: {below / peak:.0%}"
    if at_n < 0.5 * peak / slack:
        return fail(EX6, f"a {n}x{n} matmul reaches only {at_n / peak:.0%} of the peak here",
                    hint="compare with the chip's bf16 peak (hardware), not with the best "
                         "rate your sweep saw", answer=answer)
    if below >= 0.5 * peak * slack:
        return fail(EX6, f"a smaller matmul, {n // 2}x{n // 2}, already reaches "
                         f"{below / peak:.0%} of the peak", hint="the FIRST size that gets there",
                    answer=answer)
    return ok(EX6, f"{answer} (tolerance {slack:g}x on the rates)")

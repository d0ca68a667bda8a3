"""Lab 2's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check); shortcuts fail.

Exercises 2 and 3 run the learner's timer on the checker's virtual clock, so nothing here
sleeps or depends on how busy the machine is; Exercise 4's live copies are faked."""

from __future__ import annotations

import math
import statistics
import time
import timeit
from time import perf_counter as tick

import jax
import numpy as np
import pytest

import grading
from tests import assess
from tpu_course import hardware
from tpu_course.checks import NotWritten, ch02
from tpu_course.checks.engine import Mistake

LAB = 2
BYTES = math.prod(ch02.COPY_SHAPE) * 4
BW = 3.1e9  # what the learner measured in Exercise 3


@pytest.fixture(autouse=True)
def _copies(monkeypatch):
    """Copies timed now take what a 2.5 GB/s link gives (the real ones take seconds)."""
    monkeypatch.setattr(ch02, "copy_seconds", lambda shape: math.prod(shape) * 4 / 2.5e9)


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


def _timer(n=5, warm=True, wait=jax.block_until_ready, after=lambda out: out,
           pick=statistics.median):
    """A timer of fn(*args): a warm-up (or none), then n calls timed one by one, each waited
    for with `wait` (`after` once its time is taken); `pick` of the times."""
    def timer(fn, *args):
        if warm:
            wait(fn(*args))
        seconds = []
        for _ in range(n):
            start = time.perf_counter()
            out = wait(fn(*args))
            seconds.append(time.perf_counter() - start)
            after(out)
        return pick(seconds)
    return timer


def _together(fn, *args):
    """A warm-up, then 5 calls in flight together: their total time."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready([fn(*args) for _ in range(5)])
    return time.perf_counter() - start


def _first_leaf(out):
    (out["small"] if isinstance(out, dict) else out[0] if isinstance(out, tuple) else out
     ).block_until_ready()
    return out


_copy = lambda h, **how: _timer(**how)(jax.device_put, h)  # seconds of a copy
_rate = lambda h: h.nbytes / _copy(h)
#: Wrong timers and bandwidths, each with the start of the public rule's message naming it.
WRONG_TIMERS = {"Exercise 2": (ch02._TIMER_RULES, [
    ("your timed region", _timer(warm=False)),
    ("you called fn once", _timer(1, warm=False)),
    ("you timed a single", _timer(1)),
    ("your timer never waited", _timer(wait=lambda out: out)),
    ("your timer waited for one", _timer(wait=_first_leaf)),
    ("you returned the total", _together),
    ("your time is shorter", _timer(wait=lambda out: out, after=jax.block_until_ready)),
    ("your time is about 1000x", lambda fn, *a: 1e3 * _timer()(fn, *a)),
    ("your time is about 1e6", lambda fn, *a: 1e6 * _timer()(fn, *a)),
    ("your answer was not measured",
     lambda fn, *a: [jax.block_until_ready(fn(*a)) for _ in range(3)] and 0.031),
    ("none of your clock readings",
     lambda fn, *a: time.perf_counter() and [jax.block_until_ready(fn(*a))] and 0.031),
    ("your function never called", lambda fn, *a: 0.031)]),
    "Exercise 3": (ch02._LINK_RULES, [
    ("your timer never waited", lambda h: h.nbytes / _copy(h, wait=lambda c: c)),
    ("that is elements", lambda h: h.size / _copy(h)),
    ("that is bits", lambda h: 8 * _rate(h)),
    ("that is 8x too small", lambda h: _rate(h) / 8),
    ("that is GB/s", lambda h: _rate(h) / 1e9),
    ("that is GB/s", lambda h: _rate(h) / 2**30),
    ("that is MB/s", lambda h: _rate(h) / 1e6),
    ("that is 1000x too small", lambda h: _rate(h) / 1e3),
    ("that is the seconds", _copy),
    ("you divided the bytes of one", lambda h: h.nbytes / _together(jax.device_put, h)),
    ("your answer includes the first",
     lambda h: h.nbytes / _copy(h, warm=False, pick=statistics.mean)),
    ("your code never called", lambda h: 7.3e9)])}
WRONG = [pytest.param(title, next(h for _, m, h in rules if m.startswith(start)), answer,
                      id=f"{title}-{start}") for title, (rules, answers) in WRONG_TIMERS.items()
         for start, answer in answers]
WRONG += [pytest.param("Exercise 4", hint, (f * BYTES / BW, BW), id=f"Exercise 4-{f:g}")
          for f, hint in ch02._RATIOS if f != 1]
WRONG += [pytest.param("Exercise 4", ch02._BACKWARDS.hint, (BW / BYTES, BW), id="Exercise 4-bw")]


@pytest.mark.parametrize(("title", "hint", "answer"), WRONG)
def test_each_wrong_timer_is_named_by_a_rule(title, hint, answer):
    ex = ch02.LAB.find(title)
    key = grading.keys(LAB).get(title, grading.Key())
    assess.assert_mistake_named(ex, key, Mistake(hint, answer))


def matmul_flops(m, k, n):
    """Counted, not a formula: one multiply and one add per term of each output."""
    per_output = sum(2 for _ in range(k))
    return per_output * m * n


def time_call(fn, *args):
    """Throughput: queue 8 calls after a warm-up, wait for the last, divide."""
    jax.block_until_ready(fn(*args))
    start = tick()  # `from time import perf_counter as tick`
    for _ in range(8):
        out = fn(*args)
    jax.block_until_ready(out)
    return (tick() - start) / 8


def time_call_min(fn, *args):
    """timeit's clock, the minimum of 4, after two warm-up calls."""
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    best = math.inf
    for _ in range(4):
        t = timeit.default_timer()
        jax.block_until_ready(fn(*args))
        best = min(best, timeit.default_timer() - t)
    return best


def time_call_ns(fn, *args):
    """A clock imported inside the function, in nanoseconds; the mean of 6 laps."""
    import time as clock

    jax.tree_util.tree_map(lambda leaf: leaf.block_until_ready(), fn(*args))
    laps = []
    for _ in range(6):
        t0 = clock.perf_counter_ns()
        jax.block_until_ready(fn(*args))
        laps.append((clock.perf_counter_ns() - t0) / 1e9)
    return sum(laps) / len(laps)


def h2d_bandwidth(host):
    """Warm up, 4 copies in flight together, wait for them all."""
    np.asarray(jax.device_put(host))
    start = tick()
    copies = [jax.device_put(host) for _ in range(4)]
    jax.block_until_ready(copies)
    return 4 * host.size * host.itemsize / (tick() - start)


def h2d_bandwidth_best(host):
    """time.monotonic, the fastest of three copies after a warm-up."""
    jax.device_put(host).block_until_ready()
    seconds = []
    for _ in range(3):
        t = time.monotonic()
        jax.device_put(host).block_until_ready()
        seconds.append(time.monotonic() - t)
    return host.nbytes / min(seconds)


def fraction_of_peak(flops, seconds, chip):
    """The other way round: the time the peak would take over the time it took."""
    return flops / hardware.get(chip).peak_bf16_flops_per_s / seconds


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 1", matmul_flops),
    ("Exercise 1", lambda m, k, n: float(n * (k + k) * m)),
    ("Exercise 2", time_call),
    ("Exercise 2", time_call_min),
    ("Exercise 2", time_call_ns),
    ("Exercise 3", h2d_bandwidth),
    ("Exercise 3", h2d_bandwidth_best),
    ("Exercise 4", {"predicted_copy_s": round(BYTES / BW, 3), "bandwidth": BW}),
    ("Exercise 4", {"predicted_copy_s": BYTES / 3e9, "bandwidth": np.float32(BW)}),
    ("Exercise 5", fraction_of_peak),
], ids=lambda v: v if isinstance(v, str) else "")
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []


def test_typed_or_cached_answers_pass_the_notebook_only():
    memo = {}

    def cached(fn, *args):  # measures once, then returns what it measured the first time
        if "t" not in memo:
            memo["t"] = time_call(fn, *args)
        return memo["t"]

    assert ch02.check_time_call(cached).passed
    assess.failed(assess.graded(LAB, "Exercise 2", cached), "call fn(*args)")
    seen = ch02.check_time_call.exercise.run({"time_call": time_call})[0]["value"]
    typed = lambda fn, *a: time_call(fn, *a) and seen
    assert ch02.check_time_call(typed).passed
    assess.failed(assess.graded(LAB, "Exercise 2", typed), "not show", "typed in")
    rate = ch02.check_h2d_bandwidth.exercise.run({"h2d_bandwidth": h2d_bandwidth})[0]["value"]
    assess.failed(assess.graded(LAB, "Exercise 3", lambda h: h2d_bandwidth(h) and rate), "not show")
    table = {(2, 3, 4): 48, (128, 256, 512): 2 * 128 * 256 * 512, (1, 1000, 7): 14000}
    lookup = lambda m, k, n: table.get((m, k, n), 0)
    assert ch02.check_matmul_flops(lookup).passed
    assess.failed(assess.graded(LAB, "Exercise 1", lookup), "not show")


@pytest.mark.parametrize(("answer", "words"), [
    (lambda fn, *a: fn(*a).block_until_ready(), ["AttributeError", "every leaf"]),
    (lambda fn, *a: "0.03", ["string", "remove the quotes"]),
    (lambda fn, *a: None, ["one number"]),
    (lambda fn, *a: 1 / 0, ["ZeroDivisionError"]),
    (lambda fn, *a: time_call(fn) if a else 0.0, ["TypeError", "argument"]),
])
def test_timer_garbage_fails_with_a_hint(answer, words):
    assess.failed(ch02.check_time_call(answer), *words)


def test_the_clocks_and_device_put_are_put_back():
    real = jax.device_put
    ch02.check_time_call(time_call)
    ch02.check_h2d_bandwidth(lambda h: 1 / 0)
    assert time.perf_counter is tick and timeit.default_timer is tick and jax.device_put is real
    assert globals()["time"] is time and globals()["timeit"] is timeit


def test_copy_prediction_shortcuts():
    check = ch02.check_copy_prediction
    assert check(NotWritten("Exercise 4"), BW).status == "not written"
    assert check(BYTES / BW, NotWritten("Exercise 3")).status == "not written"
    assess.failed(check(BYTES / BW, -1.0), "fix Exercise 3")
    assess.failed(check(BYTES / 1.0, 1.0), "bandwidth = h2d_bandwidth")  # a pair made up to agree
    assess.failed(check("0.1", BW), "string")
    assess.failed(check(float("nan"), BW), "finite")
    assess.failed(check(1.0, BW), "bytes / bandwidth")


def test_fraction_of_another_chip_is_named_on_hidden_cases():
    v5e = lambda f, s, c: f / s / hardware.get("v5e").peak_bf16_flops_per_s
    assert ch02.check_fraction_of_peak(v5e).passed
    assess.failed(assess.graded(LAB, "Exercise 5", v5e), "hardware.get(chip)")
    assess.failed(ch02.check_fraction_of_peak(lambda f, s, c: "0.5"), "string")


def test_half_peak_needs_an_accelerator_and_the_scorecard_counts_zero():
    assert ch02.check_half_peak(1024).status == "skipped"
    assert ch02.LAB.scorecard({}).total() == "Lab 2: 0 of 5 passed, 1 skipped"


def test_half_peak_compare():
    fractions = dict(zip(ch02.SWEEP, (0.02, 0.05, 0.12, 0.4, 0.55, 0.7, 0.72)))
    compare = ch02.check_half_peak.exercise.compare
    assert compare(2048, fractions, None) is None and compare(1024, fractions, None) is None
    assert "only" in compare(256, fractions, None)
    assert "already" in compare(8192, {**fractions, 4096: 0.8}, None)
    assert "8192" in compare(None, {**fractions, 8192: 0.8}, None)
    assert compare(None, {n: 0.1 for n in ch02.SWEEP}, None) is None

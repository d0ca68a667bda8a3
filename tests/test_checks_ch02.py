"""Lab 2 checkers: right answers pass, plausible wrong ones fail with a hint, nothing raises.

The timing checkers are fed instrumented functions, so these tests do not depend on how
busy the machine is beyond a factor of 2.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np
import pytest

from tpu_course import hardware, transfer
from tpu_course.checks import NotWritten, ch02


def test_registry_has_a_transfer_and_a_prediction():
    kinds = {e.kind for e in ch02.LAB.exercises}
    assert {"transfer", "predict"} <= kinds and len(ch02.LAB.exercises) == 6


# -- Exercise 1 ---------------------------------------------------------------------------

def test_matmul_flops():
    assert ch02.check_matmul_flops(lambda m, k, n: 2 * m * k * n)
    r = ch02.check_matmul_flops(lambda m, k, n: m * k * n)
    assert not r and "multiply-accumulates" in r.message and r.answer
    r = ch02.check_matmul_flops(lambda m, k, n: 2 * m * n)
    assert not r and "missing" in r.message
    assert not ch02.check_matmul_flops(lambda m, k, n: str(2 * m * k * n))  # "48" is not a number
    assert not ch02.check_matmul_flops(lambda m, k, n: None)
    assert ch02.check_matmul_flops(NotWritten("Exercise 1")).status == "not written"


# -- Exercise 2 ---------------------------------------------------------------------------

def good_timer(fn, *args, repeats=5):
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def test_time_call_accepts_a_correct_timer():
    assert ch02.check_time_call(good_timer)
    assert ch02.check_time_call(lambda fn, *a: good_timer(fn, *a, repeats=3))


def test_time_call_catches_no_wait_no_warmup_and_one_sample():
    def no_wait(fn, *args):
        fn(*args)
        t = time.perf_counter()
        for _ in range(5):
            fn(*args)
        return (time.perf_counter() - t) / 5
    r = ch02.check_time_call(no_wait)
    assert not r and "never waited" in r.message

    def small_leaf_only(fn, *args):
        fn(*args)["small"].block_until_ready()
        t = time.perf_counter()
        for _ in range(5):
            fn(*args)["small"].block_until_ready()
        return (time.perf_counter() - t) / 5
    r = ch02.check_time_call(small_leaf_only)
    assert not r and "every leaf" in r.hint

    def mean_with_compile(fn, *args):
        t = time.perf_counter()
        for _ in range(5):
            jax.block_until_ready(fn(*args))
        return (time.perf_counter() - t) / 5
    r = ch02.check_time_call(mean_with_compile)
    assert not r and "warm-up" in r.hint

    def single(fn, *args):
        jax.block_until_ready(fn(*args))
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        return time.perf_counter() - t
    r = ch02.check_time_call(single)
    assert not r and "single call" in r.message

    def first_only(fn, *args):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        return time.perf_counter() - t
    r = ch02.check_time_call(first_only)
    assert not r and "compilation" in r.message


def test_time_call_rejects_units_and_garbage_without_raising():
    r = ch02.check_time_call(lambda fn, *a: good_timer(fn, *a) * 1e3)
    assert not r and "milliseconds" in r.hint
    r = ch02.check_time_call(lambda fn, *a: fn(*a).block_until_ready())  # a dict has no such method
    assert not r and "AttributeError" in r.message
    assert not ch02.check_time_call(lambda fn, *a: "0.02")
    assert not ch02.check_time_call(lambda fn, *a: (0.02, 0.03))


# -- Exercise 3 ---------------------------------------------------------------------------

def bandwidth(host, repeats=3):
    jax.device_put(host).block_until_ready()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.device_put(host).block_until_ready()
        samples.append(time.perf_counter() - t)
    return host.nbytes / statistics.median(samples)


SMALL = (512, 1024)  # 2 MiB keeps the tests quick


def test_h2d_bandwidth_accepts_bytes_per_second():
    assert ch02.check_h2d_bandwidth(bandwidth, shape=SMALL)


def test_h2d_bandwidth_rejects_bits_gigabytes_and_seconds():
    r = ch02.check_h2d_bandwidth(lambda h: 8 * bandwidth(h), shape=SMALL)
    assert not r and "bits" in r.hint
    r = ch02.check_h2d_bandwidth(lambda h: bandwidth(h) / 1e9, shape=SMALL)
    assert not r and "GB/s" in r.hint
    r = ch02.check_h2d_bandwidth(lambda h: h.nbytes / bandwidth(h), shape=SMALL)  # seconds
    assert not r
    assert not ch02.check_h2d_bandwidth(lambda h: str(bandwidth(h)), shape=SMALL)
    assert not ch02.check_h2d_bandwidth(lambda h: np.array([1.0, 2.0]), shape=SMALL)


def test_h2d_patch_is_removed_even_when_the_learner_raises():
    original = jax.device_put
    r = ch02.check_h2d_bandwidth(lambda h: 1 / 0, shape=SMALL)
    assert not r and "ZeroDivisionError" in r.message
    assert jax.device_put is original


# -- Exercise 4 ---------------------------------------------------------------------------

class FakeCopies:
    """Stands in for ``transfer.time_h2d``: copies at ``bytes_per_s``, each copy's time
    multiplied by the next factor of ``noise`` (a busy machine), counting the calls."""

    def __init__(self, bytes_per_s=2e9, noise=(1.0,)):
        self.bytes_per_s, self.noise, self.calls = bytes_per_s, noise, 0

    def __call__(self, host, device=None):
        self.calls += 1
        return host.nbytes / self.bytes_per_s * self.noise[self.calls % len(self.noise)]


def test_copy_prediction_within_three_x_and_named_mistakes(monkeypatch):
    shape = ch02.COPY_SHAPE
    fake = FakeCopies()
    monkeypatch.setattr(transfer, "time_h2d", fake)
    right = shape[0] * shape[1] * 4 / fake.bytes_per_s
    assert ch02.check_copy_prediction(right) and fake.calls == 6  # a warm-up and 5 copies
    r = ch02.check_copy_prediction(right / 8)  # a bandwidth in bits/s
    assert not r and "factor of 8" in r.hint and "ms" in r.answer
    r = ch02.check_copy_prediction(right / 4)  # elements, not bytes
    assert not r and "4 bytes per element" in r.hint
    r = ch02.check_copy_prediction(right * 1e3)  # milliseconds
    assert not r and "1000" in r.hint
    assert not ch02.check_copy_prediction(-right)
    assert not ch02.check_copy_prediction("0.1")
    assert not ch02.check_copy_prediction(float("nan"))
    assert ch02.check_copy_prediction(NotWritten("Ex 4")).status == "not written"


def test_copy_prediction_made_on_a_quiet_machine_passes_on_a_busy_one(monkeypatch):
    # the copies the check times vary 1x to 5x: a prediction from the quiet bandwidth is 5x
    # shorter than the slowest copy and below the median, yet right
    fake = FakeCopies(noise=(1.0, 5.0, 5.0, 4.0, 5.0, 5.0))
    monkeypatch.setattr(transfer, "time_h2d", fake)
    right = np.prod(ch02.COPY_SHAPE) * 4 / fake.bytes_per_s
    assert ch02.check_copy_prediction(right)
    assert not ch02.check_copy_prediction(right / 8)


def test_copy_prediction_measures_a_real_copy():
    # the real timer, on a small array: a prediction of an hour is refused with the copies'
    # measured range in the answer
    r = ch02.check_copy_prediction(3600.0, shape=SMALL)
    assert not r and "bytes took" in r.answer


# -- Exercise 5 ---------------------------------------------------------------------------

def test_fraction_of_peak():
    right = lambda f, s, c: f / s / hardware.get(c).peak_bf16_flops_per_s  # noqa: E731
    assert ch02.check_fraction_of_peak(right)
    r = ch02.check_fraction_of_peak(lambda f, s, c: 100 * right(f, s, c))
    assert not r and "percentage" in r.message and "0.558" not in r.message
    r = ch02.check_fraction_of_peak(lambda f, s, c: 1 / right(f, s, c))
    assert not r and "inverse" in r.message
    assert not ch02.check_fraction_of_peak(lambda f, s, c: "0.5")


# -- Exercise 6 ---------------------------------------------------------------------------

def test_half_peak_is_skipped_on_a_cpu_and_bf16_peak_handles_missing_values():
    assert ch02.check_half_peak(1024).status == "skipped"
    assert ch02.bf16_peak(None) is None
    assert ch02.bf16_peak(hardware.get("v5e")) == hardware.get("v5e").peak_bf16_flops_per_s


def test_scorecard_counts_zero_for_an_empty_namespace():
    assert ch02.LAB.scorecard({}).total() == "Lab 2: 0 of 5 passed, 1 skipped"

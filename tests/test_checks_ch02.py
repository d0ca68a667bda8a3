"""Lab 2 checkers: honest answers (not the course's) pass, also on the grader's hidden
inputs; every mistake and shortcut fails with a hint that names it; nothing raises.

Exercises 2 and 3 run the learner's timer on the checker's virtual clock, so these tests
neither sleep nor depend on how busy the machine is. Exercise 4 is graded as arithmetic
from the learner's own bandwidth; its real copies are faked here (``transfer.time_h2d``).
"""

from __future__ import annotations

import statistics
import time
import timeit
from time import perf_counter as tick

import jax
import numpy as np
import pytest

from tpu_course import hardware, roofline, transfer
from tpu_course.checks import NotWritten, _core, ch02, grading_seed
from tpu_course.checks._answers import ch02 as reference

SEED = grading_seed("someone", 2)


def test_registry_has_a_transfer_and_a_prediction():
    kinds = {e.kind for e in ch02.LAB.exercises}
    assert {"apply", "predict"} <= kinds and len(ch02.LAB.exercises) == 6
    assert ch02.LAB.find(4).predicts == ("predicted_copy_s",)
    for e in ch02.LAB.exercises:  # every function exercise has hidden inputs
        assert (e.hidden is not None) == (e.title in (ch02.EX1, ch02.EX2, ch02.EX3, ch02.EX5))


def hidden_pass(name, answer):
    ex = ch02.LAB.find(name)
    result = ex.grade_hidden({ex.names[0]: answer}, SEED)
    assert result, result
    return result


def expect(result, *words):
    text = f"{result.message} {result.hint}"
    assert not result.passed, result
    assert all(w in text for w in words), result


# -- Exercise 1 ---------------------------------------------------------------------------

def flops_by_loops(m, k, n):  # counted, not a formula: one multiply and one add per term
    per_output = sum(2 for _ in range(k))
    return per_output * m * n


def test_matmul_flops_honest_answers_pass_also_hidden():
    for answer in (flops_by_loops, lambda m, k, n: n * (k + k) * m):
        assert ch02.check_matmul_flops(answer)
        hidden_pass(1, answer)


@pytest.mark.parametrize("answer, words", [
    (lambda m, k, n: m * k * n, ["multiply-accumulates"]),
    (lambda m, k, n: 2 * m * n, ["missing"]),
    (lambda m, k, n: 2 * m * k * n + 1, ["off by a factor"]),
    (lambda m, k, n: str(2 * m * k * n), ["string"]),
    (lambda m, k, n: None, ["number"]),
])
@pytest.mark.mistake
def test_matmul_flops_mistakes(answer, words):
    expect(ch02.check_matmul_flops(answer), *words)


@pytest.mark.mistake
def test_matmul_flops_refuses_the_course_code():
    for answer in (reference.matmul_flops, roofline.matmul_flops,
                   lambda m, k, n: roofline.matmul_flops(m, k, n)):
        expect(ch02.check_matmul_flops(answer), "course's own function")
    assert ch02.check_matmul_flops(NotWritten("Exercise 1")).status == "not written"


@pytest.mark.mistake
def test_matmul_flops_hidden_shapes_catch_a_hard_coded_answer():
    table = {(2, 3, 4): 48, (128, 256, 512): 2 * 128 * 256 * 512, (1, 1000, 7): 14000}
    answer = lambda m, k, n: table.get((m, k, n), 0)
    assert ch02.check_matmul_flops(answer)
    graded = ch02.LAB.grade({"matmul_flops": answer}, seed=SEED)[0]
    assert not graded and "another matmul shape" in graded.message


# -- Exercise 2 ---------------------------------------------------------------------------

def median_timer(fn, *args):  # the chapter's way, written out
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def throughput_timer(fn, *args):  # another honest way: queue 8 calls, wait for the last
    out = fn(*args)
    for leaf in out.values():
        leaf.block_until_ready()
    start = tick()  # `from time import perf_counter as tick`
    for _ in range(8):
        out = fn(*args)
    jax.block_until_ready(out)
    return (tick() - start) / 8


def min_timer(fn, *args):  # timeit's clock, the minimum of 4
    np.asarray(fn(*args)["big"])  # reading the value waits too
    best = float("inf")
    for _ in range(4):
        t = timeit.default_timer()
        jax.block_until_ready(fn(*args))
        best = min(best, timeit.default_timer() - t)
    return best


def timer_without_warmup(fn, *args):
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)  # the median hides the compile, not the mistake


def timer_returning_a_constant(fn, *args):
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    return 0.02


def timer_that_ignores_its_samples(fn, *args):
    median_timer(fn, *args)
    return 0.02


def timer_returning_the_total(fn, *args):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def timer_with_the_method(fn, *args):
    fn(*args).block_until_ready()  # the chapter's form, on a dict
    return 0.0


def timer_without_wait(fn, *args):
    fn(*args)
    t = time.perf_counter()
    for _ in range(5):
        fn(*args)
    return (time.perf_counter() - t) / 5


def timer_waiting_on_one_leaf(fn, *args):
    fn(*args)["small"].block_until_ready()
    t = time.perf_counter()
    for _ in range(5):
        fn(*args)["small"].block_until_ready()
    return (time.perf_counter() - t) / 5


def timer_stopping_before_the_wait(fn, *args):
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        out = fn(*args)
        samples.append(time.perf_counter() - t)
        jax.block_until_ready(out)
    return statistics.median(samples)


def timer_of_one_call(fn, *args):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def timer_first_call_only(fn, *args):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t


def test_time_call_honest_timers_pass_also_hidden():
    for answer in (median_timer, throughput_timer, min_timer):
        r = ch02.check_time_call(answer)
        assert r and "warmed up" in r.message, r
        hidden_pass(2, answer)


@pytest.mark.parametrize("answer, words", [
    (timer_without_warmup, ["includes the first call", "warm-up"]),
    (timer_returning_a_constant, ["not measured", "read no clock"]),
    (timer_that_ignores_its_samples, ["not one of them", "typed in"]),
    (timer_returning_the_total, ["total time of the 5 calls", "divide"]),
    (timer_with_the_method, ["AttributeError", "jax.block_until_ready(result)", "every leaf"]),
    (timer_without_wait, ["never waited", "jax.block_until_ready"]),
    (timer_waiting_on_one_leaf, ["never waited", "every leaf"]),
    (timer_stopping_before_the_wait, ["shorter", "after jax.block_until_ready"]),
    (timer_of_one_call, ["single call"]),
    (timer_first_call_only, ["compilation"]),
    (lambda fn, *a: median_timer(fn, *a) * 1e3, ["milliseconds"]),
    (lambda fn, *a: median_timer(fn, *a) * 1e6, ["microseconds"]),
    (lambda fn, *a: "0.02", ["string"]),
    (lambda fn, *a: (0.02, 0.03), ["number"]),
    (lambda fn, *a: 1 / 0, ["ZeroDivisionError"]),
])
@pytest.mark.mistake
def test_time_call_mistakes(answer, words):
    r = ch02.check_time_call(answer)
    expect(r, *words)
    if "string" not in words and "number" not in words and "ZeroDivisionError" not in words \
            and "AttributeError" not in words:
        assert r.answer


@pytest.mark.mistake
def test_a_constant_equal_to_the_visible_answer_fails_hidden():
    measured = ch02.check_time_call(median_timer).message.split(" ms")[0]
    constant = float(measured) / 1e3

    def typed(fn, *args):
        median_timer(fn, *args)
        return constant

    assert ch02.check_time_call(typed)  # the one visible case can be copied...
    graded = ch02.LAB.grade({"time_call": typed}, seed=SEED)[1]
    assert not graded and "does not show" in graded.message  # ...the hidden ones cannot


@pytest.mark.mistake
def test_time_call_refuses_the_course_code_and_puts_the_clocks_back():
    from tpu_course import bench

    expect(ch02.check_time_call(reference.time_call), "course's own function")
    expect(ch02.check_time_call(lambda fn, *a: bench.benchmark(fn, *a).median_s),
           "course's own function")
    assert time.perf_counter is tick and timeit.default_timer is tick
    assert globals()["time"] is time and globals()["tick"] is time.perf_counter


# -- Exercise 3 ---------------------------------------------------------------------------

SMALL = (512, 1024)  # 2 MiB keeps the tests quick


def median_bandwidth(host):
    jax.device_put(host).block_until_ready()
    samples = []
    for _ in range(3):
        t = time.perf_counter()
        jax.device_put(host).block_until_ready()
        samples.append(time.perf_counter() - t)
    return host.nbytes / statistics.median(samples)


def batch_bandwidth(host):  # another honest way: warm up, 4 copies, wait for them all
    np.asarray(jax.device_put(host))
    start = tick()
    copies = [jax.device_put(host) for _ in range(4)]
    jax.block_until_ready(copies)
    return 4 * host.size * host.itemsize / (tick() - start)


def bandwidth_without_wait(host):
    jax.device_put(host)
    t = time.perf_counter()
    jax.device_put(host)
    return host.nbytes / (time.perf_counter() - t)


def bandwidth_stopping_before_the_wait(host):
    jax.device_put(host).block_until_ready()
    t = time.perf_counter()
    x = jax.device_put(host)
    seconds = time.perf_counter() - t
    x.block_until_ready()
    return host.nbytes / seconds


def bandwidth_with_the_first_copy(host):
    samples = []
    for _ in range(3):
        t = time.perf_counter()
        jax.device_put(host).block_until_ready()
        samples.append(time.perf_counter() - t)
    return host.nbytes / statistics.mean(samples)


def bandwidth_of_a_typed_number(host):
    median_bandwidth(host)
    return 2e10


def bandwidth_of_the_total(host):
    jax.device_put(host).block_until_ready()
    t = time.perf_counter()
    for _ in range(4):
        jax.device_put(host).block_until_ready()
    return host.nbytes / (time.perf_counter() - t)


def test_h2d_bandwidth_honest_answers_pass_also_hidden():
    for answer in (median_bandwidth, batch_bandwidth):
        r = ch02.check_h2d_bandwidth(answer)
        assert r and "bytes per second" in r.message, r
        hidden_pass(3, answer)


@pytest.mark.parametrize("answer, words", [
    (bandwidth_without_wait, ["never waited", "block_until_ready"]),
    (bandwidth_stopping_before_the_wait, ["faster than the link", "inside the timed region"]),
    (lambda h: median_bandwidth(h) / h.itemsize, ["elements per second", "nbytes"]),
    (lambda h: h.size / (h.nbytes / median_bandwidth(h)), ["elements per second"]),
    (lambda h: 8 * median_bandwidth(h), ["bits per second"]),
    (lambda h: median_bandwidth(h) / 8, ["divided by 8"]),
    (lambda h: median_bandwidth(h) / 1e9, ["GB/s"]),
    (lambda h: median_bandwidth(h) / 2**30, ["GiB/s"]),
    (lambda h: median_bandwidth(h) / 1e6, ["MB/s"]),
    (lambda h: h.nbytes / median_bandwidth(h), ["seconds a copy took"]),
    (bandwidth_with_the_first_copy, ["first copy", "untimed copy first"]),
    (bandwidth_of_a_typed_number, ["not one of them", "typed in"]),
    (bandwidth_of_the_total, ["time of several"]),
    (lambda h: 1e9, ["never called jax.device_put"]),
    (lambda h: str(median_bandwidth(h)), ["string"]),
    (lambda h: np.array([1.0, 2.0]), ["one number"]),
])
@pytest.mark.mistake
def test_h2d_bandwidth_mistakes(answer, words):
    expect(ch02.check_h2d_bandwidth(answer, shape=SMALL), *words)


@pytest.mark.mistake
def test_a_typed_bandwidth_equal_to_the_visible_one_fails_hidden():
    seen = []
    assert ch02.check_h2d_bandwidth(lambda h: seen.append(median_bandwidth(h)) or seen[-1])
    typed = lambda h: median_bandwidth(h) and seen[0]
    assert ch02.check_h2d_bandwidth(typed)
    graded = ch02.LAB.grade({"h2d_bandwidth": typed}, seed=SEED)[2]
    expect(graded, "does not show", "typed in")


def test_elements_per_second_is_named_for_other_dtypes_too():
    r = ch02.check_h2d_bandwidth(lambda h: median_bandwidth(h) / h.itemsize,
                                 shape=(300, 200), dtype="float64")
    expect(r, "elements per second", "8 bytes each")


@pytest.mark.mistake
def test_h2d_refuses_the_course_code_and_restores_device_put():
    original = jax.device_put
    expect(ch02.check_h2d_bandwidth(reference.h2d_bandwidth), "course's own function")
    expect(ch02.check_h2d_bandwidth(lambda h: h.nbytes / transfer.time_h2d(h)),
           "course's own function")
    r = ch02.check_h2d_bandwidth(lambda h: 1 / 0, shape=SMALL)
    assert not r and "ZeroDivisionError" in r.message
    assert jax.device_put is original


# -- Exercise 4 ---------------------------------------------------------------------------

class FakeCopies:
    """Stands in for ``transfer.time_h2d``: copies at ``bytes_per_s`` times a noise factor
    (a busy machine), counting the calls."""

    def __init__(self, bytes_per_s=2e9, noise=(1.0,)):
        self.bytes_per_s, self.noise, self.calls = bytes_per_s, noise, 0

    def __call__(self, host, device=None):
        self.calls += 1
        return host.nbytes / self.bytes_per_s * self.noise[self.calls % len(self.noise)]


BANDWIDTH = 3.1e9  # what the learner measured in Exercise 3
RIGHT = np.prod(ch02.COPY_SHAPE) * 4 / BANDWIDTH


@pytest.fixture
def copies(monkeypatch):
    fake = FakeCopies()
    monkeypatch.setattr(transfer, "time_h2d", fake)
    return fake


def test_copy_prediction_is_arithmetic_from_the_learners_bandwidth(copies):
    r = ch02.check_copy_prediction(RIGHT, BANDWIDTH)
    assert r and "timed now" in r.message and copies.calls == 4  # a warm-up and 3 copies
    assert ch02.check_copy_prediction(round(RIGHT, 2), BANDWIDTH)  # a rounded prediction
    assert ch02.check_copy_prediction(np.prod(ch02.COPY_SHAPE) * 4 / 3e9, BANDWIDTH)  # 3 GB/s


def test_copy_prediction_right_on_a_busy_machine(monkeypatch):
    monkeypatch.setattr(transfer, "time_h2d", FakeCopies(bytes_per_s=0.3e9, noise=(1, 5, 9)))
    assert ch02.check_copy_prediction(RIGHT, BANDWIDTH)  # copies now 10x slower: still right


@pytest.mark.parametrize("prediction, words", [
    (RIGHT / 2, ["half", "2 bytes per element"]),  # bf16's bytes
    (RIGHT / 4, ["quarter", "elements"]),  # elements for bytes, or Exercise 3's array
    (RIGHT * 8, ["8x too long", "bits"]),
    (RIGHT / 8, ["8x too short", "bits per second"]),
    (RIGHT * 1e3, ["1000x", "milliseconds"]),
    (1.0, ["arithmetic from your own bandwidth", "bytes / bandwidth"]),  # a flat second
    (BANDWIDTH / (np.prod(ch02.COPY_SHAPE) * 4), ["divided the bandwidth by the bytes"]),
    (-RIGHT, ["positive"]),
    ("0.1", ["string"]),
    (float("nan"), ["finite"]),
])
@pytest.mark.mistake
def test_copy_prediction_mistakes(copies, prediction, words):
    r = ch02.check_copy_prediction(prediction, BANDWIDTH)
    expect(r, *words)
    assert copies.calls == 0  # a wrong prediction needs no copy


@pytest.mark.mistake
def test_copy_prediction_garbage_and_unwritten():
    assert ch02.check_copy_prediction(NotWritten("Ex 4"), BANDWIDTH).status == "not written"
    assert ch02.check_copy_prediction(RIGHT, NotWritten("Ex 3")).status == "not written"
    expect(ch02.check_copy_prediction(RIGHT, -1.0), "fix Exercise 3")


def test_copy_prediction_is_locked_once_the_measurement_shows(copies, capsys):
    ch02.LAB.predict("Exercise 4", RIGHT / 2)
    assert ch02.LAB.predicted("Exercise 4")
    r = ch02.check_copy_prediction(RIGHT, BANDWIDTH)  # edited after the measurement showed
    assert not r and "recorded before the measurement" in r.message
    _core._PREDICTIONS.clear()
    assert not ch02.LAB.predicted("Exercise 4")
    assert "once your prediction is recorded" in capsys.readouterr().out


def test_copy_prediction_measures_a_real_copy():
    r = ch02.check_copy_prediction(np.prod((512, 1024)) * 4 / 2e9, 2e9, shape=(512, 1024))
    assert r and "timed now take" in r.message


# -- Exercise 5 ---------------------------------------------------------------------------

def fraction_via_time(flops, seconds, chip):  # another way round: the time at the peak
    at_peak_s = flops / hardware.get(chip).peak_bf16_flops_per_s
    return at_peak_s / seconds


def test_fraction_of_peak_honest_answers_pass_also_hidden():
    assert ch02.check_fraction_of_peak(fraction_via_time)
    hidden_pass(5, fraction_via_time)


@pytest.mark.parametrize("answer, words", [
    (lambda f, s, c: 100 * fraction_via_time(f, s, c), ["percentage"]),
    (lambda f, s, c: 1 / fraction_via_time(f, s, c), ["inverse"]),
    (lambda f, s, c: f * s / hardware.get(c).peak_bf16_flops_per_s, ["multiplied by the time"]),
    (lambda f, s, c: f / s / hardware.get("v5e").peak_bf16_flops_per_s, None),
    (lambda f, s, c: "0.5", ["string"]),
])
@pytest.mark.mistake
def test_fraction_of_peak_mistakes(answer, words):
    if words is None:  # the v5e's peak typed for every chip: passes visibly, not hidden
        assert ch02.check_fraction_of_peak(answer)
        r = ch02.LAB.grade({"fraction_of_peak": answer}, seed=SEED)[4]
        expect(r, "another chip", "another chip's peak")
    else:
        expect(ch02.check_fraction_of_peak(answer), *words)
    expect(ch02.check_fraction_of_peak(reference.fraction_of_peak), "course's own function")


# -- Exercise 6 ---------------------------------------------------------------------------

def test_half_peak_is_skipped_on_a_cpu_and_bf16_peak_handles_missing_values():
    assert ch02.check_half_peak(1024).status == "skipped"
    assert hardware.bf16_matrix_peak(None) is None
    assert hardware.bf16_matrix_peak(hardware.get("v5e")) == hardware.get("v5e").peak_bf16_flops_per_s
    with pytest.raises(AttributeError, match="moved to tpu_course.hardware"):
        ch02.bf16_peak  # noqa: B018 - chapter 2 and the checker share hardware's


def test_scorecard_counts_zero_for_an_empty_namespace():
    assert ch02.LAB.scorecard({}).total() == "Lab 2: 0 of 5 passed, 1 skipped"


def test_an_honest_lab_passes_the_grader_with_hidden_inputs(monkeypatch):
    monkeypatch.setattr(transfer, "time_h2d", FakeCopies())
    namespace = {"matmul_flops": flops_by_loops, "time_call": throughput_timer,
                 "h2d_bandwidth": batch_bandwidth, "predicted_copy_s": RIGHT,
                 "bandwidth": BANDWIDTH, "fraction_of_peak": fraction_via_time,
                 "half_peak_n": 1024}
    results = ch02.LAB.grade(namespace, seed=SEED)
    assert [r.status for r in results] == ["passed"] * 5 + ["skipped"], results

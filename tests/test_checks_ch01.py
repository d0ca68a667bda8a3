"""Lab 1 checkers accept the solution, name the plausible mistakes, and never raise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tpu_course import systolic
from tpu_course.checks import NotWritten, ch01


def test_registry_lists_every_exercise_with_a_transfer_and_a_prediction():
    lab = ch01.LAB
    assert [e.title for e in lab.exercises] == [ch01.EX1, ch01.EX2, ch01.EX3, ch01.EX4, ch01.EX5]
    assert {"transfer", "predict"} <= {e.kind for e in lab.exercises}
    assert lab.minutes == sum(e.minutes for e in lab.exercises) > 0


# -- Exercise 1 -------------------------------------------------------------------------

def tiled(a, b, rows, cols, sim, transpose_first=False, accumulate=True, result=True):
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.int64)
    for n0 in range(0, n, cols):
        for k0 in range(0, k, rows):
            w = b[k0:k0 + rows, n0:n0 + cols]
            if transpose_first and (k0, n0) == (0, 0):
                w = w.T
            run = sim(a[:, k0:k0 + rows], w, rows, cols)
            part = run.result if result else run
            if accumulate:
                out[:, n0:n0 + cols] += part
            else:
                out[:, n0:n0 + cols] = part
    return out


def test_tiled_matmul_accepts_solution():
    assert ch01.check_tiled_matmul(tiled)
    assert ch01.check_tiled_matmul(tiled, rows=3, cols=5, shape=(7, 11, 12))


def test_tiled_matmul_names_mistakes():
    r = ch01.check_tiled_matmul(lambda *a: tiled(*a, accumulate=False))
    assert not r and "one K tile" in r.message
    r = ch01.check_tiled_matmul(lambda *a: tiled(*a, transpose_first=True))
    assert not r and "transposed" in r.message
    r = ch01.check_tiled_matmul(lambda a, b, r, c, sim: a @ b)
    assert not r and "never called sim" in r.message
    r = ch01.check_tiled_matmul(lambda a, b, r, c, sim: sim(a, b, r, c).result)
    assert not r and "tile" in r.message


def test_tiled_matmul_explains_a_forgotten_result_and_odd_returns():
    r = ch01.check_tiled_matmul(lambda *a: tiled(*a, result=False))  # UFuncTypeError
    assert not r and ".result" in r.hint
    r = ch01.check_tiled_matmul(lambda a, b, r, c, sim: sim(a[:, :r], b[:r, :c], r, c))
    assert not r and "SystolicRun" in r.message
    r = ch01.check_tiled_matmul(lambda a, b, r, c, sim: None)
    assert not r and "None" in r.message
    r = ch01.check_tiled_matmul(lambda a, b, r, c, sim: [sim(a[:, :r], b[:r, :c], r, c)] * 2)
    assert not r
    r = ch01.check_tiled_matmul(lambda a, b, r, c, sim: 1 / 0)
    assert not r and "ZeroDivisionError" in r.message
    assert ch01.check_tiled_matmul(NotWritten("Exercise 1")).status == "not written"


def test_tiled_matmul_hides_the_expected_value_in_the_answer():
    def off(a, b, r, c, sim):
        out = tiled(a, b, r, c, sim)
        out[0, 0] += 1
        return out
    r = ch01.check_tiled_matmul(off)
    assert not r and r.answer and "[0,0]" in r.message


# -- Exercise 2 -------------------------------------------------------------------------

def truth():
    m, k, n = ch01.GEMM
    return {s: (systolic.cycle_count(m, k, n, s, s), systolic.utilization(m, k, n, s, s))
            for s in (128, 256)}


def test_gemm_prediction_accepts_the_right_numbers_and_rounding():
    t = truth()
    assert ch01.check_gemm_prediction(t[128], t[256], "256x256")
    rounded = [(round(c, -2), round(u, 2)) for c, u in (t[128], t[256])]
    assert ch01.check_gemm_prediction(*rounded, 256)


def test_gemm_prediction_names_mistakes():
    t = truth()
    m, k, n = ch01.GEMM
    ss = systolic.cycle_count(m, k, n, 128, 128, "ws", "scalesim")
    r = ch01.check_gemm_prediction((ss, t[128][1]), t[256], "256x256")
    assert not r and "SCALE-Sim" in r.hint and r.answer and str(t[128][0]) not in r.message
    r = ch01.check_gemm_prediction(t[128], (t[256][0], 100 * t[256][1]), "256x256")
    assert not r and "percentage" in r.message
    r = ch01.check_gemm_prediction(t[128], t[256], "128x128")
    assert not r and "does not finish first" in r.message
    pad = m * 512 * 768 / (256 * 256 * t[256][0])  # K and N padded to multiples of 256
    r = ch01.check_gemm_prediction(t[128], (t[256][0], pad), "256x256")
    assert not r and "padded" in r.hint


def test_gemm_prediction_rejects_garbage_without_raising():
    t = truth()
    for bad in (t[128][0], "3382", None, np.zeros(3), ("3382", 0.9)):
        r = ch01.check_gemm_prediction(bad, t[256], "256x256")
        assert not r and r.status == "failed"
    r = ch01.check_gemm_prediction(t[128], t[256], "both")
    assert not r and "one array" in r.message
    assert ch01.check_gemm_prediction(NotWritten("Ex"), t[256], "256").status == "not written"


# -- Exercise 3 -------------------------------------------------------------------------

def test_smallest_batch_reference_is_the_simulators_threshold():
    m = ch01.smallest_batch_reference(1024, 1024, 128, 128)
    rng = np.random.default_rng(0)
    b = rng.integers(-1, 2, (1024, 1024))
    assert systolic.simulate(rng.integers(-1, 2, (m, 1024)), b, 128, 128).utilization >= 0.9
    assert systolic.simulate(rng.integers(-1, 2, (m - 1, 1024)), b, 128, 128).utilization < 0.9
    assert ch01.smallest_batch_reference(100, 1024, 128, 128) is None


def test_smallest_batch_accepts_solution_and_names_mistakes():
    assert ch01.check_smallest_batch(ch01.smallest_batch_reference)
    r = ch01.check_smallest_batch(lambda K, N, R, C: R)
    assert not r and "fill and drain" in r.hint and r.answer
    r = ch01.check_smallest_batch(lambda K, N, R, C: ch01.smallest_batch_reference(K, N, R, C) + 1
                                  if ch01.smallest_batch_reference(K, N, R, C) else None)
    assert not r and "off by one" in r.hint
    r = ch01.check_smallest_batch(lambda K, N, R, C: ch01.smallest_batch_reference(K, N, R, C) or 5000)
    assert not r and "no batch" in r.message


def test_smallest_batch_stops_an_endless_loop_and_rejects_strings():
    def forever(K, N, R, C):
        while True:
            pass
    r = ch01.check_smallest_batch(forever, cases=((100, 1024, 128, 128),), time_limit_s=0.5)
    assert not r and "more than" in r.message
    r = ch01.check_smallest_batch(lambda K, N, R, C: "123")
    assert not r and "string" in r.message


# -- Exercise 4 -------------------------------------------------------------------------

def best(M, K, N, R, C):
    counts = {d: systolic.cycle_count(M, K, N, R, C, d) for d in ("ws", "is", "os")}
    return min(counts, key=counts.get)


def test_best_dataflow_accepts_solution_and_rejects_fixed_choices():
    assert ch01.check_best_dataflow(best)
    winners = {best(*c) for c in ch01.DATAFLOW_CASES}
    assert winners == {"ws", "is", "os"}  # each dataflow wins somewhere
    for fixed in ("ws", "is", "os"):
        r = ch01.check_best_dataflow(lambda *a, f=fixed: f)
        assert not r and r.answer
    assert ch01.check_best_dataflow(lambda *a: "weight-stationary" if best(*a) == "ws" else best(*a))
    r = ch01.check_best_dataflow(lambda *a: 3)
    assert not r and "not a dataflow" in r.message


# -- Exercise 5 -------------------------------------------------------------------------

def test_stall_accepts_the_value_and_names_mistakes():
    assert ch01.bf16_running_sum(np.full(2000, 0.1, np.float32)) == 32.0
    assert ch01.check_stall(32.0) and ch01.check_stall(32)
    r = ch01.check_stall(16.0)
    assert not r and "rounds UP" in r.hint and "32" not in r.message
    r = ch01.check_stall(64.0)
    assert not r and r.answer
    r = ch01.check_stall(256.0)
    assert not r
    assert not ch01.check_stall("32")
    assert not ch01.check_stall(np.array([32.0, 1.0]))
    assert ch01.check_stall(np.float32(32.0))


def test_scorecard_of_an_empty_namespace_is_zero_and_of_the_answers_full():
    t = truth()
    blank = ch01.LAB.scorecard({})
    assert blank.total() == "Lab 1: 0 of 5 passed"
    ns = {"tiled_matmul": tiled, "predicted_128": t[128], "predicted_256": t[256],
          "finishes_first": "256x256", "smallest_batch": ch01.smallest_batch_reference,
          "best_dataflow": best, "predicted_stall": 32.0}
    assert ch01.LAB.scorecard(ns).total() == "Lab 1: 5 of 5 passed"

"""Lab 1's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import grading
from tests import assess
from tpu_course import systolic

LAB = 1


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


def ws_cycle(w, act, psum, a, s):
    """Cell by cell, with explicit loops (the course's is vectorised)."""
    rows, cols = w.shape
    new_act = np.zeros_like(act)
    new_psum = np.zeros_like(psum)
    for r in range(rows):
        for c in range(cols):
            if c == 0:
                i = s - r
                new_act[r, c] = a[i, r] if r < a.shape[1] and 0 <= i < a.shape[0] else 0
            else:
                new_act[r, c] = act[r, c - 1]
            new_psum[r, c] = (psum[r - 1, c] if r else 0) + new_act[r, c] * w[r, c]
    return new_act, new_psum


def tiled_matmul(a, b, rows, cols, sim):
    """Tiles listed first, then summed with np.add.at-like slicing; K loop outside."""
    m, n = a.shape[0], b.shape[1]
    out = np.zeros((m, n))
    tiles = [(k0, n0) for k0 in range(0, a.shape[1], rows) for n0 in range(0, n, cols)]
    for k0, n0 in tiles:
        part = sim(a[:, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols], rows, cols).result
        out[:, n0:n0 + part.shape[1]] = out[:, n0:n0 + part.shape[1]] + part
    return out.astype(int)


def smallest_batch(K, N, rows, cols):
    """Linear scan with the closed form written out (the course's bisects)."""
    folds = -(-K // rows) * -(-N // cols)
    best = K * N / (folds * rows * cols)
    if best < 0.9:
        return None
    m = 1
    while m * K * N < 0.9 * rows * cols * (rows + (folds - 1) * max(m, rows) + m + rows + cols - 2):
        m += 1 if m < 4096 else m // 64
        while m > 4096 and m * K * N >= 0.9 * rows * cols * (
                rows + (folds - 1) * max(m, rows) + m + rows + cols - 2):
            m -= 1
            if (m) * K * N < 0.9 * rows * cols * (rows + (folds - 1) * max(m, rows) + m + rows + cols - 2):
                return m + 1
    return m


def best_dataflow(M, K, N, rows, cols):
    """By name of what streams: 'is' streams N, 'ws' streams M, 'os' streams K."""
    def t(held_r, held_c, streamed, load, drain):
        f = math.ceil(held_r / rows) * math.ceil(held_c / cols)
        return load + (f - 1) * max(streamed, rows) + streamed + rows + cols - 2 + drain
    options = [(t(K, N, M, rows, 0), "ws"), (t(K, M, N, rows, 0), "is"), (t(M, N, K, 0, rows), "os")]
    return sorted(options)[0][1]


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 1", ws_cycle),
    ("Exercise 2", tiled_matmul),
    ("Exercise 3", {"predicted_128": (3_380, 0.887), "predicted_256": [2_250, 0.333],
                    "finishes_first": "the 256 one"}),
    ("Exercise 4", smallest_batch),
    ("Exercise 5", best_dataflow),
    ("Exercise 6", {"predicted_stall": np.float32(32)}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


def test_gemm_prediction_is_the_simulators():
    # The prediction above is within 5 % of the simulator; this pins the truth itself.
    from tpu_course.checks import ch01
    (c128, u128), (c256, u256), first = ch01.gemm_truth()
    assert first == 256 and c128 == systolic.simulate(
        np.ones((200, 384)), np.ones((384, 640)), 128, 128).cycles


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []


def test_a_step_that_keeps_state_is_refused():
    calls = []

    def counting(w, act, psum, a, s):  # right only when called in order
        calls.append(s)
        return ws_cycle(w, act, psum, a, len(calls) - 1)

    result = assess.graded(LAB, "Exercise 1", counting)
    assert result.status == "failed" and "besides its arguments" in result.message


def test_the_simulators_trace_is_not_an_answer():
    # A step read off the simulator ignores the registers it is given: grading feeds
    # registers holding any values, where only a real step is right.
    def from_the_simulator(w, act, psum, a, s):
        k = a.shape[1]
        run = systolic.simulate(a, w[:k], *w.shape, trace=True)
        frame = run.trace[w.shape[0] + s]
        return np.nan_to_num(frame.horizontal), np.nan_to_num(frame.vertical)

    assert assess.graded(LAB, "Exercise 1", from_the_simulator).status == "failed"

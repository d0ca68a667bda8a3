"""Lab 1 checkers: honest answers that are not the course's pass (also on the grader's
unseen inputs), every mistake and shortcut fails with its own hint, the course's own
functions are refused, predictions are locked before the measurement shows, and no
checker raises."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from tpu_course import checks, systolic
from tpu_course.checks import NotWritten, ch01
from tpu_course.checks._answers import ch01 as answers

SEED = checks.grading_seed("someone", 1)


def test_registry_lists_every_exercise_with_a_transfer_and_a_prediction():
    lab = ch01.LAB
    assert [e.title for e in lab.exercises] == [ch01.EX1, ch01.EX2, ch01.EX3, ch01.EX4, ch01.EX5,
                                                ch01.EX6]
    assert {"apply", "predict"} <= {e.kind for e in lab.exercises}
    assert lab.minutes == sum(e.minutes for e in lab.exercises) > 0
    # every exercise whose answer is a function is graded on unseen inputs too
    assert [e.hidden is not None for e in lab.exercises] == [True, True, False, True, True, False]


def test_the_course_references_are_not_public_names_of_the_checker():
    for name in ("smallest_batch_reference", "bf16_running_sum", "_bf16", "ws_cycle"):
        assert not hasattr(ch01, name)
    assert answers.bf16_running_sum(np.full(2000, 0.1, np.float32)) == 32.0


# -- Exercise 1 -------------------------------------------------------------------------

def cycle(w, act, psum, a, s, feed=lambda s, k: s - k, move="right", sums="down",
          wrap=False, clip=False):
    """Honest, not the course's (np.roll and a list), with switches for the mistakes."""
    rows = w.shape[0]
    m, k = a.shape
    x = np.zeros(rows, act.dtype)
    for r in range(min(rows, k)):
        i = feed(s, r)
        if clip:
            i = min(max(i, 0), m - 1)
        if 0 <= i < m or (wrap and -m <= i < m):
            x[r] = a[i, r]
    old = act.copy()
    if move == "right":
        act = np.roll(act, 1, axis=1)
        act[:, 0] = x
    elif move == "left":
        act = np.roll(act, -1, axis=1)
        act[:, 0] = x
    elif move == "broadcast":
        act = np.tile(x[:, None], (1, act.shape[1]))
    prod = (old if sums == "old" else act) * w
    if sums in ("down", "old"):
        below = np.roll(psum, 1, axis=0)
        below[0] = 0
        return act, below + prod
    if sums == "stays":
        return act, psum + prod
    if sums == "fresh":
        return act, prod
    if sums == "roll":
        return act, np.roll(psum, 1, axis=0) + prod
    raise AssertionError(sums)


def cycle_loops(w, act, psum, a, s):
    """Honest, not the course's: plain loops over the cells, bottom row first in place."""
    rows, cols = w.shape
    for k in range(rows):
        for j in range(cols - 1, 0, -1):
            act[k, j] = act[k, j - 1]
        i = s - k
        act[k, 0] = a[i, k] if k < a.shape[1] and 0 <= i < a.shape[0] else 0
    for k in range(rows - 1, -1, -1):
        for j in range(cols):
            psum[k, j] = (psum[k - 1, j] if k else 0) + act[k, j] * w[k, j]
    return act, psum


@pytest.mark.parametrize("honest", [cycle, cycle_loops])
def test_ws_cycle_accepts_honest_answers_also_on_unseen_arrays(honest):
    assert ch01.check_ws_cycle(honest)
    assert ch01.check_ws_cycle(honest, rows=2, cols=5, shape=(3, 2, 5))
    graded = ch01.LAB.exercises[0].grade_hidden({"ws_cycle": honest}, SEED)
    assert graded, graded


def test_ws_cycle_reference_equals_the_simulators_trace():
    for rows, cols, shape in ((4, 4, (5, 4, 4)), (4, 3, (6, 3, 2)), (2, 6, (1, 1, 6))):
        m, k, n = shape
        rng = np.random.default_rng(rows * cols)
        a, b = rng.integers(-5, 6, (m, k)), rng.integers(-5, 6, (k, n))
        w = np.zeros((rows, cols), np.int64)
        w[:k, :n] = b
        act = psum = np.zeros((rows, cols), np.int64)
        for s, (want_act, want_psum) in enumerate(ch01._trace_registers(a, b, rows, cols)):
            act, psum = answers.ws_cycle(w, act, psum, a, s)
            assert np.array_equal(act, want_act) and np.array_equal(psum, want_psum), s


def test_ws_cycle_check_is_non_square_and_hides_other_arrays():
    ex = ch01.LAB.exercises[0]
    rows, cols, (m, k, n), _ = ex.check.__defaults__
    assert rows != cols and k < rows  # a padded row in the notebook's check
    kinds = [what for what, _ in ex.hidden(np.random.default_rng(SEED))]
    assert any("tall" in w for w in kinds) and any("wide" in w for w in kinds)
    assert any("shorter" in w for w in kinds)


EX1_MISTAKES = [
    (functools.partial(cycle, feed=lambda s, k: s), "no skew"),
    (functools.partial(cycle, feed=lambda s, k: s - (3 - k)), "skew runs the wrong way"),
    (functools.partial(cycle, move="left"), "move the wrong way"),
    (functools.partial(cycle, move="broadcast"), "same cycle"),
    (functools.partial(cycle, sums="stays"), "partial sums not passed down"),
    (functools.partial(cycle, sums="fresh"), "partial sums not passed down"),
    (functools.partial(cycle, sums="roll"), "wrap around"),
    (functools.partial(cycle, sums="old"), "before it moved"),
    (functools.partial(cycle, feed=lambda s, k: s - k - 1), "off by one cycle"),
    (functools.partial(cycle, feed=lambda s, k: s - k + 1), "off by one cycle"),
    (functools.partial(cycle, feed=lambda s, k: s - 4 - k), "R cycles of the weight load"),
    (functools.partial(cycle, wrap=True), "negative index wraps"),
    (functools.partial(cycle, clip=True), "not the first or last row"),
    # two mistakes at once: both named
    (functools.partial(cycle, feed=lambda s, k: s, sums="stays"),
     "no skew|partial sums not passed down"),
]


@pytest.mark.parametrize("answer, words", EX1_MISTAKES)
@pytest.mark.mistake
def test_ws_cycle_names_each_mistake(answer, words):
    r = ch01.check_ws_cycle(answer)
    assert r.status == "failed" and r.answer, r
    assert all(part in r.hint for part in words.split("|")), r
    assert "simulator holds" not in r.message


def _no_padding(w, act, psum, a, s):
    """Feeds a's K columns only: the array's padded rows get nothing (a shape error)."""
    x = np.array([a[s - r, r] if 0 <= s - r < a.shape[0] else 0 for r in range(a.shape[1])])
    act = np.hstack([x[:, None], act[:, :-1]])
    return act, np.vstack([np.zeros_like(psum[:1]), psum[:-1]]) + act * w


_calls = []


def _counter(w, act, psum, a, s):
    _calls.append(s)
    return cycle(w, act, psum, a, len(_calls) - 1)


@pytest.mark.parametrize("answer, field, words", [
    (lambda w, act, psum, a, s: None, "message", "None"),
    (lambda w, act, psum, a, s: act, "message", "not two registers"),
    (lambda w, act, psum, a, s: cycle(w, act, psum, a, s)[::-1], "message", "wrong order"),
    (lambda w, act, psum, a, s: tuple(x.T for x in cycle(w, act, psum, a, s)), "hint",
     "transposed"),
    (_no_padding, "hint", "rows k >= K"),
    (_counter, "message", "out of order"),
    (lambda w, act, psum, a, s: 1 / 0, "message", "ZeroDivisionError"),
])
def test_ws_cycle_names_what_came_back(answer, field, words):
    _calls.clear()
    r = ch01.check_ws_cycle(answer)
    assert r.status == "failed" and words in getattr(r, field), r


@pytest.mark.parametrize("course", [
    answers.ws_cycle,
    lambda w, act, psum, a, s: answers.ws_cycle(w, act, psum, a, s),
    lambda w, act, psum, a, s: tuple(np.nan_to_num(getattr(systolic.simulate(
        a, w[:a.shape[1]], *w.shape, trace=True).trace[w.shape[0] + s], f))
        for f in ("horizontal", "vertical")),
])
@pytest.mark.mistake
def test_ws_cycle_refuses_the_course_step_and_the_simulator(course):
    r = ch01.check_ws_cycle(course)
    assert not r and "course's own function" in r.message


@pytest.mark.mistake
def test_ws_cycle_fixed_to_the_notebooks_array_fails_unseen_arrays():
    def four_rows(w, act, psum, a, s):  # loops over 4 rows whatever the array
        x = np.zeros(4, act.dtype)
        for r in range(min(4, a.shape[1])):
            if 0 <= s - r < a.shape[0]:
                x[r] = a[s - r, r]
        act = np.hstack([x[:, None], act[:, :-1]])
        return act, np.vstack([np.zeros((1, act.shape[1]), act.dtype), psum[:-1]]) + act * w

    assert ch01.check_ws_cycle(four_rows)
    graded = ch01.LAB.grade({"ws_cycle": four_rows}, seed=SEED)[0]
    assert not graded and "does not show" in graded.message


# -- Exercise 2 -------------------------------------------------------------------------

def tiled(a, b, rows, cols, sim, transpose_first=False, accumulate=True, result=True):
    """The chapter's loop (n outer, k inner), with switches for the classic mistakes."""
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


def tiled_k_outer_padded(a, b, rows, cols, sim):
    """Honest, not the course's: K outer, zero-padded full tiles, float output, sliced."""
    m, k = a.shape
    n = b.shape[1]
    kp, np_ = -(-k // rows) * rows, -(-n // cols) * cols
    ap = np.zeros((m, kp))
    ap[:, :k] = a
    bp = np.zeros((kp, np_))
    bp[:k, :n] = b
    out = np.zeros((m, np_))
    for k0 in range(0, kp, rows):
        for n0 in range(0, np_, cols):
            out[:, n0:n0 + cols] += sim(ap[:, k0:k0 + rows], bp[k0:k0 + rows, n0:n0 + cols],
                                        rows=rows, cols=cols).result
    return out[:, :n]


def tiled_m_blocks(a, b, rows, cols, sim):
    """Honest, not the course's: M cut into chunks too, partial products summed per block."""
    m, k = a.shape
    n = b.shape[1]
    rows_out = []
    for i0 in range(0, m, 5):
        blocks = []
        for n0 in range(0, n, cols):
            parts = [sim(a[i0:i0 + 5, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols], rows,
                         cols).result for k0 in range(0, k, rows)]
            blocks.append(sum(parts))
        rows_out.append(np.hstack(blocks))
    return np.vstack(rows_out)


@pytest.mark.parametrize("honest", [tiled, tiled_k_outer_padded, tiled_m_blocks])
def test_tiled_matmul_accepts_honest_answers_also_on_unseen_arrays(honest):
    assert ch01.check_tiled_matmul(honest)
    assert ch01.check_tiled_matmul(honest, rows=3, cols=5, shape=(7, 11, 12))
    assert ch01.check_tiled_matmul(honest, rows=4, cols=4, shape=(4, 8, 8))
    graded = ch01.LAB.exercises[1].grade_hidden({"tiled_matmul": honest}, SEED)
    assert graded, graded


def test_tiled_matmul_defaults_to_a_non_square_array_and_hides_non_square_ones():
    ex = ch01.LAB.exercises[1]
    defaults = ex.check.__defaults__
    assert defaults[0] != defaults[1]  # rows != cols in the notebook's check
    for what, kw in ex.hidden(np.random.default_rng(SEED)):
        assert kw["rows"] != kw["cols"] and "non-square" in what
        assert "=" not in what  # the kind of input, not an answer


def _one_tile_then_matmul(a, b, r, c, sim):
    sim(a[:, :r], b[:r, :c], r, c)
    return a @ b


def _every_tile_then_matmul(a, b, r, c, sim):
    tiled(a, b, r, c, sim)
    return a @ b


def _tiles_cut_cols_by_rows(a, b, rows, cols, sim):
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.int64)
    for n0 in range(0, b.shape[1], rows):
        for k0 in range(0, k, cols):
            out[:, n0:n0 + rows] += sim(a[:, k0:k0 + cols], b[k0:k0 + cols, n0:n0 + rows],
                                        rows, cols).result
    return out


def _misaligned_a(a, b, rows, cols, sim):
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.int64)
    for n0 in range(0, b.shape[1], cols):
        for k0 in range(0, k, rows):
            x = a[:, max(0, k0 - 1):max(0, k0 - 1) + min(rows, k - k0)]
            out[:, n0:n0 + cols] += sim(x, b[k0:k0 + rows, n0:n0 + cols], rows, cols).result
    return out


def _last_tile_skipped(a, b, rows, cols, sim):
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.int64)
    for n0 in range(0, b.shape[1], cols):
        for k0 in range(0, k - rows, rows):
            out[:, n0:n0 + cols] += sim(a[:, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols],
                                        rows, cols).result
    return out


def _overlapping_steps(a, b, rows, cols, sim):
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), np.int64)
    for n0 in range(0, b.shape[1], cols):
        for k0 in range(0, k, rows - 1):
            out[:, n0:n0 + cols] += sim(a[:, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols],
                                        rows, cols).result
    return out


def _result_in_wrong_columns(a, b, rows, cols, sim):
    out = tiled(a, b, rows, cols, sim)
    return np.roll(out, 1, axis=1)


def _asserts_against_matmul(a, b, r, c, sim):
    out = tiled(a, b, r, c, sim)
    assert np.array_equal(out, a @ b)
    return out


def _off_by_one_entry(a, b, r, c, sim):
    out = tiled(a, b, r, c, sim)
    out[0, 0] += 1
    return out


EX1_MISTAKES = [
    # (answer, where the words are, the words that name the mistake)
    (_one_tile_then_matmul, "message", "not every product went through sim"),
    (_every_tile_then_matmul, "message", "does not come from sim's runs"),
    (_asserts_against_matmul, "message", "results marked"),
    (_tiles_cut_cols_by_rows, "hint", "you cut tiles of cols x rows"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, lambda x, w, rr, cc: sim(x, w, cc, rr)),
     "message", "called with rows=3, cols=4"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, lambda x, w, rr, cc: sim(x, w)),
     "message", "called with rows=4, cols=4"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, lambda x, w, rr, cc: sim(x, w, rr, cc, "os")),
     "hint", "weight-stationary"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, sim, transpose_first=True), "message",
     "transposed"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, sim, accumulate=False), "message",
     "one K tile"),
    (lambda a, b, r, c, sim: a @ b, "message", "never called sim"),
    (lambda a, b, r, c, sim: systolic.simulate(a, b, r, c).result, "hint",
     "systolic's own functions do the tiling"),
    (lambda a, b, r, c, sim: sim(a, b, r, c).result, "message", "does not fit"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, lambda x, w, rr, cc: sim(w, x, rr, cc)),
     "message", "wrong order"),
    (_misaligned_a, "message", "does not line up"),
    (_last_tile_skipped, "message", "sim never multiplied part"),
    (_overlapping_steps, "message", "more than once"),
    (_result_in_wrong_columns, "message", "entries differ"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, sim, result=False), "hint", ".result"),
    (lambda a, b, r, c, sim: sim(a[:, :r], b[:r, :c], r, c), "message", "SystolicRun"),
    (lambda a, b, r, c, sim: None, "message", "None"),
    (lambda a, b, r, c, sim: [sim(a[:, :r], b[:r, :c], r, c)] * 2, "message",
     "not an array of numbers"),
    (lambda a, b, r, c, sim: tiled(a, b, r, c, sim).T, "hint", "transposed result"),
    (lambda a, b, r, c, sim: 1 / 0, "message", "ZeroDivisionError"),
]


@pytest.mark.parametrize("answer, field, words", EX1_MISTAKES)
@pytest.mark.mistake
def test_tiled_matmul_names_each_mistake(answer, field, words):
    r = ch01.check_tiled_matmul(answer)
    assert r.status == "failed", r
    assert words in getattr(r, field), r


def test_tiled_matmul_reveals_the_entry_and_the_tiling_after_an_attempt(capsys):
    r = ch01.check_tiled_matmul(_off_by_one_entry)
    assert not r and "[0,0]" in r.message and "(a @ b)[0, 0] = " in r.answer
    assert "a @ b[" not in r.answer
    assert "(a @ b)[0, 0]" in checks.reveal("Exercise 2")
    r = ch01.check_tiled_matmul(_one_tile_then_matmul)
    assert "tiles of b" in r.answer and "tiles of b" in checks.reveal("exercise 2")
    assert ch01.check_tiled_matmul(NotWritten("Exercise 2")).status == "not written"
    assert "after an attempt" in checks.reveal("Exercise 2")


@pytest.mark.mistake
def test_tiled_matmul_for_a_fixed_square_array_fails_the_unseen_arrays():
    def fixed_four(a, b, rows, cols, sim):
        return tiled(a, b, 4, 3, lambda x, w, r, c: sim(x, w, rows, cols))

    assert ch01.check_tiled_matmul(fixed_four)  # right on the notebook's 4x3 array only
    graded = ch01.LAB.grade({"tiled_matmul": fixed_four}, seed=SEED)[1]
    assert not graded and "does not show (a " in graded.message and "non-square" in graded.message
    assert not graded.answer


# -- Exercise 3 -------------------------------------------------------------------------

def truth():
    m, k, n = ch01.GEMM
    return {s: (systolic.cycle_count(m, k, n, s, s), systolic.utilization(m, k, n, s, s))
            for s in (128, 256)}


def test_gemm_prediction_accepts_the_right_numbers_and_rounding():
    t = truth()
    assert ch01.check_gemm_prediction(t[128], t[256], "256x256")
    rounded = [(round(c, -2), round(u, 2)) for c, u in (t[128], t[256])]
    assert ch01.check_gemm_prediction(*rounded, 256)


@pytest.mark.mistake
def test_gemm_prediction_names_mistakes_and_sets_the_answer():
    t = truth()
    m, k, n = ch01.GEMM
    ss = systolic.cycle_count(m, k, n, 128, 128, "ws", "scalesim")
    r = ch01.check_gemm_prediction((ss, t[128][1]), t[256], "256x256")
    assert not r and "SCALE-Sim" in r.hint and r.answer and str(t[128][0]) not in r.message
    every_load = 3 * (m + 2 * 128 + 128 - 2) * 5
    r = ch01.check_gemm_prediction((every_load / 3 * 15 / 5, t[128][1]), t[256], "256")
    assert not r and r.answer
    r = ch01.check_gemm_prediction(t[128], (t[256][0], 100 * t[256][1]), "256x256")
    assert not r and "percentage" in r.message and r.answer
    r = ch01.check_gemm_prediction(t[128], t[256], "128x128")
    assert not r and "does not finish first" in r.message and r.answer
    pad = m * 512 * 768 / (256 * 256 * t[256][0])  # K and N padded to multiples of 256
    r = ch01.check_gemm_prediction(t[128], (t[256][0], pad), "256x256")
    assert not r and "padded" in r.hint and r.answer


@pytest.mark.mistake
def test_gemm_prediction_rejects_garbage_without_raising():
    t = truth()
    for bad in (t[128][0], "3382", None, np.zeros(3), ("3382", 0.9)):
        r = ch01.check_gemm_prediction(bad, t[256], "256x256")
        assert not r and r.status == "failed"
    r = ch01.check_gemm_prediction(t[128], t[256], "both")
    assert not r and "one array" in r.message
    assert ch01.check_gemm_prediction(NotWritten("Ex"), t[256], "256").status == "not written"


def test_reveal_of_a_prediction_waits_for_a_compared_attempt(capsys):
    t = truth()
    ch01.check_gemm_prediction(NotWritten("Ex"), t[256], "256")
    assert "after an attempt" in checks.reveal("Exercise 3")
    ch01.check_gemm_prediction("3382", t[256], "256")
    assert "could not be compared" in checks.reveal("exercise 3")
    ch01.check_gemm_prediction((1, 0.5), t[256], "256")
    assert f"{t[128][0]:,} cycles" in checks.reveal("Exercise 3")
    ch01.check_stall(NotWritten("Ex"))
    assert "after an attempt" in checks.reveal("Exercise 6")
    ch01.check_stall(64.0)
    assert "stops at 32" in checks.reveal("Exercise 6")


def test_a_prediction_is_graded_as_recorded_before_the_simulation_shows(capsys):
    t = truth()
    lab = ch01.LAB
    assert not lab.predicted("Exercise 3")  # unsolved lab: nothing shown
    assert "once your prediction is recorded" in capsys.readouterr().out
    lab.predict("Exercise 3", (1000, 0.5), t[256], "256x256")
    assert lab.predicted("Exercise 3")  # the simulation is shown: locked
    r = ch01.check_gemm_prediction(t[128], t[256], "256x256")  # edited after seeing it
    assert not r and "recorded before the measurement" in r.message
    lab.predict("Exercise 6", 32.0)
    assert lab.predicted("Exercise 6") and ch01.check_stall(32.0)


# -- Exercise 4 -------------------------------------------------------------------------

def batch_closed_form(K, N, rows, cols):
    """Honest, not the course's: scan M < R, then solve the M >= R regime in closed form."""
    kt, nt = -(-K // rows), -(-N // cols)
    if K * N < 0.9 * (kt * rows) * (nt * cols):
        return None
    F, useful, cells = kt * nt, K * N, rows * cols

    def busy(M):
        total = rows + (F - 1) * max(M, rows) + M + rows + cols - 2
        return M * useful >= 0.9 * cells * total

    for M in range(1, rows):
        if busy(M):
            return M
    # M >= R: cycles = F*M + 2R + C - 2, so M * (KN - 0.9 RC F) >= 0.9 RC (2R + C - 2)
    slope = useful - 0.9 * cells * F
    if slope <= 0:
        return None
    M = max(rows, math.ceil(0.9 * cells * (2 * rows + cols - 2) / slope) - 2)
    while not busy(M):
        M += 1
    while M > rows and busy(M - 1):
        M -= 1
    return M


def batch_linear_scan(K, N, R, C):
    """Honest, not the course's: walk M up in big steps, then back one at a time."""
    Kp, Np = math.ceil(K / R) * R, math.ceil(N / C) * C
    if K * N / (Kp * Np) < 0.9:
        return None
    F = (Kp // R) * (Np // C)

    def u(M):
        return M * K * N / (R * C * (R + (F - 1) * max(M, R) + M + R + C - 2))

    M = 1
    while u(M) < 0.9:
        M += 256
    while M > 1 and u(M - 1) >= 0.9:
        M -= 1
    return M


@pytest.mark.parametrize("honest", [batch_closed_form, batch_linear_scan])
def test_smallest_batch_accepts_honest_answers_also_on_unseen_layers(honest):
    for case in ch01.BATCH_CASES:
        assert honest(*case) == answers.smallest_batch(*case), case
    assert ch01.check_smallest_batch(honest)
    graded = ch01.LAB.exercises[3].grade_hidden({"smallest_batch": honest}, SEED)
    assert graded, graded


def test_smallest_batch_reference_is_the_simulators_threshold():
    m = answers.smallest_batch(1024, 1024, 128, 128)
    rng = np.random.default_rng(0)
    b = rng.integers(-1, 2, (1024, 1024))
    assert systolic.simulate(rng.integers(-1, 2, (m, 1024)), b, 128, 128).utilization >= 0.9
    assert systolic.simulate(rng.integers(-1, 2, (m - 1, 1024)), b, 128, 128).utilization < 0.9
    assert answers.smallest_batch(100, 1024, 128, 128) is None


def _scalesim_batch(K, N, R, C):
    m = 1
    while systolic.utilization(m, K, N, R, C, "ws", "scalesim") < 0.9:
        m += 1
    return m


def _batch_util(K, N, R, C, timing="tpu", padded=False):
    kp, np_ = math.ceil(K / R) * R, math.ceil(N / C) * C
    if K * N / (kp * np_) < 0.9:
        return None
    F = (kp // R) * (np_ // C)
    work = kp * np_ if padded else K * N
    M = 1
    while True:
        if timing == "tpu":
            cyc = R + (F - 1) * max(M, R) + M + R + C - 2
        else:
            cyc = F * (R + M + R + C - 2) - 1
        if M * work / (R * C * cyc) >= 0.9:
            return M
        M += 1


def _ref_plus_one(K, N, R, C):
    m = batch_closed_form(K, N, R, C)
    return m + 1 if m else None


EX3_MISTAKES = [
    (lambda K, N, R, C: R, "hint", "fill and drain"),
    (_ref_plus_one, "hint", "off by one"),
    (lambda K, N, R, C: batch_closed_form(K, N, R, C) or 5000, "message", "no batch"),
    (lambda K, N, R, C: None, "message", "some batch does reach"),
    (lambda K, N, R, C: batch_closed_form(K, N, C, R), "hint", "swapped rows and cols"),
    (lambda K, N, R, C: _batch_util(K, N, R, C, timing="scalesim"), "hint", "SCALE-Sim"),
    (lambda K, N, R, C: _batch_util(K, N, R, C, padded=True) if batch_closed_form(K, N, R, C)
     else None, "hint", "padding's MACs"),
    (lambda K, N, R, C: "123", "message", "string"),
    (lambda K, N, R, C: 1 / 0, "message", "ZeroDivisionError"),
]


@pytest.mark.parametrize("answer, field, words", EX3_MISTAKES)
@pytest.mark.mistake
def test_smallest_batch_names_each_mistake(answer, field, words):
    r = ch01.check_smallest_batch(answer)
    assert r.status == "failed", r
    assert words in getattr(r, field), r


@pytest.mark.parametrize("course", [
    answers.smallest_batch,
    lambda K, N, R, C: answers.smallest_batch(K, N, R, C),
    _scalesim_batch,
    lambda K, N, R, C: next(m for m in range(1, 1 << 20)
                            if systolic.utilization(m, K, N, R, C) >= 0.9),
    lambda K, N, R, C: next(m for m in range(1, 1 << 20)
                            if m * K * N >= 0.9 * R * C * systolic.cycle_count(m, K, N, R, C)),
])
@pytest.mark.mistake
def test_smallest_batch_refuses_the_course_functions(course):
    r = ch01.check_smallest_batch(course)
    assert not r and "course's own function" in r.message and "write this yourself" in r.hint


def test_smallest_batch_stops_an_endless_loop():
    def forever(K, N, R, C):
        while True:
            pass
    r = ch01.check_smallest_batch(forever, cases=((100, 1024, 128, 128),), time_limit_s=0.5)
    assert not r and "more than" in r.message


# -- Exercise 5 -------------------------------------------------------------------------

def best(M, K, N, R, C):
    """Honest, not the course's: each dataflow as (rows dim, cols dim, streamed, drain)."""
    table = {"ws": (K, N, M, 0), "is": (K, M, N, 0), "os": (M, N, K, R)}
    cost = {}
    for name, (down, across, t, drain) in table.items():
        folds = -(-down // R) * -(-across // C)
        load = 0 if name == "os" else R
        cost[name] = load + (folds - 1) * max(t, R) + t + R + C - 2 + drain
    return min(sorted(cost), key=cost.get)


def best_words(M, K, N, R, C):
    return {"ws": "weight-stationary", "is": "Input stationary", "os": "os"}[best(M, K, N, R, C)]


@pytest.mark.parametrize("honest", [best, best_words])
def test_best_dataflow_accepts_honest_answers_also_on_unseen_shapes(honest):
    assert ch01.check_best_dataflow(honest)
    graded = ch01.LAB.exercises[4].grade_hidden({"best_dataflow": honest}, SEED)
    assert graded, graded


def test_best_dataflow_cases_are_non_square_and_each_dataflow_wins():
    assert {best(*c) for c in ch01.DATAFLOW_CASES} == {"ws", "is", "os"}
    non_square = [c for c in ch01.DATAFLOW_CASES if c[3] != c[4]]
    assert {best(*c) for c in non_square} == {"ws", "is", "os"}
    for seed in range(5):
        for what, kw in ch01.LAB.exercises[4].hidden(np.random.default_rng(seed)):
            (*_, r, c), = kw["cases"]
            assert r != c and "non-square" in what


def _model(swap=(), timing="tpu", drain=True):
    def choose(M, K, N, R, C):
        table = {"ws": (K, N, M), "is": (K, M, N), "os": (M, N, K)}
        cost = {}
        for name, (down, across, t) in table.items():
            if name in swap:
                down, across = across, down
            folds = math.ceil(down / R) * math.ceil(across / C)
            load = 0 if name == "os" else R
            if timing == "scalesim":
                cost[name] = folds * (load + t + R + C - 2) - 1
            else:
                cost[name] = (load + (folds - 1) * max(t, R) + t + R + C - 2
                              + (R if name == "os" and drain else 0))
        return min(cost, key=cost.get)
    return choose


EX4_MISTAKES = [
    (_model(swap=("is",)), "input-stationary keeps a transposed"),
    (_model(swap=("ws",)), "weight-stationary keeps b as it is"),
    (_model(swap=("os",)), "output-stationary keeps c"),
    (_model(swap=("ws", "is", "os")), "held dimensions are on the wrong sides"),
    (lambda M, K, N, R, C: best(M, K, N, C, R), "rows and cols are swapped"),
    (_model(timing="scalesim"), "SCALE-Sim"),
    (_model(drain=False), "shift the results out"),
    (lambda *a: "ws", "which of M, K, N"),
    (lambda *a: "is", "which of M, K, N"),
    (lambda *a: "os", "which of M, K, N"),
]


@pytest.mark.parametrize("answer, words", EX4_MISTAKES)
@pytest.mark.mistake
def test_best_dataflow_names_each_mistake(answer, words):
    r = ch01.check_best_dataflow(answer)
    assert not r and r.answer and words in r.hint, r


@pytest.mark.mistake
def test_best_dataflow_with_m_on_the_wrong_side_fails_unseen_shapes_too():
    wrong = _model(swap=("is",))
    for seed in range(3):
        cases = ch01.LAB.exercises[4].hidden(np.random.default_rng([seed, 4]))
        assert any(not ch01.check_best_dataflow(wrong, **kw) for _, kw in cases)


@pytest.mark.parametrize("course", [
    lambda M, K, N, R, C: min(systolic.DATAFLOWS,
                              key=lambda d: systolic.cycle_count(M, K, N, R, C, d)),
    lambda M, K, N, R, C: max(systolic.DATAFLOWS,
                              key=lambda d: systolic.utilization(M, K, N, R, C, d)),
    lambda M, K, N, R, C: min(systolic.DATAFLOWS, key=lambda d: systolic.simulate(
        np.ones((M, K)), np.ones((K, N)), R, C, d).cycles),
    lambda M, K, N, R, C: answers.best_dataflows(M, K, N, R, C)[0],
    lambda M, K, N, R, C: min(systolic.DATAFLOWS,
                              key=lambda d: systolic.fold_count(M, K, N, R, C, d)),
    functools.partial(systolic.cycle_count, timing="tpu"),
])
@pytest.mark.mistake
def test_best_dataflow_refuses_running_systolic(course):
    r = ch01.check_best_dataflow(course)
    assert not r and "course's own function" in r.message


@pytest.mark.mistake
def test_best_dataflow_rejects_garbage():
    r = ch01.check_best_dataflow(lambda *a: 3)
    assert not r and "not a dataflow" in r.message
    assert ch01.check_best_dataflow(NotWritten("Exercise 5")).status == "not written"


# -- Exercise 6 -------------------------------------------------------------------------

def test_stall_accepts_the_value_and_names_mistakes():
    assert ch01.check_stall(32.0) and ch01.check_stall(32) and ch01.check_stall(np.float32(32))
    r = ch01.check_stall(16.0)
    assert not r and "rounds UP" in r.hint and "32" not in r.message and r.answer
    r = ch01.check_stall(64.0)
    assert not r and "half of it" in r.hint and r.answer
    r = ch01.check_stall(256.0)
    assert not r and "2^(e-7)" in r.hint and r.answer
    assert "string" in ch01.check_stall("32").message
    assert not ch01.check_stall(np.array([32.0, 1.0]))


# -- the whole lab ----------------------------------------------------------------------

def honest_namespace():
    t = truth()
    return {"ws_cycle": cycle_loops, "tiled_matmul": tiled_k_outer_padded, "predicted_128": t[128],
            "predicted_256": t[256], "finishes_first": "256x256",
            "smallest_batch": batch_closed_form, "best_dataflow": best, "predicted_stall": 32.0}


def test_scorecard_of_an_empty_namespace_is_zero_and_of_honest_answers_full():
    assert ch01.LAB.scorecard({}).total() == "Lab 1: 0 of 6 passed"
    assert ch01.LAB.scorecard(honest_namespace()).total() == "Lab 1: 6 of 6 passed"
    graded = ch01.LAB.grade(honest_namespace(), seed=SEED)
    assert all(graded), graded
    assert "unseen" in graded[0].message and "unseen" in graded[1].message


def test_the_course_answers_score_nothing_where_they_are_the_answer():
    ns = honest_namespace() | {"ws_cycle": answers.ws_cycle,
                               "smallest_batch": answers.smallest_batch,
                               "best_dataflow": lambda *a: answers.best_dataflows(*a)[0]}
    statuses = [r.status for r in ch01.LAB.grade(ns)]
    assert statuses == ["failed", "passed", "passed", "failed", "failed", "passed"]

"""Lab 1's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import bisect
import math

import numpy as np

from grading import Key
from tpu_course import systolic
from tpu_course.checks.ch01 import GEMM, _cycle_case, _tiled_case
from tpu_course.checks.engine import Case, Mistake

ARRAYS = ((128, 256), (256, 128), (64, 128), (128, 64))  #: Exercises 4 and 5's hidden arrays

def _key(make, hidden, table) -> Key:  # make() is right, make(**kw) the mistake hint names
    return Key(make(), hidden, [Mistake(hint, make(**kw)) for hint, kw in table])

def _non_square(rng, low=2, high=6):
    rows = int(rng.integers(low, high + 1))
    return rows, int(rng.choice([c for c in range(low, high + 1) if c != rows]))

# -- Exercise 1 -------------------------------------------------------------------------------
def make_cycle(skew="k", late=0, edge="zero", move="right", psum="down", swap=False):
    """A ``ws_cycle``: right with the defaults, each other choice a known mistake."""
    def ws_cycle(w, act, p, a, s):
        (m, k), rows = a.shape, w.shape[0]
        x = np.zeros(rows, act.dtype)
        for r in range(min(rows, k)):
            i = s - late - {"k": r, "none": 0, "reversed": rows - 1 - r}[skew]
            if edge == "clip" or (-m if edge == "wrap" else 0) <= i < m:
                x[r] = a[min(max(i, 0), m - 1) if edge == "clip" else i, r]
        new = {"right": lambda: np.hstack([x[:, None], act[:, :-1]]),
               "left": lambda: np.hstack([act[:, 1:], x[:, None]]),
               "all": lambda: np.repeat(x[:, None], act.shape[1], axis=1),
               "stays": lambda: np.hstack([x[:, None], act[:, 1:]])}[move]()
        zero = np.zeros_like(p[:1])
        out = {"stays": lambda: p, "fresh": lambda: 0, "up": lambda: np.vstack([p[1:], zero]),
               "wraps": lambda: np.roll(p, 1, 0)}.get(psum, lambda: np.vstack([zero, p[:-1]]))()
        out = out + (act if psum == "old" else new) * w
        return (out, new) if swap else (new, out)
    return ws_cycle

def _ex1_hidden(rng):
    i = lambda lo, hi=None: int(rng.integers(lo, hi))
    (r, c), cases = sorted(_non_square(rng, 2, 5), reverse=True), []
    cases.append(_cycle_case(r, c, i(r, r + 4), r, c, i(1 << 30), "a tall array"))
    r, c = sorted(_non_square(rng))
    cases.append(_cycle_case(r, c, i(2, 7), max(1, r - 1), c - 1, i(1 << 30),
                             "a wide array holding a smaller tile of b"))
    s = i(3, 6)
    cases.append(_cycle_case(s, s, i(1, s), s, s, i(1 << 30), "a batch shorter than the array"))
    r, c = _non_square(rng, 2, 5)
    return cases + [_cycle_case(r, c, i(2, 6), r, c, i(1 << 30), "a non-square array", random=True)]

EX1 = _key(make_cycle, _ex1_hidden, [  # (hint, make_cycle's arguments)
    ("no skew: row k starts k cycles late, to meet the sum from the row above", {"skew": "none"}),
    ("the skew runs the wrong way: row 0 starts first, row k k cycles later", {"skew": "reversed"}),
    ("your activations enter one cycle late: at s = 0, a[0, 0] is in cell (0, 0)", {"late": 1}),
    ("off by one cycle: your activations enter one cycle early", {"late": -1}),
    ("the edge feeds 0 while s - k < 0: a negative index wraps to the end of a", {"edge": "wrap"}),
    ("outside 0 <= s - k < M the edge feeds 0, not a's first or last row again", {"edge": "clip"}),
    ("activations enter at column 0 and move one column right a cycle, not left", {"move": "left"}),
    ("an activation moves one column per cycle, not to every column at once", {"move": "all"}),
    ("the activations do not move: column j takes what column j - 1 held", {"move": "stays"}),
    ("a cell adds its product to the sum the cell above held, not to its own", {"psum": "stays"}),
    ("a cell's new sum is the sum from the cell above plus its product", {"psum": "fresh"}),
    ("the partial sums move down one row per cycle (row 0 from 0), not up", {"psum": "up"}),
    ("the partial sums wrap around (np.roll?): row 0 starts from 0 every cycle", {"psum": "wraps"}),
    ("multiply the activation after it moved, not the one from before", {"psum": "old"}),
    ("your registers come back in the wrong order: return act, psum", {"swap": True})])

# -- Exercise 2 -------------------------------------------------------------------------------
def make_tiled(step_k=True, accumulate=True, remainder=True, from_runs=True, swap=False):
    def tiled_matmul(a, b, rows, cols, sim=systolic.simulate):
        (m, k), n = a.shape, b.shape[1]
        tk, tn = (cols, rows) if swap else (rows, cols)
        out = np.zeros((m, n), np.int64)
        for n0 in range(0, n if remainder else n - n % tn or n, tn):
            for k0 in range(0, k if remainder else k - k % tk or k, tk if step_k else 1):
                result = sim(a[:, k0:k0 + tk], b[k0:k0 + tk, n0:n0 + tn], rows, cols).result
                out[:, n0:n0 + tn] = result + (out[:, n0:n0 + tn] if accumulate else 0)
        return out if from_runs else a @ b
    return tiled_matmul

def _ex2_hidden(rng):
    cases = []
    for kind in ("wide", "tall", "exact"):  # K and N multiples of the array only when exact
        rows, cols = _non_square(rng)
        if kind != "exact":
            rows, cols = sorted((rows, cols), reverse=kind == "tall")
        m, (k, n) = int(rng.integers(1, 9)), (x * int(rng.integers(2, 4)) if kind == "exact" else
                                              x * int(rng.integers(1, 4)) + int(rng.integers(1, x))
                                              for x in (rows, cols))
        cases.append(_tiled_case(rows, cols, (m, k, n),
                                 int(rng.integers(1 << 20)), f"a {kind} non-square array"))
    return cases

EX2 = _key(make_tiled, _ex2_hidden, [  # (hint, make_tiled's arguments)
    ("the K tiles of one output block add up: out[...] += ..., not =", {"accumulate": False}),
    ("the partial tiles at the end of K and N still go through sim", {"remainder": False}),
    ("sim multiplied some products more than once: the K loop steps by rows", {"step_k": False}),
    ("assemble the output from each tile's run.result, not a @ b", {"from_runs": False}),
    ("the array's rows hold K and its columns N: cut b into rows x cols tiles", {"swap": True})])

# -- Exercise 3 -------------------------------------------------------------------------------
def _gemm(timing="tpu", padded=False, scale=1) -> tuple:
    (m, k, n), pad = GEMM, lambda x, s: math.ceil(x / s) * s if padded else x
    runs = {s: (systolic.cycle_count(m, k, n, s, s, "ws", timing),
                scale * systolic.utilization(m, pad(k, s), pad(n, s), s, s, "ws", timing))
            for s in (128, 256)}
    return (*runs.values(), min(runs, key=runs.get))

EX3 = _key(_gemm, None, [  # (hint, _gemm's arguments)
    ("that is SCALE-Sim's count, folds one after another; the MXU loads the next fold's weights "
     "while one streams, so folds are max(T, R) apart", {"timing": "scalesim"}),
    ("you counted the padded MACs as useful: only M*K*N are", {"padded": True}),
    ("give the utilisation as a fraction between 0 and 1, not a percentage", {"scale": 100})])

# -- Exercise 4 -------------------------------------------------------------------------------
def make_batch(timing="tpu", padded=False, swap=False, off=0, at_rows=False):
    """The smallest M with utilisation >= 0.9 (None if none); the defaults are right."""
    def smallest_batch(K, N, rows, cols):
        R, C = (cols, rows) if swap else (rows, cols)
        kp, np_ = math.ceil(K / R) * R, math.ceil(N / C) * C
        dims = (kp, np_) if padded else (K, N)
        util = lambda m: systolic.utilization(m, *dims, R, C, "ws", timing)
        if (not padded and K * N / (kp * np_) < 0.9) or util(1 << 34) < 0.9:
            return None
        m = 1 + bisect.bisect_left(range(1, 1 << 34), True, key=lambda m: util(m) >= 0.9)
        return rows if at_rows else m + off
    return smallest_batch

def _ex4_hidden(rng):
    i, cases = lambda lo, hi: int(rng.integers(lo, hi)), []
    for label, size in (  # (K, N) on an r x c array
            ("many folds", lambda r, c: (i(6, 20) * r - i(0, max(2, r // 32)), i(6, 20) * c)),
            ("one fold", lambda r, c: (r - i(0, r // 32 + 1), c - i(0, c // 32 + 1))),
            ("padding that wastes much", lambda r, c: (i(2, 6) * r + r // 4, i(2, 6) * c))):
        r, c = ARRAYS[i(0, len(ARRAYS))]
        K, N = size(r, c)
        cases.append(Case(f"a layer with {label}, K={K}, N={N} on a non-square {r}x{c} array",
                          {"K": K, "N": N, "rows": r, "cols": c}))
    return cases

EX4 = _key(make_batch, _ex4_hidden, [  # (hint, make_batch's arguments)
    ("the array's rows hold K, its columns N: you swapped rows and cols", {"swap": True}),
    ("not SCALE-Sim's serial folds: only the first load is exposed, folds are max(M, R) apart",
     {"timing": "scalesim"}),
    ("only M*K*N MACs are useful: the padded cells of the last tiles are idle", {"padded": True}),
    ("M = rows still leaves the fill, drain and first load: count them", {"at_rows": True}),
    ("off by one: the smallest M with utilisation >= 0.9", {"off": 1})])

# -- Exercise 5 -------------------------------------------------------------------------------
def make_dataflow(swap="", timing="tpu", drain=True, exchange=False):
    """Right with the defaults; ``swap`` a dataflow's stationary dims, ``exchange`` rows, cols."""
    def best_dataflow(M, K, N, rows, cols):
        def cycles(d):
            ext, (R, C) = {"M": M, "K": K, "N": N}, (cols, rows) if exchange else (rows, cols)
            if d == swap:
                x, y = {"ws": "KN", "is": "KM", "os": "MN"}[d]
                ext[x], ext[y] = ext[y], ext[x]
            return systolic.cycle_count(**ext, rows=R, cols=C, dataflow=d, timing=timing) - (
                R if d == "os" and not drain else 0)
        return min(("ws", "is", "os"), key=cycles)
    return best_dataflow

def _ex5_hidden(rng):
    """Three shapes with different clear winners, each missed by some known mistake."""
    cases, winners = [], set()
    while len(cases) < 3:
        (r, c), (m, k, n) = ARRAYS[int(rng.integers(4))], (int(v) for v in rng.integers(8, 2049, 3))
        counts = sorted(systolic.cycle_count(m, k, n, r, c, d) for d in systolic.DATAFLOWS)
        best = EX5.reference(m, k, n, r, c)
        if counts[0] < counts[1] and best not in winners and any(
                mistake.answer(m, k, n, r, c) != best for mistake in EX5.mistakes):
            cases.append(Case(f"M={m}, K={k}, N={n} on a non-square {r}x{c} array",
                              {"M": m, "K": k, "N": n, "rows": r, "cols": c}))
            winners.add(best)
    return cases

EX5 = _key(make_dataflow, _ex5_hidden, [  # (hint, make_dataflow's arguments)
    ("input-stationary holds K along the rows, M along the columns; N streams", {"swap": "is"}),
    ("weight-stationary holds K along the rows, N along the columns; M streams", {"swap": "ws"}),
    ("output-stationary holds M along the rows, N along the columns; K streams", {"swap": "os"}),
    ("rows is the height: the R in the load, max(T, R) and the drain", {"exchange": True}),
    ("not SCALE-Sim's serial folds: only the first load is exposed, folds are max(T, R) apart",
     {"timing": "scalesim"}),
    ("'os' needs R more cycles at the end to shift the results out", {"drain": False})])

# -- Exercise 6 -------------------------------------------------------------------------------
EX6 = Key(mistakes=[Mistake(*m) for m in [
    ("below the stall the term is more than half a gap: the sum rounds up and keeps moving", 16.0),
    ("check the gap at your value: is the term really more than half of it?", 64.0),
    ("that is where a sum of 0.1 stalls in float16 (10 significand bits), not bf16 (7)", 256.0)]])

KEYS = {f"Exercise {i}": key for i, key in enumerate((EX1, EX2, EX3, EX4, EX5, EX6), 1)}

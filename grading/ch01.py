"""Lab 1's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import math

import numpy as np

from grading import Key
from tpu_course import systolic
from tpu_course.checks.ch01 import GEMM, _cycle_case, _tiled_case
from tpu_course.checks.engine import Case, Mistake


def _non_square(rng: np.random.Generator, low: int = 2, high: int = 6) -> tuple[int, int]:
    rows = int(rng.integers(low, high + 1))
    return rows, int(rng.choice([c for c in range(low, high + 1) if c != rows]))


# -- Exercise 1 ----------------------------------------------------------------------------


def make_cycle(feed=lambda s, r, rows: s - r, move="right", psum="down", wrap=False, clip=False):
    """A ``ws_cycle`` that feeds the edge with ``feed(s, row)`` as index into a, moves the
    activations as ``move`` says and updates the partial sums as ``psum`` says: the right
    one by default, each other choice a known mistake."""

    def ws_cycle(w, act, psum_in, a, s):
        rows = w.shape[0]
        m, k = a.shape
        x = np.zeros(rows, act.dtype)
        for r in range(min(rows, k)):
            i = feed(s, r, rows)
            if clip:
                x[r] = a[min(max(i, 0), m - 1), r]
            elif (-m <= i < m) if wrap else (0 <= i < m):
                x[r] = a[i, r]
        new = {"right": lambda: np.hstack([x[:, None], act[:, :-1]]),
               "from the right": lambda: np.hstack([act[:, 1:], x[:, None]]),
               "broadcast": lambda: np.repeat(x[:, None], act.shape[1], axis=1),
               "stays": lambda: np.hstack([x[:, None], act[:, 1:]])}[move]()
        down = np.vstack([np.zeros_like(psum_in[:1]), psum_in[:-1]])
        out = {"down": lambda: down + new * w, "stays": lambda: psum_in + new * w,
               "fresh": lambda: new * w,
               "up": lambda: np.vstack([psum_in[1:], np.zeros_like(psum_in[:1])]) + new * w,
               "wraps": lambda: np.roll(psum_in, 1, axis=0) + new * w,
               "old activations": lambda: down + act * w}[psum]()
        return new, out

    return ws_cycle


def _ex1_hidden(rng):
    def seed():
        return int(rng.integers(1 << 30))

    rows, cols = sorted(_non_square(rng, 2, 5), reverse=True)
    tall = _cycle_case(rows, cols, int(rng.integers(rows, rows + 4)), rows, cols, seed(),
                       "a tall non-square array")
    rows, cols = sorted(_non_square(rng, 2, 6))
    wide = _cycle_case(rows, cols, int(rng.integers(2, 7)), max(1, rows - 1), cols - 1, seed(),
                       "a wide array holding a smaller tile of b")
    side = int(rng.integers(3, 6))
    short = _cycle_case(side, side, int(rng.integers(1, side)), side, side, seed(),
                        "a batch shorter than the array")
    rows, cols = _non_square(rng, 2, 5)
    anything = _cycle_case(rows, cols, int(rng.integers(2, 6)), rows, cols, seed(),
                           "a non-square array", random=True)
    return [tall, wide, short, anything]


def _swapped(w, act, psum, a, s):
    new_act, new_psum = make_cycle()(w, act, psum, a, s)
    return new_psum, new_act


EX1 = Key(
    reference=make_cycle(),
    hidden=_ex1_hidden,
    mistakes=[
        Mistake("no skew: every row got row s of a in the same cycle; row k starts k cycles "
                "late, so an activation meets the partial sum coming down from the row above",
                make_cycle(feed=lambda s, r, rows: s)),
        Mistake("the skew runs the wrong way: row 0 starts first and row k starts k cycles "
                "after it", make_cycle(feed=lambda s, r, rows: s - (rows - 1 - r))),
        Mistake("off by one cycle: your activations enter one cycle late (at stream cycle "
                "s = 0, a[0, 0] is already in cell (0, 0))", make_cycle(feed=lambda s, r, rows: s - r - 1)),
        Mistake("off by one cycle: your activations enter one cycle early",
                make_cycle(feed=lambda s, r, rows: s - r + 1)),
        Mistake("before a row's first activation its edge feeds 0: with s - k < 0, a[s - k] "
                "reads a row from the end of a (a negative index wraps around)",
                make_cycle(wrap=True)),
        Mistake("outside 0 <= s - k < M the edge feeds 0, not the first or last row of a again",
                make_cycle(clip=True)),
        Mistake("the activations enter at the right edge and move left: they enter at column "
                "0 and move one column right per cycle", make_cycle(move="from the right")),
        Mistake("every column got the edge's value in the same cycle: an activation moves one "
                "column per cycle", make_cycle(move="broadcast")),
        Mistake("the activations do not move: each cycle column j takes what column j - 1 held",
                make_cycle(move="stays")),
        Mistake("partial sums not passed down: each cell adds its product to the sum the cell "
                "above held in the previous cycle, not to its own", make_cycle(psum="stays")),
        Mistake("partial sums not passed down: a cell's new sum is the sum from the cell above "
                "plus its own product, not its product alone", make_cycle(psum="fresh")),
        Mistake("the partial sums move up: they move down one row per cycle, row 0 starting "
                "from 0", make_cycle(psum="up")),
        Mistake("the partial sums wrap around (np.roll?): row 0 starts from 0 every cycle",
                make_cycle(psum="wraps")),
        Mistake("the product used the activation from before it moved: move the activations "
                "first, then multiply what is in the cell now", make_cycle(psum="old activations")),
        Mistake("your registers come back in the wrong order: return act, psum", _swapped),
    ])


# -- Exercise 2 ----------------------------------------------------------------------------


def make_tiled(step_k=True, accumulate=True, remainder=True, from_runs=True):
    def tiled_matmul(a, b, rows, cols, sim=systolic.simulate):
        m, k = a.shape
        n = b.shape[1]
        out = np.zeros((m, n), np.int64)
        k_end = k if remainder else k - k % rows or k
        n_end = n if remainder else n - n % cols or n
        for n0 in range(0, n_end, cols):
            for k0 in range(0, k_end, rows if step_k else 1):
                run = sim(a[:, k0:k0 + rows], b[k0:k0 + rows, n0:n0 + cols], rows, cols)
                if accumulate:
                    out[:, n0:n0 + cols] += run.result
                else:
                    out[:, n0:n0 + cols] = run.result
        return out if from_runs else a @ b

    return tiled_matmul


def _ex2_hidden(rng):
    cases = []
    for kind in ("wide", "tall", "exact"):
        rows, cols = _non_square(rng)
        if kind != "exact" and (kind == "wide") == (rows > cols):
            rows, cols = cols, rows
        m = int(rng.integers(1, 9))
        if kind == "exact":
            k, n = rows * int(rng.integers(2, 4)), cols * int(rng.integers(2, 4))
        else:
            k = rows * int(rng.integers(1, 4)) + int(rng.integers(1, rows))
            n = cols * int(rng.integers(1, 4)) + int(rng.integers(1, cols))
        cases.append(_tiled_case(rows, cols, (m, k, n), int(rng.integers(1 << 20)),
                                 f"a {kind} non-square array"))
    return cases


def _swap_tiles(a, b, rows, cols, sim):
    """Tiles of b cut cols (not rows) along K and rows along N."""
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.int64)
    for n0 in range(0, n, rows):
        for k0 in range(0, k, cols):
            out[:, n0:n0 + rows] += sim(a[:, k0:k0 + cols], b[k0:k0 + cols, n0:n0 + rows],
                                        rows, cols).result
    return out


EX2 = Key(
    reference=make_tiled(),
    hidden=_ex2_hidden,
    mistakes=[
        Mistake("only one K tile's partial sums are in the result: the K tiles of one output "
                "block add up (out[...] += ..., not =)", make_tiled(accumulate=False)),
        Mistake("the last, partial tiles are missing: when K or N is not a multiple of the "
                "array, the remainder is a smaller tile that still goes through sim",
                make_tiled(remainder=False)),
        Mistake("sim multiplied some products more than once: the K loop steps by rows",
                make_tiled(step_k=False)),
        Mistake("your result does not come from sim's runs (a @ b at the end?): assemble the "
                "output from each tile's run.result", make_tiled(from_runs=False)),
        Mistake("the array's rows hold K and its columns N: cut b into rows x cols tiles, "
                "not cols x rows", _swap_tiles),
    ])


# -- Exercise 3 ----------------------------------------------------------------------------


def _gemm(count) -> tuple:
    m, k, n = GEMM
    pairs = []
    for side in (128, 256):
        cycles = count(m, k, n, side)
        pairs.append((cycles, m * k * n / (side * side * cycles)))
    return (*pairs, 128 if pairs[0][0] < pairs[1][0] else 256)


def _tpu(m, k, n, side):
    folds = math.ceil(k / side) * math.ceil(n / side)
    return side + (folds - 1) * max(m, side) + m + side + side - 2


def _padded(count):
    m, k, n = GEMM
    pairs = []
    for side in (128, 256):
        cycles = count(m, k, n, side)
        kp, np_ = math.ceil(k / side) * side, math.ceil(n / side) * side
        pairs.append((cycles, m * kp * np_ / (side * side * cycles)))
    return (*pairs, 256)


EX3 = Key(
    reference=_gemm(_tpu),
    mistakes=[
        Mistake("you let every fold load its weights and drain before the next starts "
                "(SCALE-Sim's count); the MXU loads the next fold's weights while the current "
                "one streams, so folds follow each other max(T, R) apart",
                _gemm(lambda m, k, n, s: systolic.cycle_count(m, k, n, s, s, "ws", "scalesim"))),
        Mistake("you counted the padded MACs as useful: only M*K*N are", _padded(_tpu)),
        Mistake("your utilisation looks like a percentage: give it as a fraction between 0 "
                "and 1", tuple((c, 100 * u) for c, u in _gemm(_tpu)[:2]) + (256,)),
    ])


# -- Exercise 4 ----------------------------------------------------------------------------


def make_batch(timing="tpu", padded_useful=False, swap=False, target=0.9):
    def smallest_batch(K, N, rows, cols):
        if swap:
            rows, cols = cols, rows
        kp, np_ = math.ceil(K / rows) * rows, math.ceil(N / cols) * cols
        useful = kp * np_ if padded_useful else K * N
        if useful / (kp * np_) < target:
            return None

        def util(m):
            if timing == "scalesim":
                return systolic.utilization(m, K, N, rows, cols, "ws", "scalesim")
            folds = (kp // rows) * (np_ // cols)
            return m * useful / (rows * cols * (rows + (folds - 1) * max(m, rows) + m
                                                + rows + cols - 2))

        hi = 1
        while util(hi) < target:
            hi *= 2
            if hi > 1 << 34:
                return None
        lo = hi // 2 + 1 if hi > 1 else 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if util(mid) >= target else (mid + 1, hi)
        return lo

    return smallest_batch


def _ex4_hidden(rng):
    arrays = ((128, 256), (256, 128), (64, 128), (128, 64))
    cases = []
    r, c = arrays[int(rng.integers(len(arrays)))]
    K, N = int(rng.integers(6, 20)) * r - int(rng.integers(0, max(2, r // 32))), int(rng.integers(6, 20)) * c
    cases.append(("a layer with many folds", K, N, r, c))
    r, c = arrays[int(rng.integers(len(arrays)))]
    K, N = r - int(rng.integers(0, r // 32 + 1)), c - int(rng.integers(0, c // 32 + 1))
    cases.append(("a one-fold layer", K, N, r, c))
    r, c = arrays[int(rng.integers(len(arrays)))]
    K, N = int(rng.integers(2, 6)) * r + r // 4, int(rng.integers(2, 6)) * c
    cases.append(("a layer whose padding wastes much", K, N, r, c))
    return [Case(f"{label}, K={K}, N={N} on a non-square {r}x{c} array",
                 {"K": K, "N": N, "rows": r, "cols": c}) for label, K, N, r, c in cases]


def _plus_one(K, N, rows, cols):
    got = make_batch()(K, N, rows, cols)
    return None if got is None else got + 1


EX4 = Key(
    reference=make_batch(),
    hidden=_ex4_hidden,
    mistakes=[
        Mistake("you swapped rows and cols: the array's rows hold K (and the weight load takes "
                "R cycles, folds are max(M, R) apart), its columns hold N", make_batch(swap=True)),
        Mistake("that is the batch with SCALE-Sim's serial folds; with timing='tpu' only the "
                "first weight load is exposed and folds follow each other max(M, R) apart",
                make_batch(timing="scalesim")),
        Mistake("you counted the padding's MACs as useful: only M*K*N are; the padded rows "
                "and columns of the last tiles are idle cells", make_batch(padded_useful=True)),
        Mistake("M = rows hides each fold's weight load, but the pipeline's fill and drain "
                "(R + C - 2 cycles) and the first load still cost: count them",
                lambda K, N, rows, cols: rows if make_batch()(K, N, rows, cols) else None),
        Mistake("off by one: the smallest M with utilisation >= 0.9", _plus_one),
    ])


# -- Exercise 5 ----------------------------------------------------------------------------

_LAYOUT = {"ws": ("K", "N", "M"), "is": ("K", "M", "N"), "os": ("M", "N", "K")}


def make_dataflow(swap=(), timing="tpu", drain=True, exchange=False):
    def best_dataflow(M, K, N, rows, cols):
        ext = {"M": M, "K": K, "N": N}
        R, C = (cols, rows) if exchange else (rows, cols)
        out = {}
        for d, (rd, cd, t) in _LAYOUT.items():
            rd, cd = (cd, rd) if d in swap else (rd, cd)
            folds = math.ceil(ext[rd] / R) * math.ceil(ext[cd] / C)
            load, T = (0 if d == "os" else R), ext[t]
            if timing == "scalesim":
                out[d] = folds * (load + T + R + C - 2) - 1
            else:
                out[d] = load + (folds - 1) * max(T, R) + T + R + C - 2 + (
                    R if d == "os" and drain else 0)
        return min(out, key=out.get)

    return best_dataflow


def _ex5_hidden(rng):
    arrays = ((128, 256), (256, 128), (64, 128), (128, 64))
    right = make_dataflow()
    fools = [make_dataflow(swap=("is",)), make_dataflow(swap=("ws",)),
             make_dataflow(swap=("os",)), make_dataflow(exchange=True),
             make_dataflow(timing="scalesim"), make_dataflow(drain=False)]
    cases, winners = [], set()
    for _ in range(3000):
        r, c = arrays[int(rng.integers(len(arrays)))]
        m, k, n = (int(v) for v in rng.integers(8, 2049, 3))
        counts = {d: systolic.cycle_count(m, k, n, r, c, d) for d in systolic.DATAFLOWS}
        best = right(m, k, n, r, c)
        if sorted(counts.values())[0] == sorted(counts.values())[1] or best in winners:
            continue
        if any(f(m, k, n, r, c) != best for f in fools):
            cases.append(Case(f"M={m}, K={k}, N={n} on a non-square {r}x{c} array",
                              {"M": m, "K": k, "N": n, "rows": r, "cols": c}))
            winners.add(best)
        if len(cases) == 3:
            break
    return cases


EX5 = Key(
    reference=make_dataflow(),
    hidden=_ex5_hidden,
    mistakes=[
        Mistake("input-stationary keeps a transposed in the cells: K along the rows, M along "
                "the columns, N streams", make_dataflow(swap=("is",))),
        Mistake("weight-stationary keeps b as it is: K along the rows, N along the columns, M "
                "streams", make_dataflow(swap=("ws",))),
        Mistake("output-stationary keeps c in the cells: M along the rows, N along the "
                "columns, K streams", make_dataflow(swap=("os",))),
        Mistake("rows and cols are swapped: rows is the array's height (the R in the load, in "
                "max(T, R) and in the drain), cols its width", make_dataflow(exchange=True)),
        Mistake("that is the winner with SCALE-Sim's serial folds; with timing='tpu' only the "
                "first load is exposed and folds follow each other max(T, R) apart",
                make_dataflow(timing="scalesim")),
        Mistake("'os' needs R more cycles at the end, to shift the results out of the bottom "
                "edge", make_dataflow(drain=False)),
    ])


# -- Exercise 6 ----------------------------------------------------------------------------

EX6 = Key(
    mistakes=[
        Mistake("below the stall the term is more than half a gap: the sum rounds UP to the "
                "next bf16 number and keeps moving", 16.0),
        Mistake("check the gap at your value: is the term really more than half of it?", 64.0),
        Mistake("that is where a sum of 0.1 stalls in float16 (10 significand bits), not "
                "bf16 (7)", 256.0),
    ])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 4": EX4,
        "Exercise 5": EX5, "Exercise 6": EX6}

"""Checkers for lab 1 (the systolic array). Each returns a :class:`CheckResult`.

The right answers come from the simulator itself (its trace and its measured cycles) or
from arithmetic done here, never from the learner's code, and each failure names the
mistake it looks like: an off-by-one at the fill, a forgotten weight load, a transposed
tile, a forgotten partial-sum accumulation, fp32 where bf16 was asked.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tpu_course import systolic
from tpu_course.checks._core import CheckResult, fail, ok

EX1 = "Exercise 1 (weight-stationary schedule)"
EX2 = "Exercise 2 (tile a large matmul)"
EX3 = "Exercise 3 (predict cycles and utilisation)"
EX4 = "Exercise 4 (bf16 with numbers)"


# -- Exercise 1 ------------------------------------------------------------------------


def _observed_schedule(rows: int, cols: int, m: int) -> tuple[dict, dict]:
    """When each a[i, k] is in cell (k, j), and when each c[i, j] leaves: read off a trace."""
    a = (np.arange(m * rows).reshape(m, rows) + 1).astype(np.int64)  # distinct values
    b = np.ones((rows, cols), np.int64)
    run = systolic.simulate(a, b, rows, cols, "ws", "tpu", trace=True)
    arrive, leave = {}, {}
    for fr in run.trace:
        for k in range(rows):
            for j in range(cols):
                v = fr.horizontal[k, j]
                if not np.isnan(v):
                    i = int(v - 1) // rows
                    arrive.setdefault((i, k, j), fr.cycle)
        for i, j in zip(*np.nonzero(~np.isnan(fr.output))):
            leave.setdefault((int(i), int(j)), fr.cycle)
    return arrive, leave


def check_schedule(activation_arrives: Callable[..., int], output_leaves: Callable[..., int],
                   rows: int = 4, cols: int = 4, m: int = 5) -> CheckResult:
    """Exercise 1: ``activation_arrives(i, k, j, rows, cols)`` is the cycle at which a[i, k]
    is in cell (k, j); ``output_leaves(i, j, rows, cols)`` the cycle at the end of which
    c[i, j] leaves the bottom of column j. One fold, ``timing="tpu"``, cycles from 0."""
    arrive, leave = _observed_schedule(rows, cols, m)
    try:
        got_a = {key: int(activation_arrives(*key, rows, cols)) for key in arrive}
        got_l = {key: int(output_leaves(*key, rows, cols)) for key in leave}
    except NotImplementedError:
        return fail(EX1, "not written yet: replace the NotImplementedError with your formula")
    except Exception as err:  # a learner's bug: say what happened
        return fail(EX1, f"calling your functions raised {type(err).__name__}: {err}")
    bad_a = [(key, got_a[key], want) for key, want in arrive.items() if got_a[key] != want]
    if bad_a:
        diffs = {got - want for _, got, want in bad_a}
        (i, k, j), got, want = bad_a[0]
        where = f"a[{i},{k}] reaches cell ({k},{j}) at cycle {want}, you said {got}"
        if diffs == {-rows}:
            hint = ("you forgot the weight preload: the first activation can only enter "
                    f"after the {rows} cycles it takes to load the weights")
        elif len(diffs) == 1 and abs(next(iter(diffs))) == 1:
            hint = ("off by one at the fill: cycles count from 0, the weights take cycles "
                    f"0..{rows - 1}, so a[0,0] is in cell (0,0) at cycle {rows}")
        elif all(got == want - k_ for ((_, k_, _), got, want) in bad_a):
            hint = "you left out the skew: row k of the edge buffer starts k cycles late"
        elif all(got == want - j_ for ((_, _, j_), got, want) in bad_a):
            hint = "you left out the hops: an activation moves one column per cycle"
        else:
            hint = "think of three delays: the weight load, the row skew (k), the hops (j)"
        return fail(EX1, f"{where} ({len(bad_a)} of {len(arrive)} wrong). {hint}")
    bad_l = [(key, got_l[key], want) for key, want in leave.items() if got_l[key] != want]
    if bad_l:
        diffs = {got - want for _, got, want in bad_l}
        (i, j), got, want = bad_l[0]
        where = f"c[{i},{j}] leaves at the end of cycle {want}, you said {got}"
        if len(diffs) == 1 and abs(next(iter(diffs))) == 1:
            hint = ("off by one: the bottom cell (R-1, j) adds the last product and the "
                    "result leaves at the end of that same cycle")
        elif diffs == {-(rows - 1)}:
            hint = "the partial sum still has to travel down all R rows"
        elif diffs == {cols - 1} or diffs == {-(cols - 1)}:
            hint = "column j's results come out j cycles after column 0's, not C-1"
        else:
            hint = "c[i,j] leaves when a[i, R-1] has reached cell (R-1, j)"
        return fail(EX1, f"{where} ({len(bad_l)} of {len(leave)} wrong). {hint}")
    return ok(EX1, f"all {len(arrive)} arrivals and {len(leave)} departures match the "
                   f"simulator's trace on a {rows}x{cols} array")


# -- Exercise 2 ------------------------------------------------------------------------


def check_tiled_matmul(tiled_matmul: Callable[..., Any], rows: int = 4, cols: int = 4,
                       shape: tuple[int, int, int] = (10, 13, 9), seed: int = 1) -> CheckResult:
    """Exercise 2: ``tiled_matmul(a, b, rows, cols, sim)`` must compute ``a @ b`` by calling
    ``sim`` (a stand-in for ``systolic.simulate``) on tiles of ``b`` that fit the array."""
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a = rng.integers(-5, 6, (m, k))
    b = rng.integers(-5, 6, (k, n))
    calls = []

    def sim(x: Any, w: Any, *args: Any, **kwargs: Any) -> systolic.SystolicRun:
        r = kwargs.get("rows", args[0] if args else rows)
        c = kwargs.get("cols", args[1] if len(args) > 1 else cols)
        if (r, c) != (rows, cols):
            raise ValueError(f"call sim with rows={rows}, cols={cols} (the fixed array), "
                             f"got rows={r}, cols={c}")
        w = np.asarray(w)
        if w.shape[0] > rows or w.shape[1] > cols:
            raise ValueError(f"a tile of b is {w.shape[0]}x{w.shape[1]} but the array is "
                             f"{rows}x{cols}: cut b into tiles that fit")
        calls.append(w.shape)
        return systolic.simulate(x, w, *args, **kwargs)

    try:
        got = np.asarray(tiled_matmul(a, b, rows, cols, sim))
    except NotImplementedError:
        return fail(EX2, "not written yet: replace the NotImplementedError with your code")
    except ValueError as err:
        return fail(EX2, str(err))
    want = a @ b
    if got.shape != want.shape:
        hint = (" (the shape of b.T @ a.T: a transposed result)" if got.shape == want.T.shape
                else " (padding left in? slice the edge tiles back to their real size)")
        return fail(EX2, f"result shape {got.shape}, expected {want.shape}{hint}")
    if not calls:
        return fail(EX2, "your function never called sim(...): multiply the tiles on the "
                         "array with sim, do not use a @ b")
    if np.array_equal(got, want):
        need = math.ceil(k / rows) * math.ceil(n / cols)
        return ok(EX2, f"matches a @ b for {m}x{k} @ {k}x{n} on a {rows}x{cols} array "
                       f"({len(calls)} tile calls; the fewest is {need})")
    # name the mistake by the wrong answers it would produce
    kt = range(0, k, rows)
    last = a[:, kt[-1]:] @ b[kt[-1]:, :]
    first = a[:, :rows] @ b[:rows, :]
    if np.array_equal(got, last) or np.array_equal(got, first):
        return fail(EX2, "only one K tile's partial sums are in the result: you forgot to "
                         "accumulate (add) the partial sums of the K tiles, out[...] += ...")
    every = b.copy()
    for n0 in range(0, n, cols):
        for k0 in kt:
            blk = b[k0:k0 + rows, n0:n0 + cols]
            if blk.shape[0] == blk.shape[1]:
                every[k0:k0 + rows, n0:n0 + cols] = blk.T
    if np.array_equal(got, a @ every):
        return fail(EX2, "every square tile of b went in transposed: the weight tile for "
                         "K rows k0.. and N columns n0.. is b[k0:k0+rows, n0:n0+cols]")
    for n0 in range(0, n, cols):
        for k0 in kt:
            blk = b[k0:k0 + rows, n0:n0 + cols]
            if blk.shape[0] == blk.shape[1]:
                alt = b.copy()
                alt[k0:k0 + rows, n0:n0 + cols] = blk.T
                if np.array_equal(got, a @ alt):
                    return fail(EX2, f"the tile b[{k0}:{k0 + rows}, {n0}:{n0 + cols}] went in "
                                     "transposed: the weight tile for rows k and columns n "
                                     "is b[k0:k0+rows, n0:n0+cols], not its transpose")
    wrong = np.argwhere(got != want)
    i, j = wrong[0]
    return fail(EX2, f"{len(wrong)} of {want.size} entries differ, first at [{i},{j}]: got "
                     f"{got[i, j]}, expected {want[i, j]}. Check the slices of each tile and "
                     "where its result goes in the output")


# -- Exercise 3 ------------------------------------------------------------------------


def check_prediction(predict: Callable[..., tuple[float, float]],
                     cases: tuple[tuple[int, int, int, int, int], ...] = (
                         (100, 100, 100, 128, 128), (300, 200, 260, 128, 128),
                         (20, 9, 7, 4, 4), (3, 8, 8, 8, 2))) -> CheckResult:
    """Exercise 3: ``predict(M, K, N, rows, cols)`` returns (cycles, utilisation) for the
    weight-stationary array with ``timing="tpu"``; compared with what ``simulate`` measures."""
    for m, k, n, r, c in cases:
        rng = np.random.default_rng(0)
        run = systolic.simulate(rng.integers(-2, 3, (m, k)), rng.integers(-2, 3, (k, n)), r, c)
        try:
            cyc, util = predict(m, k, n, r, c)
        except NotImplementedError:
            return fail(EX3, "not written yet: replace the NotImplementedError with your formula")
        case = f"M={m} K={k} N={n} on {r}x{c}"
        if int(cyc) != run.cycles:
            d = int(cyc) - run.cycles
            ss = systolic.cycle_count(m, k, n, r, c, "ws", "scalesim")
            if int(cyc) in (ss, ss + 1) and run.folds > 1:
                hint = ("you let every fold load its weights and drain before the next one "
                        "starts (SCALE-Sim's convention); on the MXU the next weights load "
                        "while the current fold computes, so folds follow max(T, R) apart")
            elif d == -r:
                hint = "you forgot the first weight load (R cycles)"
            elif abs(d) == 1:
                hint = ("off by one: count cycles from 0 to the one in which the last result "
                        "leaves, inclusive (T + R + C - 2 for one fold's stream)")
            elif d == -(c - 1) or d == -(r - 1):
                hint = "the skew costs R - 1 + C - 1 cycles once: the wavefront's trip"
            else:
                hint = ("cycles = R (first load) + (F - 1) * max(T, R) + T + R + C - 2, "
                        "with T = M and F = ceil(K/R) * ceil(N/C)")
            return fail(EX3, f"{case}: simulate measured {run.cycles} cycles, you predicted "
                             f"{cyc} ({d:+d}). {hint}")
        if not math.isclose(float(util), run.utilization, rel_tol=1e-9):
            padded = m * math.ceil(k / r) * r * math.ceil(n / c) * c / (r * c * run.cycles)
            hint = ("you counted the padded MACs as useful: utilisation counts only the "
                    "M*K*N real ones" if math.isclose(float(util), padded, rel_tol=1e-9) else
                    "utilisation = M*K*N / (rows * cols * cycles)")
            return fail(EX3, f"{case}: utilisation {run.utilization:.4f} measured, you "
                             f"predicted {float(util):.4f}. {hint}")
    return ok(EX3, f"cycles and utilisation match the simulator on {len(cases)} shapes")


# -- Exercise 4 ------------------------------------------------------------------------


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def bf16_running_sum(values: np.ndarray) -> float:
    """Sum ``values`` left to right, rounding the running sum to bf16 after every add.

    >>> bf16_running_sum(np.ones(1000, np.float32))
    256.0
    """
    total = np.float32(0.0)
    for v in np.asarray(values, np.float32):
        total = _bf16(np.float32(total + _bf16(v)))
    return float(total)


def check_bf16(sum_of_ones_bf16: float, gap_above_one: float, n: int = 1000) -> CheckResult:
    """Exercise 4: (a) adding 1.0 ``n`` times with a bf16 accumulator gives what? (b) how
    far is 1.0 from the next larger bf16 number?"""
    want_sum = bf16_running_sum(np.ones(n, np.float32))
    want_gap = 2.0 ** -7  # bf16 keeps 7 explicit significand bits (8 with the hidden one)
    if sum_of_ones_bf16 is None or gap_above_one is None:
        return fail(EX4, "not answered yet: compute both numbers")
    if float(sum_of_ones_bf16) != want_sum:
        if float(sum_of_ones_bf16) == n:
            hint = ("that is what an fp32 accumulator gives; keep the running sum in bf16 "
                    "(cast it back to bf16 after every add)")
        else:
            hint = ("once the sum reaches 256, 256 + 1 = 257 needs 9 significant bits and "
                    "rounds back to 256")
        return fail(EX4, f"(a) a bf16 running sum of {n} ones is {want_sum:g}, you said "
                         f"{float(sum_of_ones_bf16):g}: {hint}")
    if not math.isclose(float(gap_above_one), want_gap, rel_tol=1e-12):
        g = float(gap_above_one)
        named = {2.0 ** -8: "that is half the gap (the unit roundoff)",
                 2.0 ** -10: "that is fp16's gap (10 significand bits)",
                 2.0 ** -23: "that is fp32's gap (23 significand bits)"}
        hint = next((v for key, v in named.items() if math.isclose(g, key)),
                    "bf16 has 7 explicit significand bits")
        return fail(EX4, f"(b) the next bf16 number after 1.0 is 1 + {want_gap} "
                         f"(2**-7), you said a gap of {g:g}: {hint}")
    return ok(EX4, f"bf16 sum of {n} ones = {want_sum:g} (stuck at 256) and the gap above 1 is "
                   "2**-7 = 0.0078125: about 2-3 significant decimal digits")

"""Checkers for lab 1 (the systolic array): the registry ``LAB`` and one checker per exercise.

The right answers come from the simulator (``systolic.simulate``) or from its closed
form ``systolic.cycle_count`` (which a test holds equal to the simulator), never from the
learner's code. A failure says what is wrong and what the mistake looks like; the
expected value is shown only by ``checks.reveal("Exercise N")``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import threading
from typing import Any, Callable, Iterator

import numpy as np

from tpu_course import systolic
from tpu_course.checks._core import CheckResult, Lab, as_number, fail, ok

LAB = Lab(1, "The systolic array")

EX1 = "Exercise 1 (tile a large matmul)"
EX2 = "Exercise 2 (predict a GEMM on two arrays)"
EX3 = "Exercise 3 (the smallest batch that fills the array)"
EX4 = "Exercise 4 (choose the dataflow)"
EX5 = "Exercise 5 (where a bf16 sum stalls)"

#: Exercise 2's GEMM: C[M x N] = A[M x K] @ B[K x N], on a 128x128 and a 256x256 array.
GEMM = (200, 384, 640)
#: Exercise 5: the value added again and again to a bf16 running sum.
STALL_TERM = 0.1


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Stop a learner's loop that never ends (main thread only: a notebook's cells)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def stop(*_: Any) -> None:
        raise TimeoutError(f"your function ran for more than {seconds:g} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- Exercise 1 ------------------------------------------------------------------------


@LAB.exercise(EX1, minutes=25, kind="write")
def check_tiled_matmul(tiled_matmul: Callable[..., Any], rows: int = 4, cols: int = 4,
                       shape: tuple[int, int, int] = (10, 13, 9), seed: int = 1) -> CheckResult:
    """Exercise 1: ``tiled_matmul(a, b, rows, cols, sim)`` must compute ``a @ b`` by calling
    ``sim`` (a stand-in for ``systolic.simulate``) on tiles of ``b`` that fit the array."""
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a = rng.integers(-5, 6, (m, k))
    b = rng.integers(-5, 6, (k, n))
    calls = []

    class TileError(ValueError):
        pass

    def sim(x: Any, w: Any, *args: Any, **kwargs: Any) -> systolic.SystolicRun:
        r = kwargs.get("rows", args[0] if args else rows)
        c = kwargs.get("cols", args[1] if len(args) > 1 else cols)
        if (r, c) != (rows, cols):
            raise TileError(f"call sim with rows={rows}, cols={cols} (the fixed array), "
                            f"got rows={r}, cols={c}")
        w = np.asarray(w)
        if w.ndim != 2 or w.shape[0] > rows or w.shape[1] > cols:
            raise TileError(f"a tile of b is {'x'.join(map(str, w.shape))} but the array is "
                            f"{rows}x{cols}: cut b into tiles that fit")
        calls.append(w.shape)
        return systolic.simulate(x, w, *args, **kwargs)

    try:
        got = tiled_matmul(a, b, rows, cols, sim)
    except TileError as err:
        return fail(EX1, str(err), hint="b[k0:k0+rows, n0:n0+cols] is one tile")
    except TypeError as err:
        if any(word in str(err) for word in ("SystolicRun", "dtype('O')", "object")):
            return fail(EX1, f"your code raised TypeError: {str(err)[:200]}",
                        hint="sim(...) returns a SystolicRun (cycles, utilisation, ...); the "
                             "product itself is its .result")
        raise
    if isinstance(got, systolic.SystolicRun):
        return fail(EX1, "you returned a SystolicRun, not the product matrix",
                    hint="return the assembled output array; a run's product is run.result")
    if got is None:
        return fail(EX1, "your function returned None", hint="return the output array")
    got = np.asarray(got)
    if got.dtype == object:
        return fail(EX1, "your result is not an array of numbers (a list of runs or tiles?)",
                    hint="assemble one (M x N) array from the tiles' run.result")
    want = a @ b
    if got.shape != want.shape:
        if got.shape == want.T.shape:
            hint = "that is the shape of b.T @ a.T: a transposed result"
        else:
            hint = "padding left in? slice the edge tiles back to their real size"
        return fail(EX1, f"result shape {got.shape}, but a ({m}x{k}) @ ({k}x{n}) product is "
                         f"{m}x{n}", hint=hint)
    if not calls:
        return fail(EX1, "your function never called sim(...)",
                    hint="multiply the tiles on the array with sim, do not use a @ b")
    if np.array_equal(got, want):
        need = math.ceil(k / rows) * math.ceil(n / cols)
        return ok(EX1, f"matches a @ b for {m}x{k} @ {k}x{n} on a {rows}x{cols} array "
                       f"({len(calls)} tile calls; the fewest is {need})")
    kt = range(0, k, rows)
    last = a[:, kt[-1]:] @ b[kt[-1]:, :]
    first = a[:, :rows] @ b[:rows, :]
    if np.array_equal(got, last) or np.array_equal(got, first):
        return fail(EX1, "only one K tile's partial sums are in the result",
                    hint="the K tiles of one output block add up: out[...] += ..., not =")
    for n0 in range(0, n, cols):
        for k0 in kt:
            blk = b[k0:k0 + rows, n0:n0 + cols]
            if blk.shape[0] == blk.shape[1]:
                alt = b.copy()
                alt[k0:k0 + rows, n0:n0 + cols] = blk.T
                if np.array_equal(got, a @ alt):
                    return fail(EX1, f"the tile b[{k0}:{k0 + rows}, {n0}:{n0 + cols}] went in "
                                     "transposed",
                                hint="the weight tile for rows k and columns n is "
                                     "b[k0:k0+rows, n0:n0+cols], not its transpose")
    wrong = np.argwhere(got != want)
    i, j = wrong[0]
    return fail(EX1, f"{len(wrong)} of {want.size} entries differ, the first at [{i},{j}]",
                hint="check the slices of each tile of a and b, and where its result goes in "
                     "the output", answer=f"a @ b[{i},{j}] = {want[i, j]}, you have {got[i, j]}")


# -- Exercise 2 ------------------------------------------------------------------------


def _pair(title: str, value: Any, side: int) -> tuple[float, float] | CheckResult:
    what = f"predicted_{side}"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        return fail(title, f"{what} should be a pair (cycles, utilisation), but it is "
                           f"{type(value).__name__}: {value!r:.60}",
                    hint=f"predicted_{side} = (cycles, utilisation), e.g. (1000, 0.5)")
    cycles = as_number(title, value[0], f"the cycle count in {what}")
    if isinstance(cycles, CheckResult):
        return cycles
    util = as_number(title, value[1], f"the utilisation in {what}")
    if isinstance(util, CheckResult):
        return util
    return cycles, util


@functools.lru_cache(maxsize=8)
def _simulated(shape: tuple[int, int, int], side: int) -> systolic.SystolicRun:
    """The simulator's run of a random integer GEMM of ``shape`` on a side x side array."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    return systolic.simulate(rng.integers(-2, 3, (m, k)), rng.integers(-2, 3, (k, n)), side, side)


def _side(value: Any) -> int | None:
    text = str(value).lower()
    has = {side for side in (128, 256) if str(side) in text}
    return has.pop() if len(has) == 1 else None


@LAB.exercise(EX2, minutes=15, kind="predict")
def check_gemm_prediction(predicted_128: Any, predicted_256: Any, finishes_first: Any,
                          shape: tuple[int, int, int] = GEMM, rel: float = 0.05) -> CheckResult:
    """Exercise 2: (cycles, utilisation) predicted for ``shape`` on a 128x128 and a 256x256
    weight-stationary array, and which finishes first, against ``systolic.simulate``.
    Cycles and utilisation pass within ``rel`` (5 %)."""
    m, k, n = shape
    runs = {side: _simulated(shape, side) for side in (128, 256)}
    answer = "; ".join(f"{s}x{s}: {r.cycles:,} cycles, utilisation {r.utilization:.3f}"
                       for s, r in runs.items())
    faster = min(runs, key=lambda s: runs[s].cycles)
    answer += f"; the {faster}x{faster} array finishes first"
    for side, value in ((128, predicted_128), (256, predicted_256)):
        pair = _pair(EX2, value, side)
        if isinstance(pair, CheckResult):
            return pair
        cyc, util = pair
        run = runs[side]
        if not math.isclose(cyc, run.cycles, rel_tol=rel):
            ss = systolic.cycle_count(m, k, n, side, side, "ws", "scalesim")
            if math.isclose(cyc, ss, rel_tol=rel):
                hint = ("you let every fold load its weights and drain before the next starts "
                        "(SCALE-Sim's count); the MXU loads the next fold's weights while the "
                        "current one streams, so folds follow each other max(T, R) apart")
            elif math.isclose(cyc, run.folds * (m + 2 * side + side - 2), rel_tol=rel):
                hint = "only the first weight load is exposed: folds overlap (max(T, R) apart)"
            else:
                hint = ("count the folds first: ceil(K/R) * ceil(N/C); then one weight load, "
                        "(F - 1) * max(M, R) and one fold's stream M + R + C - 2")
            return fail(EX2, f"your cycle count for the {side}x{side} array is "
                             f"{abs(cyc / run.cycles - 1):.0%} off the simulator's "
                             f"(tolerance {rel:.0%})", hint=hint, answer=answer)
        if util > 1 and util <= 100 and math.isclose(util / 100, run.utilization, rel_tol=rel):
            return fail(EX2, f"your utilisation for {side}x{side} looks like a percentage",
                        hint="give it as a fraction between 0 and 1", answer=answer)
        if not math.isclose(util, run.utilization, rel_tol=rel):
            padded = (m * math.ceil(k / side) * side * math.ceil(n / side) * side
                      / (side * side * run.cycles))
            hint = ("you counted the padded MACs as useful: only M*K*N are"
                    if math.isclose(util, padded, rel_tol=rel) else
                    "utilisation = M*K*N useful MACs / (cells * cycles)")
            return fail(EX2, f"your utilisation for the {side}x{side} array is off the "
                             f"simulator's by more than {rel:.0%}", hint=hint, answer=answer)
    side = _side(finishes_first)
    if side is None:
        return fail(EX2, f"finishes_first should name one array, 128 or 256; you gave "
                         f"{finishes_first!r:.40}", hint='finishes_first = "256x256" (or 128x128)')
    if side != faster:
        return fail(EX2, f"the {side}x{side} array does not finish first",
                    hint="compare your two cycle counts", answer=answer)
    slow = 384 - faster
    return ok(EX2, f"{answer}. Your predictions are within {rel:.0%} of the simulator: the "
                   f"bigger array wins on time ({runs[slow].cycles / runs[faster].cycles:.2f}x "
                   "fewer cycles with 4x the cells) and loses on utilisation")


# -- Exercise 3 ------------------------------------------------------------------------


def smallest_batch_reference(K: int, N: int, rows: int, cols: int,
                             max_waste: float = 0.1) -> int | None:
    """The smallest M at which a weight-stationary array is busy at least ``1 - max_waste``
    of its cell-cycles (``systolic.utilization``), or None when no batch gets there
    (utilisation grows with M towards K*N / (padded K * padded N))."""
    target = 1 - max_waste
    ceiling = K * N / (math.ceil(K / rows) * rows * math.ceil(N / cols) * cols)
    if ceiling < target:
        return None
    lo, hi = 1, 1
    while systolic.utilization(hi, K, N, rows, cols) < target:
        hi *= 2
        if hi > 1 << 40:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if systolic.utilization(mid, K, N, rows, cols) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


#: Exercise 3's cases (K, N, rows, cols): many folds, one fold, a v6e-sized array, and a
#: layer whose padding alone wastes more than 10 %.
BATCH_CASES = ((1024, 1024, 128, 128), (128, 128, 128, 128), (4096, 4096, 256, 256),
               (100, 1024, 128, 128))


@LAB.exercise(EX3, minutes=15, kind="transfer")
def check_smallest_batch(smallest_batch: Callable[..., Any],
                         cases: tuple[tuple[int, int, int, int], ...] = BATCH_CASES,
                         time_limit_s: float = 20.0) -> CheckResult:
    """Exercise 3: ``smallest_batch(K, N, rows, cols)`` is the smallest batch M for which a
    K x N weight matrix keeps the array at least 90 % busy, or None if no M does."""
    for case in cases:
        K, N, r, c = case
        want = smallest_batch_reference(K, N, r, c)
        where = f"K={K}, N={N} on a {r}x{c} array"
        try:
            with _time_limit(time_limit_s):
                got = smallest_batch(K, N, r, c)
        except TimeoutError:
            return fail(EX3, f"for {where} your function ran for more than {time_limit_s:g} s",
                        hint="can every layer reach 90 %? Padding K or N up to the array "
                             "size is waste that no batch size removes: return None then")
        answer = f"{where}: {want}"
        if want is None:
            if got is None:
                continue
            return fail(EX3, f"for {where} you returned {got!r}, but no batch gets there",
                        hint="K and N are padded to multiples of the array size: what is the "
                             "utilisation with an endless batch?", answer=answer)
        if got is None:
            return fail(EX3, f"for {where} you returned None, but some batch does reach 90 %",
                        hint="utilisation grows with M; look further", answer=answer)
        number = as_number(EX3, got, f"the batch for {where}")
        if isinstance(number, CheckResult):
            return number
        if number == want:
            continue
        util = systolic.utilization(max(1, int(number)), K, N, r, c)
        if number < want:
            msg = (f"for {where}, M={number:g} keeps the array only {util:.1%} busy "
                   "(simulate it to see)")
        else:
            msg = f"for {where} a smaller batch than {number:g} already reaches 90 %"
        if number == r:
            hint = ("M = rows hides each fold's weight load behind the stream, but the "
                    "fill and drain of the pipeline (R + C - 2 cycles) and the first load "
                    "still cost: count them")
        elif abs(number - want) == 1:
            hint = "off by one: the smallest M with utilisation >= 0.9"
        else:
            hint = ("write the utilisation as a function of M with systolic's cycle model "
                    "(careful: max(M, R) between folds), and solve for >= 0.9")
        return fail(EX3, msg, hint=hint, answer=answer)
    answers = ", ".join(f"{smallest_batch_reference(*cs)}" for cs in cases)
    return ok(EX3, f"right for all {len(cases)} layers (batches {answers}): one fold needs a "
                   "batch in the thousands to hide the pipeline's fill, many folds need about "
                   "the array's width, and padding can waste more than any batch recovers")


# -- Exercise 4 ------------------------------------------------------------------------

#: Exercise 4's shapes (M, K, N, rows, cols), one per dataflow that wins.
DATAFLOW_CASES = ((1024, 384, 1536, 256, 256), (96, 1000, 700, 128, 128),
                  (16, 1024, 1024, 128, 128), (200, 384, 640, 256, 256))
_DATAFLOW_WORDS = {"weight": "ws", "input": "is", "output": "os"}


@LAB.exercise(EX4, minutes=15, kind="transfer")
def check_best_dataflow(best_dataflow: Callable[..., Any],
                        cases: tuple[tuple[int, int, int, int, int], ...] = DATAFLOW_CASES
                        ) -> CheckResult:
    """Exercise 4: ``best_dataflow(M, K, N, rows, cols)`` returns the dataflow ('ws', 'is'
    or 'os') with the fewest cycles (``timing="tpu"``); on a tie any of the tied ones."""
    for m, k, n, r, c in cases:
        counts = {d: systolic.cycle_count(m, k, n, r, c, d) for d in systolic.DATAFLOWS}
        best = min(counts.values())
        winners = sorted(d for d, v in counts.items() if v == best)
        got = best_dataflow(m, k, n, r, c)
        where = f"M={m}, K={k}, N={n} on {r}x{c}"
        key = str(got).strip().lower() if isinstance(got, str) else None
        if key is not None and key not in counts:
            key = next((v for w, v in _DATAFLOW_WORDS.items() if w in key), None)
        if key is None:
            return fail(EX4, f"for {where} you returned {got!r:.40}, not a dataflow",
                        hint="return one of the strings 'ws', 'is', 'os'")
        if key in winners:
            continue
        return fail(EX4, f"for {where}, {key!r} takes {counts[key] / best - 1:.0%} more cycles "
                         "than the best dataflow",
                    hint="for each dataflow: which of M, K, N sit on the rows and columns "
                         "(folds), and which one streams (T)? cycles = P + (F-1) max(T, R) + "
                         "T + R + C - 2 (+ R to drain for 'os')",
                    answer=f"{where}: " + ", ".join(f"{d} {v:,}" for d, v in counts.items()))
    return ok(EX4, f"the fastest dataflow on all {len(cases)} shapes: the dimension that "
                   "streams should be the long one, and the stationary ones should fill the "
                   "array")


# -- Exercise 5 ------------------------------------------------------------------------


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def bf16_running_sum(values: np.ndarray) -> float:
    """Sum ``values`` left to right, rounding the running sum to bf16 after every add.

    >>> bf16_running_sum(np.ones(1000, np.float32))
    256.0
    >>> bf16_running_sum(np.full(2000, 0.1, np.float32))
    32.0
    """
    total = np.float32(0.0)
    for v in np.asarray(values, np.float32):
        total = _bf16(np.float32(total + _bf16(v)))
    return float(total)


@LAB.exercise(EX5, minutes=10, kind="predict")
def check_stall(predicted_stall: Any, term: float = STALL_TERM, rel: float = 0.05) -> CheckResult:
    """Exercise 5: where a bf16 running sum of ``term`` stops growing (within ``rel``)."""
    got = as_number(EX5, predicted_stall, "your predicted stall value")
    if isinstance(got, CheckResult):
        return got
    want = bf16_running_sum(np.full(int(8 / term * 256), term, np.float32))
    answer = f"a bf16 running sum of {term} stops at {want:g}"
    if math.isclose(got, want, rel_tol=rel):
        return ok(EX5, f"{answer}: at {want:g} the gap between bf16 numbers is "
                       f"{want * 2 ** -7:g}, and {term} is less than half of it, so "
                       f"{want:g} + {term} rounds back to {want:g}")
    if math.isclose(got, want / 2, rel_tol=rel):
        hint = ("below the stall the term is more than half a gap: the sum rounds UP to the "
                "next bf16 number and keeps moving (faster than it should)")
    elif math.isclose(got, want * 2, rel_tol=rel):
        hint = "check the gap at your value: is the term really more than half of it?"
    else:
        hint = ("the gap above a number x in [2^e, 2^(e+1)) is 2^(e-7); the sum stops when the "
                "term is less than half that gap")
    return fail(EX5, "that is not where the sum stops", hint=hint, answer=answer)

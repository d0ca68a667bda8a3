"""Lab 1 (the systolic array): each exercise declared once.

What each exercise gets from the learner, the inputs it is tried on, how the learner's
code is run (the probe) and how its output is compared. The expected outputs come from
the simulator where it computes them (``systolic.simulate``) and otherwise from the
stored data of the visible cases; references, hidden cases and known mistakes live in
the repository's ``grading/ch01.py`` (see :mod:`tpu_course.checks.engine`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from tpu_course import systolic
from tpu_course.checks.engine import Case, Exercise, Lab, Wrong, close, equal, number

LAB = Lab(1, "The systolic array")

#: Exercise 3's GEMM: C[M x N] = A[M x K] @ B[K x N], on a 128x128 and a 256x256 array.
GEMM = (200, 384, 640)
#: Exercise 6: the value added again and again to a bf16 running sum.
STALL_TERM = 0.1


def _ints(seed: int, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 10, shape) for shape in shapes]


# -- Exercise 1: one cycle of the array ----------------------------------------------------


def registers(rows: int, cols: int, m: int, k: int, n: int, seed: int) -> np.ndarray:
    """The simulator's (activation, partial-sum) registers at the end of every stream
    cycle of ``a @ b`` (M x K @ K x N, ints from ``seed``) on a rows x cols array, stacked
    as (cycles, 2, rows, cols); an empty register holds 0."""
    a, b = _ints(seed, (m, k), (k, n))
    run = systolic.simulate(a, b, rows, cols, trace=True)
    return np.array([(np.nan_to_num(f.horizontal), np.nan_to_num(f.vertical))
                     for f in run.trace[rows:]], dtype=np.int64)


def _two_registers(got: Any, rows: int, cols: int) -> np.ndarray:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Wrong(f"your function returned {type(got).__name__} "
                    f"{'of length ' + str(len(got)) if isinstance(got, (tuple, list)) else ''}"
                    ", not two registers", "return both registers: return act, psum")
    out = []
    for name, value in zip(("act", "psum"), got):
        try:
            arr = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise Wrong(f"the {name} you returned is not an array of numbers",
                        "return two arrays of the array's shape, rows x cols") from None
        if arr.shape != (rows, cols):
            raise Wrong(f"the {name} you returned has shape {arr.shape}, but the array is "
                        f"{rows}x{cols}", "that is the array transposed: the first axis is the "
                        "array's rows" if arr.shape == (cols, rows) else
                        "the registers have one entry per cell: w.shape")
        out.append(arr)
    return np.array(out)


def _probe_cycle(answer: Mapping[str, Any], case: Case) -> np.ndarray:
    """The learner's step from the registers of each cycle before (the simulator's, or with
    ``random`` any register contents: one cycle is a function of its inputs alone), in a
    shuffled order and once more for three of them (a step that keeps state shows), on
    copies."""
    ws_cycle = answer["ws_cycle"]
    rows, cols, m, k, n, seed = (case.args[x] for x in ("rows", "cols", "m", "k", "n", "seed"))
    a, b = _ints(seed, (m, k), (k, n))
    w = np.zeros((rows, cols), np.int64)
    w[:k, :n] = b
    trace = registers(rows, cols, m, k, n, seed)
    before = np.concatenate([np.zeros((1, 2, rows, cols), np.int64), trace[:-1]])
    if case.args.get("random"):
        before = np.random.default_rng(seed + 1).integers(-50, 50, before.shape)
    got = np.zeros(before.shape, float)
    order = np.random.default_rng(seed).permutation(len(before))
    for i, s in enumerate([*order, *order[:3]]):
        step = _two_registers(ws_cycle(w.copy(), before[s, 0].copy(), before[s, 1].copy(),
                                       a.copy(), int(s)), rows, cols)
        if i >= len(order) and not np.array_equal(step, got[s]):
            raise Wrong(f"called again for stream cycle {s}, your step returns other "
                        "registers: it depends on something besides its arguments",
                        "compute the cycle from w, act, psum, a and s alone (no counter or "
                        "global state between calls)")
        got[s] = step
    return got


def _cycle_case(rows: int, cols: int, m: int, k: int, n: int, seed: int, label: str,
                random: bool = False) -> Case:
    held = "registers holding any values" if random else "the simulator's registers"
    return Case(f"{label}: a {m}x{k} @ {k}x{n} product on a {rows}x{cols} array, from {held}",
                {"rows": rows, "cols": cols, "m": m, "k": k, "n": n, "seed": seed,
                 "random": random})


check_ws_cycle = LAB.add(Exercise(
    "Exercise 1 (one cycle of the array)", minutes=15, provides=("ws_cycle",),
    cases=(_cycle_case(4, 3, 5, 3, 3, 0, "a non-square array with a padded row"),),
    probe=_probe_cycle,
    compare=equal("the registers your step returns (cycle, act/psum, row, col)"),
    hint="row k of the left edge gets a[s - k, k] at stream cycle s (0 before and after the "
         "stream); activations move one column right; each cell adds its product to the sum "
         "the cell above held",
    success="every register matches the simulator's trace; the last result leaves the "
            "bottom-right cell R + M + R + C - 2 cycles after the load began"))


# -- Exercise 2: tile a large matmul --------------------------------------------------------


class _Sim:
    """``systolic.simulate`` as the learner's ``sim``, counting which products of ``b`` go
    through it; ``mark`` is added to every result (to see that the output is built from
    them)."""

    def __init__(self, a: np.ndarray, b: np.ndarray, mark: int = 0) -> None:
        self.a, self.b, self.mark = a, b, mark
        self.count = np.zeros(b.shape, np.int64)

    def __call__(self, a_tile: Any, b_tile: Any, rows: int, cols: int, **kw: Any) -> Any:
        a_tile, b_tile = np.asarray(a_tile), np.asarray(b_tile)
        if b_tile.ndim != 2 or b_tile.shape[0] > rows or b_tile.shape[1] > cols:
            raise Wrong(f"sim got a tile of b of shape {b_tile.shape}, which does not fit the "
                        f"{rows}x{cols} array", "cut b into tiles of at most rows x cols")
        hits = [(i, j) for i in range(self.b.shape[0] - b_tile.shape[0] + 1)
                for j in range(self.b.shape[1] - b_tile.shape[1] + 1)
                if np.array_equal(self.b[i:i + b_tile.shape[0], j:j + b_tile.shape[1]], b_tile)]
        if len(hits) == 1:
            i, j = hits[0]
            self.count[i:i + b_tile.shape[0], j:j + b_tile.shape[1]] += 1
        run = systolic.simulate(a_tile, b_tile, rows, cols, **kw)
        return dataclasses.replace(run, result=run.result + self.mark) if self.mark else run


def _distinct(seed: int, shape: tuple[int, int]) -> np.ndarray:
    """Integers with every tile of a matrix different from every other (so a tile can be
    told from its contents)."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(1, shape[0] * shape[1] + 1)).reshape(shape) % 97 + 1


def _probe_tiled(answer: Mapping[str, Any], case: Case) -> tuple:
    tiled = answer["tiled_matmul"]
    rows, cols, (m, k, n) = case.args["rows"], case.args["cols"], case.args["shape"]
    a, b = _distinct(case.args["seed"], (m, k)), _distinct(case.args["seed"] + 1, (k, n))
    outputs = []
    for mark in (0, 1):
        sim = _Sim(a, b, mark)
        out = tiled(a.copy(), b.copy(), rows, cols, sim)
        out = np.asarray(out, dtype=float) if not isinstance(out, systolic.SystolicRun) else out
        if isinstance(out, systolic.SystolicRun) or np.shape(out) != (m, n):
            raise Wrong(f"your function returned {type(out).__name__} of shape "
                        f"{np.shape(out)}, not the {m}x{n} product",
                        "return the assembled output array; each run's product is its .result")
        outputs += [out, sim.count]
    product, count, marked, _ = outputs
    return product, count, marked - product


def _tiled_case(rows: int, cols: int, shape: tuple[int, int, int], seed: int, label: str
                ) -> Case:
    m, k, n = shape
    return Case(f"{label}: {m}x{k} @ {k}x{n} on a {rows}x{cols} array",
                {"rows": rows, "cols": cols, "shape": shape, "seed": seed})


check_tiled_matmul = LAB.add(Exercise(
    "Exercise 2 (tile a large matmul)", minutes=25, provides=("tiled_matmul",),
    cases=(_tiled_case(4, 3, (10, 13, 11), 1, "a non-square array, K and N not multiples"),),
    probe=_probe_tiled,
    compare=equal("(your product, how often sim multiplied each entry of b, how much of each "
                  "output came from sim's runs)"),
    hint="loop over every (k-tile, n-tile) of b, multiply each once with sim, and add its "
         ".result into the output block of that n-tile",
    success="every product went through the array once, and the K tiles' partial sums "
            "added up in the output"))


# -- Exercise 3: predict a GEMM on two arrays -------------------------------------------------


def gemm_truth(shape: tuple[int, int, int] = GEMM) -> tuple:
    """What the simulator measures: ((cycles, utilisation) on 128x128, on 256x256, and the
    side of the array that finishes first)."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    a, b = rng.integers(-2, 3, (m, k)), rng.integers(-2, 3, (k, n))
    runs = {side: systolic.simulate(a, b, side, side) for side in (128, 256)}
    first = min(runs, key=lambda side: runs[side].cycles)
    return ((runs[128].cycles, runs[128].utilization), (runs[256].cycles, runs[256].utilization),
            first)


def _probe_gemm(answer: Mapping[str, Any], case: Case) -> tuple:
    pairs = []
    for name in ("predicted_128", "predicted_256"):
        value = answer[name]
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
            raise Wrong(f"{name} should be a pair (cycles, utilisation), not {value!r:.60}",
                        f"{name} = (cycles, utilisation), e.g. (1000, 0.5)")
        pairs.append((number(value[0], f"the cycles in {name}"),
                      number(value[1], f"the utilisation in {name}")))
    text = str(answer["finishes_first"]).lower()
    sides = {side for side in (128, 256) if str(side) in text}
    if len(sides) != 1:
        raise Wrong(f"finishes_first should name one array, 128 or 256, not {text!r:.40}",
                    'finishes_first = "256x256" (or "128x128")')
    return (*pairs, sides.pop())


check_gemm_prediction = LAB.add(Exercise(
    "Exercise 3 (predict a GEMM on two arrays)", minutes=15, kind="predict",
    provides=("predicted_128", "predicted_256", "finishes_first"),
    probe=_probe_gemm, expect=lambda case: gemm_truth(),
    compare=close(0.05, what="your (cycles, utilisation) pairs and the faster array"),
    hint="count the folds first, ceil(K/R) * ceil(N/C); then one weight load, (F - 1) * "
         "max(M, R) and one fold's stream M + R + C - 2; utilisation = M*K*N / (cells * "
         "cycles)",
    success="the bigger array wins on time (fewer folds) and loses on utilisation (more of "
            "its cells idle on a 200-row batch)"))


# -- Exercise 4: the smallest batch that fills the array -------------------------------------

#: Visible layers (K, N, rows, cols): many folds, one fold, a v6e-sized array, a layer
#: whose padding alone wastes more than 10 %, and a non-square array.
BATCH_CASES = ((1024, 1024, 128, 128), (128, 128, 128, 128), (4096, 4096, 256, 256),
               (100, 1024, 128, 128), (1000, 2048, 128, 256))


def _probe_batch(answer: Mapping[str, Any], case: Case) -> Any:
    got = answer["smallest_batch"](**case.args)
    return None if got is None else number(got, "your batch")


def _batch_compare(got: Any, want: Any, case: Case) -> str | None:
    if (got is None) != (want is None):
        return ("you returned None, but a batch does reach 90 %" if got is None else
                f"you returned {got:g}, but no batch reaches 90 %")
    if got is None or got == want:
        return None
    return f"M = {got:g} is not the smallest batch that keeps the array 90 % busy"


check_smallest_batch = LAB.add(Exercise(
    "Exercise 4 (the smallest batch that fills the array)", minutes=15, kind="apply",
    provides=("smallest_batch",),
    cases=tuple(Case(f"K={K}, N={N} on a {r}x{c} array", {"K": K, "N": N, "rows": r, "cols": c})
                for K, N, r, c in BATCH_CASES),
    probe=_probe_batch, compare=_batch_compare, time_limit_s=20.0,
    hint="write the utilisation as a function of M from the cycle model (careful: max(M, R) "
         "between folds) and find the smallest M with >= 0.9; padding caps it whatever M is",
    success="one fold needs a batch in the thousands to hide the pipeline's fill, many folds "
            "about the array's height, and padding can waste more than any batch recovers"))


# -- Exercise 5: choose the dataflow ------------------------------------------------------------

#: Visible shapes (M, K, N, rows, cols): each dataflow wins on a non-square array, where it
#: matters which dimension lies along the rows, and on a square one.
DATAFLOW_CASES = ((384, 640, 192, 256, 128), (96, 640, 192, 128, 256),
                  (1536, 16, 384, 256, 128), (96, 1000, 700, 128, 128),
                  (16, 1024, 1024, 128, 128), (64, 200, 1024, 128, 256))
_WORDS = {"weight": "ws", "input": "is", "output": "os"}


def dataflow_cycles(M: int, K: int, N: int, rows: int, cols: int) -> dict[str, int]:
    """Each dataflow's cycles (``timing="tpu"``) by the simulator's closed form."""
    return {d: systolic.cycle_count(M, K, N, rows, cols, d) for d in systolic.DATAFLOWS}


def _probe_dataflow(answer: Mapping[str, Any], case: Case) -> str:
    got = answer["best_dataflow"](**case.args)
    key = got.strip().lower() if isinstance(got, str) else None
    if key is not None and key not in systolic.DATAFLOWS:
        key = next((v for w, v in _WORDS.items() if w in key), None)
    if key is None:
        raise Wrong(f"you returned {got!r:.40}, not a dataflow",
                    "return one of the strings 'ws', 'is', 'os'")
    return key


def _dataflow_compare(got: Any, want: Any, case: Case) -> str | None:
    counts = dataflow_cycles(**case.args)
    if got == want or counts[got] == counts[want]:  # any of the tied fastest
        return None
    return f"{got!r} takes {counts[got] / counts[want] - 1:.0%} more cycles than the fastest"


check_best_dataflow = LAB.add(Exercise(
    "Exercise 5 (choose the dataflow)", minutes=15, kind="apply", provides=("best_dataflow",),
    cases=tuple(Case(f"M={m}, K={k}, N={n} on a {r}x{c} array",
                     {"M": m, "K": k, "N": n, "rows": r, "cols": c})
                for m, k, n, r, c in DATAFLOW_CASES),
    probe=_probe_dataflow, compare=_dataflow_compare,
    hint="for each dataflow: which of M, K, N sit along the rows and the columns (folds), and "
         "which one streams (T)? cycles = P + (F-1) max(T, R) + T + R + C - 2 (+ R to drain "
         "for 'os')",
    success="the dimension that streams should be the long one, and the stationary ones "
            "should fill the array along the side that fits them"))


# -- Exercise 6: where a bf16 sum stalls ------------------------------------------------------


def bf16_stall(term: float = STALL_TERM) -> float:
    """Where a running sum of ``term`` kept in bf16 stops growing (measured)."""
    total, step = ml_dtypes.bfloat16(0), np.float32(term)
    for _ in range(int(16 / term) * 64):
        new = ml_dtypes.bfloat16(np.float32(total) + step)
        if new == total:
            break
        total = new
    return float(total)


check_stall = LAB.add(Exercise(
    "Exercise 6 (where a bf16 sum stalls)", minutes=10, kind="predict",
    provides=("predicted_stall",),
    probe=lambda answer, case: number(answer["predicted_stall"], "your predicted stall"),
    expect=lambda case: bf16_stall(),
    compare=close(0.05, what="your stall value"),
    hint="the gap above a number x in [2^e, 2^(e+1)) is 2^(e-7); the sum stops where the term "
         "is less than half that gap",
    success="in [32, 64) the gap between bf16 numbers is 0.25, and 0.1 is less than half of "
            "it, so 32 + 0.1 rounds back to 32"))

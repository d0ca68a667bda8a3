"""Lab 1 (the systolic array), declared for :mod:`tpu_course.checks.engine` (keys in grading/)."""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

from tpu_course import systolic
from tpu_course.checks.engine import Case, Exercise, Lab, Wrong, close, equal, number

LAB = Lab(1, "The systolic array")
GEMM = (200, 384, 640)  #: Exercise 3's C[M x N] = A[M x K] @ B[K x N], on 128x128 and 256x256
STALL_TERM = 0.1  #: Exercise 6: the value added again and again to a bf16 running sum

# -- Exercise 1: one cycle of the array -------------------------------------------------------
def _two_registers(got: Any, rows: int, cols: int) -> np.ndarray:
    pair = got if isinstance(got, (tuple, list)) else [got]  # not two registers: refused below
    try:
        act, psum = (np.asarray(v, float) for v in pair)
    except (TypeError, ValueError):
        raise Wrong(f"your function returned {got!r:.60}, not two registers of numbers",
                    "return both registers, arrays of rows x cols: return act, psum") from None
    for name, shape in (("act", act.shape), ("psum", psum.shape)):
        if shape != (rows, cols):
            raise Wrong(f"the {name} you returned has shape {shape}, not {rows}x{cols}",
                        "that is the array transposed: the first axis is the array's rows"
                        if shape == (cols, rows) else "one entry per cell: w.shape")
    return np.array([act, psum])

def _probe_cycle(answer: dict, case: Case) -> np.ndarray:
    """The learner's step from each cycle's registers (any with ``random``), shuffled, 3 twice."""
    rows, cols, m, k, n, seed = (case.args[x] for x in ("rows", "cols", "m", "k", "n", "seed"))
    rng = np.random.default_rng(seed)
    a, b = rng.integers(1, 10, (m, k)), rng.integers(1, 10, (k, n))
    w = np.zeros((rows, cols), np.int64)
    w[:k, :n] = b
    frames = systolic.simulate(a, b, rows, cols, trace=True).trace[rows:-1]
    before = np.array([np.zeros((2, rows, cols))] + [
        (np.nan_to_num(f.horizontal), np.nan_to_num(f.vertical)) for f in frames], np.int64)
    if case.args.get("random"):
        before = np.random.default_rng(seed + 1).integers(-50, 50, before.shape)
    got, order = np.zeros(before.shape), np.random.default_rng(seed).permutation(len(before))
    for i, s in enumerate([*order, *order[:3]]):
        act, psum = before[s].copy()
        step = _two_registers(answer["ws_cycle"](w.copy(), act, psum, a.copy(), int(s)), rows, cols)
        if i >= len(order) and not np.array_equal(step, got[s]):
            raise Wrong(f"called again for stream cycle {s}, your step returns other registers: "
                        "it depends on something besides its arguments", "compute the cycle "
                        "from w, act, psum, a and s alone (no counter or state between calls)")
        got[s] = step
    return got

def _cycle_case(rows, cols, m, k, n, seed, label, random=False) -> Case:
    held = "registers holding any values" if random else "the simulator's registers"
    return Case(f"{label}: a {m}x{k} @ {k}x{n} product on a {rows}x{cols} array, from {held}",
                dict(rows=rows, cols=cols, m=m, k=k, n=n, seed=seed, random=random))

check_ws_cycle = LAB.add(Exercise(
    "Exercise 1 (one cycle of the array)", minutes=15, provides=("ws_cycle",),
    cases=(_cycle_case(4, 3, 5, 3, 3, 0, "a non-square array with a padded row"),),
    probe=_probe_cycle, compare=equal("the registers you return (cycle, act/psum, row, col)"),
    hint="row k of the left edge gets a[s - k, k] at stream cycle s (else 0); activations move "
         "one column right; each cell adds its product to the sum the cell above held",
    success="every register matches the simulator's trace; the last result leaves the "
            "bottom-right cell R + M + R + C - 2 cycles after the load began"))

# -- Exercise 2: tile a large matmul ----------------------------------------------------------
class _Sim:
    """The learner's ``sim``: counts each entry of ``b`` it multiplies, adds ``mark`` to results."""
    def __init__(self, b: np.ndarray, mark: int) -> None:
        self.b, self.mark, self.count = b, mark, np.zeros(b.shape, np.int64)

    def __call__(self, a_tile: Any, b_tile: Any, rows: int, cols: int, **kw: Any) -> Any:
        b_tile = np.asarray(b_tile)
        if b_tile.ndim != 2 or b_tile.shape[0] > rows or b_tile.shape[1] > cols:
            raise Wrong(f"sim got a tile of b of shape {b_tile.shape}, which does not fit the "
                        f"{rows}x{cols} array", "cut b into tiles of at most rows x cols")
        h, w = b_tile.shape
        hits = [(i, j) for i in range(len(self.b) - h + 1) for j in range(self.b.shape[1] - w + 1)
                if np.array_equal(self.b[i:i + h, j:j + w], b_tile)]
        for i, j in hits if len(hits) == 1 else ():
            self.count[i:i + h, j:j + w] += 1
        run = systolic.simulate(np.asarray(a_tile), b_tile, rows, cols, **kw)
        return dataclasses.replace(run, result=run.result + self.mark)

def _probe_tiled(answer: dict, case: Case) -> tuple:
    """(the product, how often sim got each entry of b, what sim's results added to it)."""
    rows, cols, (m, k, n), seed = (case.args[x] for x in ("rows", "cols", "shape", "seed"))
    a, b = (np.random.default_rng(seed + i).permutation(np.arange(1, x * y + 1)).reshape(x, y)
            % 97 + 1 for i, (x, y) in enumerate([(m, k), (k, n)]))  # tiles differ in values
    outputs = []
    for mark in (0, 1):
        out = answer["tiled_matmul"](a.copy(), b.copy(), rows, cols, sim := _Sim(b, mark))
        out = out if isinstance(out, systolic.SystolicRun) else np.asarray(out, dtype=float)
        if np.shape(out) != (m, n):
            raise Wrong(f"your function returned {type(out).__name__} of shape {np.shape(out)}"
                        f", not the {m}x{n} product",
                        "return the assembled output array; each run's product is its .result")
        outputs += [out, sim.count]
    return outputs[0], outputs[1], outputs[2] - outputs[0]

def _tiled_case(rows: int, cols: int, shape: tuple, seed: int, label: str) -> Case:
    m, k, n = shape
    return Case(f"{label}: {m}x{k} @ {k}x{n} on a {rows}x{cols} array",
                {"rows": rows, "cols": cols, "shape": shape, "seed": seed})

check_tiled_matmul = LAB.add(Exercise(
    "Exercise 2 (tile a large matmul)", minutes=25, provides=("tiled_matmul",),
    cases=(_tiled_case(4, 3, (10, 13, 11), 1, "a non-square array, K and N not multiples"),),
    probe=_probe_tiled, compare=equal("(your product, how often sim multiplied each entry of "
                                      "b, how much of each output came from sim's runs)"),
    hint="loop over every (k-tile, n-tile) of b, multiply each once with sim, and add its "
         ".result into the output block of that n-tile",
    success="every product went through the array once, and the K tiles' partial sums "
            "added up in the output"))

# -- Exercise 3: predict a GEMM on two arrays -------------------------------------------------
def gemm_truth() -> tuple:
    """The simulator's ((cycles, utilisation) on 128x128, on 256x256, the faster side)."""
    rng = np.random.default_rng(0)
    a, b = rng.integers(-2, 3, GEMM[:2]), rng.integers(-2, 3, GEMM[1:])
    runs = {side: systolic.simulate(a, b, side, side) for side in (128, 256)}
    return (*((r.cycles, r.utilization) for r in runs.values()),
            min(runs, key=lambda side: runs[side].cycles))

def _probe_gemm(answer: dict, case: Case) -> tuple:
    out = []
    for name in ("predicted_128", "predicted_256"):
        v = answer[name]
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) != 2:
            raise Wrong(f"{name} should be a pair (cycles, utilisation), not {v!r:.60}",
                        f"{name} = (cycles, utilisation), e.g. (1000, 0.5)")
        out.append(tuple(number(x, f"the {what} in {name}")
                         for x, what in zip(v, ("cycles", "utilisation"))))
    sides = [side for side in (128, 256) if str(side) in str(answer["finishes_first"])]
    if len(sides) != 1:
        raise Wrong(f"finishes_first should name one array, 128 or 256, not "
                    f"{answer['finishes_first']!r:.40}", 'finishes_first = "256x256" or "128x128"')
    return (*out, sides[0])

check_gemm_prediction = LAB.add(Exercise(
    "Exercise 3 (predict a GEMM on two arrays)", minutes=15, kind="predict",
    provides=("predicted_128", "predicted_256", "finishes_first"),
    probe=_probe_gemm, expect=lambda case: gemm_truth(),
    compare=close(0.05, what="your (cycles, utilisation) pairs and the faster array"),
    hint="count the folds first, ceil(K/R) * ceil(N/C); then one weight load, (F - 1) * "
         "max(M, R) and one fold's stream M + R + C - 2; utilisation = M*K*N / (cells * cycles)",
    success="the bigger array wins on time (fewer folds) and loses on utilisation (more of "
            "its cells idle on a 200-row batch)"))

# -- Exercise 4: the smallest batch that fills the array --------------------------------------
def _batch_compare(got: Any, want: Any, case: Case) -> str | None:
    if got == want or got is None:
        return None if got == want else "you returned None, but a batch does reach 90 %"
    return (f"you returned {got:g}, but no batch reaches 90 %" if want is None else
            f"M = {got:g} is not the smallest batch that keeps the array 90 % busy")

check_smallest_batch = LAB.add(Exercise(
    "Exercise 4 (the smallest batch that fills the array)", minutes=15, kind="apply",
    provides=("smallest_batch",),
    # many folds, one fold, a v6e-sized array, padding alone wastes > 10 %, a non-square array
    cases=tuple(Case(f"K={K}, N={N} on a {r}x{c} array", {"K": K, "N": N, "rows": r, "cols": c})
                for K, N, r, c in ((1024, 1024, 128, 128), (128, 128, 128, 128),
                                   (4096, 4096, 256, 256), (100, 1024, 128, 128),
                                   (1000, 2048, 128, 256))),
    probe=lambda answer, case: (None if (got := answer["smallest_batch"](**case.args)) is None
                                else number(got, "your batch")),
    compare=_batch_compare, time_limit_s=20.0,
    hint="write the utilisation as a function of M from the cycle model (careful: max(M, R) "
         "between folds) and find the smallest M with >= 0.9; padding caps it whatever M is",
    success="one fold needs a batch in the thousands to hide the pipeline's fill, many folds "
            "about the array's height, and padding can waste more than any batch recovers"))

# -- Exercise 5: choose the dataflow ------------------------------------------------------------
def _probe_dataflow(answer: dict, case: Case) -> str:
    got = answer["best_dataflow"](**case.args)
    key = got.strip().lower() if isinstance(got, str) else ""
    words = {"weight": "ws", "input": "is", "output": "os"}  # or a dataflow named in words
    for name in (key, *(name for word, name in words.items() if word in key)):
        if name in systolic.DATAFLOWS:
            return name
    raise Wrong(f"you returned {got!r:.40}, not a dataflow", "return one of 'ws', 'is', 'os'")

def _dataflow_compare(got: Any, want: Any, case: Case) -> str | None:
    c = {d: systolic.cycle_count(**case.args, dataflow=d) for d in (got, want)}
    return None if c[got] == c[want] else \
        f"{got!r} takes {c[got] / c[want] - 1:.0%} more cycles than the fastest"  # ties pass

check_best_dataflow = LAB.add(Exercise(
    "Exercise 5 (choose the dataflow)", minutes=15, kind="apply", provides=("best_dataflow",),
    # each dataflow wins on a non-square array (which side holds what matters) and a square one
    cases=tuple(Case(f"M={m}, K={k}, N={n} on a {r}x{c} array",
                     {"M": m, "K": k, "N": n, "rows": r, "cols": c})
                for m, k, n, r, c in ((384, 640, 192, 256, 128), (96, 640, 192, 128, 256),
                                      (1536, 16, 384, 256, 128), (96, 1000, 700, 128, 128),
                                      (16, 1024, 1024, 128, 128), (64, 200, 1024, 128, 256))),
    probe=_probe_dataflow, compare=_dataflow_compare,
    hint="for each dataflow: which of M, K, N lie along the rows and columns (folds), which one "
         "streams (T)? cycles = P + (F-1) max(T, R) + T + R + C - 2 (+ R to drain for 'os')",
    success="the dimension that streams should be the long one, and the stationary ones "
            "should fill the array along the side that fits them"))

# -- Exercise 6: where a bf16 sum stalls ------------------------------------------------------
def bf16_stall(term: float = STALL_TERM) -> float:
    """Where a running sum of ``term`` kept in bf16 stops growing (measured)."""
    total, step = ml_dtypes.bfloat16(0), np.float32(term)
    while (new := ml_dtypes.bfloat16(np.float32(total) + step)) != total:
        total = new
    return float(total)

check_stall = LAB.add(Exercise(
    "Exercise 6 (where a bf16 sum stalls)", minutes=10, kind="predict",
    provides=("predicted_stall",),
    probe=lambda answer, case: number(answer["predicted_stall"], "your predicted stall"),
    expect=lambda case: bf16_stall(), compare=close(0.05, what="your stall value"),
    hint="the gap above a number x in [2^e, 2^(e+1)) is 2^(e-7); the sum stops where the term "
         "is less than half that gap",
    success="in [32, 64) the gap between bf16 numbers is 0.25, and 0.1 is less than half of "
            "it, so 32 + 0.1 rounds back to 32"))

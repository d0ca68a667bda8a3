"""Checkers for lab 1 (the systolic array): the registry ``LAB`` and one checker per exercise.

The right answers come from the simulator (``systolic.simulate``) or from its closed
form ``systolic.cycle_count`` (which a test holds equal to the simulator), through the
private ``checks._answers.ch01``, never from the learner's code. An answer that is, or
calls, those (or ``systolic.utilization`` and friends where they compute the exercise's
result) is refused. A failure says what is wrong and what the mistake looks like; the
expected value is shown only by ``checks.reveal("Exercise N")``. The exercises whose
answer is a function are also graded on inputs the notebook never shows (``hidden=``):
other shapes and non-square arrays. Exercise 1's cycle of the array is graded step by step
against the registers the simulator records with ``trace=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import signal
import threading
from typing import Any, Callable, Iterator

import numpy as np

from tpu_course import systolic
from tpu_course.systolic import batched, engines
from tpu_course.checks._answers import ch01 as _answers
from tpu_course.checks._core import (
    CheckResult, Lab, Verdict, as_number, course_code_used, fail, ok, refuse,
    refuse_course_code,
)

LAB = Lab(1, "The systolic array")

EX1 = "Exercise 1 (one cycle of the array)"
EX2 = "Exercise 2 (tile a large matmul)"
EX3 = "Exercise 3 (predict a GEMM on two arrays)"
EX4 = "Exercise 4 (the smallest batch that fills the array)"
EX5 = "Exercise 5 (choose the dataflow)"
EX6 = "Exercise 6 (where a bf16 sum stalls)"

#: Exercise 3's GEMM: C[M x N] = A[M x K] @ B[K x N], on a 128x128 and a 256x256 array.
GEMM = (200, 384, 640)
#: Exercise 6: the value added again and again to a bf16 running sum.
STALL_TERM = 0.1

#: The systolic helpers that compute a cycle count or a utilisation: not answers to
#: Exercises 4 and 5, which ask for that reasoning.
_CYCLE_HELPERS = (systolic.cycle_count, systolic.utilization, systolic.closed_form_cycles)


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


def _non_square(rng: np.random.Generator, low: int = 2, high: int = 6) -> tuple[int, int]:
    """A random rows x cols array with rows != cols."""
    rows = int(rng.integers(low, high + 1))
    cols = int(rng.choice([c for c in range(low, high + 1) if c != rows]))
    return rows, cols


# -- Exercise 1 ------------------------------------------------------------------------

#: How the left edge can be fed wrong (row k's index into a at stream cycle s), and the
#: hint that names each mistake.
_FEEDS: dict[str, tuple[Callable[[int, int, int], int], str]] = {
    "right": (lambda s, k, rows: s - k, ""),
    "no skew": (lambda s, k, rows: s, (
        "no skew: every row of the array got row s of a in the same cycle. Row k's edge "
        "buffer starts k cycles late, so that an activation meets the partial sum coming "
        "down from the row above")),
    "reversed": (lambda s, k, rows: s - (rows - 1 - k), (
        "the skew runs the wrong way: row 0 starts first and row k starts k cycles after it")),
    "late": (lambda s, k, rows: s - k - 1, (
        "off by one cycle: your activations enter one cycle late (at stream cycle s = 0, "
        "a[0, 0] is already in cell (0, 0))")),
    "early": (lambda s, k, rows: s - k + 1, (
        "off by one cycle: your activations enter one cycle early (at stream cycle s = 0 "
        "only a[0, 0] has entered)")),
    "load counted": (lambda s, k, rows: s - rows - k, (
        "s counts the cycles since the stream began: the R cycles of the weight load are "
        "not in it")),
    "wraps": (lambda s, k, rows: s - k, (
        "before a row's first activation its edge feeds 0: with s - k < 0, a[s - k] reads "
        "a row from the end of a (a negative index wraps around)")),
    "clipped": (lambda s, k, rows: s - k, (
        "outside 0 <= s - k < M the edge feeds 0, not the first or last row of a again")),
}

#: How the activations can be moved wrong, given the edge's vector x.
_SHIFTS: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], str]] = {
    "right": (lambda act, x: np.hstack([x[:, None], act[:, :-1]]), ""),
    "left": (lambda act, x: np.hstack([x[:, None], act[:, 2:], act[:, :1]])
             if act.shape[1] > 1 else x[:, None], (
        "the activations move the wrong way: each cycle column j takes what column j - 1 "
        "held (they move right), and the edge feeds column 0")),
    "from the right": (lambda act, x: np.hstack([act[:, 1:], x[:, None]]), (
        "the activations enter at the right edge and move left: they enter at column 0 and "
        "move one column right per cycle")),
    "broadcast": (lambda act, x: np.repeat(x[:, None], act.shape[1], axis=1), (
        "every column got the edge's value in the same cycle: an activation moves one "
        "column per cycle, so column j sees it j cycles after column 0")),
    "stays": (lambda act, x: np.hstack([x[:, None], act[:, 1:]]), (
        "the activations do not move: each cycle column j takes what column j - 1 held")),
}

#: How the partial sums can be updated wrong: (previous sums, new activations, previous
#: activations, weights) -> new sums.
_Psum = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _down(psum: np.ndarray) -> np.ndarray:
    return np.vstack([np.zeros_like(psum[:1]), psum[:-1]])


_PSUMS: dict[str, tuple[_Psum, str]] = {
    "right": (lambda p, act, old, w: _down(p) + act * w, ""),
    "stays": (lambda p, act, old, w: p + act * w, (
        "partial sums not passed down: each cell adds its product to the sum the cell "
        "above held in the previous cycle, not to its own")),
    "fresh": (lambda p, act, old, w: act * w, (
        "partial sums not passed down: a cell's new sum is the sum from the cell above "
        "plus its own product, not its product alone")),
    "up": (lambda p, act, old, w: np.vstack([p[1:], np.zeros_like(p[:1])]) + act * w, (
        "the partial sums move up: they move down one row per cycle, row 0 starting from 0")),
    "wraps": (lambda p, act, old, w: np.roll(p, 1, axis=0) + act * w, (
        "the partial sums wrap around (np.roll?): row 0 starts from 0 every cycle, and the "
        "bottom row's sums leave the array")),
    "old activations": (lambda p, act, old, w: _down(p) + old * w, (
        "the product used the activation from before it moved: move the activations "
        "first, then multiply what is in the cell now")),
}


def _edge(a: np.ndarray, s: int, rows: int, feed: str = "right") -> np.ndarray:
    """The vector entering the left edge at stream cycle ``s``, fed right or as ``feed``
    mistakes it."""
    m, k = a.shape
    index = _FEEDS[feed][0]
    x = np.zeros(rows, a.dtype)
    for r in range(min(rows, k)):
        i = index(s, r, rows)
        if feed == "wraps" and -m <= i < m:
            x[r] = a[i, r]
        elif feed == "clipped":
            x[r] = a[min(max(i, 0), m - 1), r]
        elif 0 <= i < m:
            x[r] = a[i, r]
    return x


def _trace_registers(a: np.ndarray, b: np.ndarray, rows: int, cols: int
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The simulator's activation and partial-sum registers at the end of each stream
    cycle of one fold (the stream starts after the ``rows`` load cycles); an empty
    register holds 0."""
    run = systolic.simulate(a, b, rows, cols, trace=True)
    return [(np.nan_to_num(f.horizontal).astype(np.int64), np.nan_to_num(f.vertical).astype(np.int64))
            for f in run.trace[rows:]]


def _registers(got: Any, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """The learner's ``(act, psum)`` as two rows x cols arrays, or a failure saying what
    came back."""
    if got is None:
        refuse(EX1, "your function returned None", hint="return both registers: (act, psum)")
    if isinstance(got, np.ndarray) or not isinstance(got, (tuple, list)):
        refuse(EX1, f"your function returned one {type(got).__name__}, not two registers",
               hint="return both registers: return act, psum")
    if len(got) != 2:
        refuse(EX1, f"your function returned {len(got)} values, not two registers",
               hint="return both registers: return act, psum")
    out = []
    for name, value in zip(("act", "psum"), got):
        try:
            arr = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            refuse(EX1, f"the {name} you returned is not an array of numbers",
                   hint="return two numpy arrays of the array's shape, rows x cols")
        if arr.shape != (rows, cols):
            refuse(EX1, f"the {name} you returned has shape {arr.shape}, but the array is "
                        f"{rows}x{cols} (rows x cols)",
                   hint=("that is the array transposed: rows (the first axis) are the array's "
                         "rows, where a's columns enter" if arr.shape == (cols, rows) else
                         "the registers have one entry per cell: w.shape"))
        out.append(arr)
    return out[0], out[1]


def _step(ws_cycle: Callable[..., Any], w: np.ndarray, act: np.ndarray, psum: np.ndarray,
          a: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """The learner's step on copies of its inputs (it may change them in place)."""
    rows, cols = w.shape
    try:
        got = ws_cycle(w.copy(), act.copy(), psum.copy(), a.copy(), s)
    except Exception as err:
        if isinstance(err, (Verdict, NotImplementedError)):
            raise
        short = a.shape[1] < rows
        refuse(EX1, f"at stream cycle {s} your function raised {type(err).__name__}: "
                    f"{str(err)[:200]}",
               hint=("a has K columns, fewer than the array's rows: rows k >= K of the edge "
                     "feed 0 (the weights there are padding)" if short and isinstance(
                         err, (IndexError, ValueError)) else
                     "before the stream reaches a row, and after it has passed, that row's "
                     "edge feeds 0: index a only where 0 <= s - k < M"
                     if isinstance(err, IndexError) else
                     "run it by hand on the chapter's registers and look at what it returns"))
    return _registers(got, rows, cols)


def _diagnose(got: list[tuple[np.ndarray, np.ndarray]], want: list[tuple[np.ndarray, np.ndarray]],
              a: np.ndarray, w: np.ndarray) -> list[str]:
    """Named mistakes that explain every step the learner returned: one for the
    activations, one for the partial sums (each given the simulator's registers)."""
    rows = w.shape[0]
    zero = np.zeros_like(w)
    prev = [(zero, zero), *want[:-1]]
    hints = []
    act_ok = all(np.array_equal(g[0], t[0]) for g, t in zip(got, want))
    if not act_ok:
        named = ""
        for feed, (_, feed_hint) in _FEEDS.items():
            for shift, (move, shift_hint) in _SHIFTS.items():
                if (feed, shift) == ("right", "right"):
                    continue
                if all(np.array_equal(g[0], move(p[0], _edge(a, s, rows, feed)))
                       for s, (g, p) in enumerate(zip(got, prev))):
                    named = "; and ".join(h for h in (feed_hint, shift_hint) if h)
                    break
            if named:
                break
        hints.append(named or "row k of the left edge gets a[s - k, k] at stream cycle s (0 "
                              "before and after the stream), and every activation moves one "
                              "column right per cycle")
    if not all(np.array_equal(g[1], t[1]) for g, t in zip(got, want)):
        named = ""
        for update, hint in _PSUMS.values():
            if all(np.array_equal(g[1], update(p[1], g[0], p[0], w))
                   for g, p in zip(got, prev)):
                named = hint
                break
        if named or act_ok:  # otherwise the sums are wrong because the activations are
            hints.append(named or "each cell's new partial sum is the sum the cell above "
                                  "held in the previous cycle (0 for row 0) plus its "
                                  "activation times its weight")
    return hints


@LAB.exercise(EX1, minutes=15, kind="write", hidden=lambda rng: _ex1_hidden(rng))
def check_ws_cycle(ws_cycle: Callable[..., Any], rows: int = 4, cols: int = 3,
                   shape: tuple[int, int, int] = (5, 3, 3), seed: int = 0) -> CheckResult:
    """Exercise 1: ``ws_cycle(w, act, psum, a, s)`` moves the registers of the
    weight-stationary array one cycle (stream cycle ``s``), graded step by step against
    the registers of ``systolic.simulate(..., trace=True)``."""
    refuse_course_code(EX1, ws_cycle, _answers.ws_cycle, systolic.simulate,
                       systolic.reference_matmul, engines.skewed_feed, engines.run_stationary,
                       batched.run_stationary)
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a, b = rng.integers(1, 10, (m, k)), rng.integers(1, 10, (k, n))
    w = np.zeros((rows, cols), np.int64)
    w[:k, :n] = b
    want = _trace_registers(a, b, rows, cols)
    zero = np.zeros((rows, cols), np.int64)
    prev = [(zero, zero), *want[:-1]]
    where = f"a {m}x{k} @ {k}x{n} product on a {rows}x{cols} array"
    got = [_step(ws_cycle, w, p[0], p[1], a, s) for s, p in enumerate(prev)]
    for s, ((ga, gp), (ta, tp)) in enumerate(zip(got, want)):
        if np.array_equal(ga, ta) and np.array_equal(gp, tp):
            continue
        answer = (f"at the end of stream cycle {s} ({where}) the simulator holds activations "
                  f"{ta.tolist()} and partial sums {tp.tolist()}")
        if np.array_equal(ga, tp) and np.array_equal(gp, ta):
            refuse(EX1, f"at stream cycle {s} your registers come back in the wrong order",
                   hint="return act, psum: the activations first", answer=answer)
        which = [name for name, g, t in (("activations", ga, ta), ("partial sums", gp, tp))
                 if not np.array_equal(g, t)]
        cells = np.argwhere((ga != ta) | (gp != tp))
        refuse(EX1, f"at stream cycle {s} of {where}, from the simulator's registers of the "
                    f"cycle before, your step returns {' and '.join(which)} that differ from "
                    f"the simulator's trace in {len(cells)} of {rows * cols} cells, the first "
                    f"at cell ({cells[0][0]}, {cells[0][1]})",
               hint="; ".join(_diagnose(got, want, a, w)), answer=answer)
    order = np.random.default_rng(seed + 1).permutation(len(prev))
    for s in order[:4]:
        again = _step(ws_cycle, w, *prev[s], a, int(s))
        if not (np.array_equal(again[0], got[s][0]) and np.array_equal(again[1], got[s][1])):
            refuse(EX1, f"called again for stream cycle {s} out of order, your step returns "
                        "other registers: it depends on something besides its arguments",
                   hint="compute the cycle from w, act, psum, a and s alone (no counter or "
                        "global state between calls)")
    cycles = rows + len(want)
    return ok(EX1, f"every activation and partial sum matches the simulator's trace in all "
                   f"{len(want)} stream cycles of {where}: the last result leaves the "
                   f"bottom-right cell at the end of cycle {cycles - 1}, so the run takes "
                   f"R + M + R + C - 2 = {cycles} cycles")


def _ex1_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """Other small arrays: tall and wide non-square ones, a batch shorter than the array
    on a square one, and tiles of b smaller than the array (padding)."""
    cases = []
    rows, cols = _non_square(rng, 2, 5)
    rows, cols = max(rows, cols), min(rows, cols)
    cases.append((f"a tall non-square {rows}x{cols} array",
                  {"rows": rows, "cols": cols, "seed": int(rng.integers(1 << 30)),
                   "shape": (int(rng.integers(rows, rows + 4)), rows, cols)}))
    rows, cols = _non_square(rng, 2, 6)
    rows, cols = min(rows, cols), max(rows, cols)
    cases.append((f"a wide non-square {rows}x{cols} array holding a smaller tile of b",
                  {"rows": rows, "cols": cols, "seed": int(rng.integers(1 << 30)),
                   "shape": (int(rng.integers(2, 7)), max(1, rows - 1), cols - 1)}))
    side = int(rng.integers(3, 6))
    cases.append((f"a batch shorter than a square {side}x{side} array",
                  {"rows": side, "cols": side, "seed": int(rng.integers(1 << 30)),
                   "shape": (int(rng.integers(1, side)), side, int(rng.integers(2, side + 1)))}))
    return cases


# -- Exercise 2 ------------------------------------------------------------------------


def _distinct(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """A matrix of distinct non-zero integers: any tile cut from it says where it was cut,
    and zeros can only be padding."""
    size = shape[0] * shape[1]
    values = np.concatenate([np.arange(-size, 0), np.arange(1, size + 1)])
    return rng.permutation(values)[:size].reshape(shape)


def _locate(whole: np.ndarray, tile: Any) -> tuple[int, int, int, int] | None:
    """``(r0, c0, h, w)`` when ``tile`` is ``whole[r0:r0+h, c0:c0+w]``, possibly padded with
    zeros at its bottom and right (an edge tile padded to the array's size); else None."""
    try:
        tile = np.asarray(tile)
        if tile.ndim != 2 or tile.size == 0:
            return None
        hits = np.argwhere(whole == tile[0, 0])
        if len(hits) != 1:
            return None
        r0, c0 = (int(v) for v in hits[0])
        h = min(tile.shape[0], whole.shape[0] - r0)
        w = min(tile.shape[1], whole.shape[1] - c0)
        if not np.array_equal(tile[:h, :w], whole[r0:r0 + h, c0:c0 + w]):
            return None
        if np.any(tile[h:]) or np.any(tile[:, w:]):
            return None
    except (TypeError, ValueError, IndexError):
        return None
    return r0, c0, h, w


def _span(start: int, size: int) -> str:
    return f"{start}:{start + size}"


class _Sim:
    """The ``sim`` handed to ``tiled_matmul``: ``systolic.simulate``, recording which
    products ``a[i, k] * b[k, n]`` each call multiplies and which output block its result
    belongs to. With ``mark`` it adds ``mark`` to every result, so the checker can tell
    whether the learner's output is assembled from the runs' results."""

    def __init__(self, a: np.ndarray, b: np.ndarray, rows: int, cols: int, tiling: str,
                 mark: int = 0) -> None:
        self.a, self.b, self.rows, self.cols = a, b, rows, cols
        self.tiling, self.mark = tiling, mark
        self.count = np.zeros((a.shape[0], a.shape[1], b.shape[1]), np.int32)
        self.blocks: list[tuple[int, int, int, int]] = []

    def _refuse(self, message: str, hint: str) -> None:
        refuse(EX2, message, hint=hint, answer=self.tiling)

    def __call__(self, x: Any, w: Any, *args: Any, **kwargs: Any) -> systolic.SystolicRun:
        rows, cols = self.rows, self.cols
        names = ("rows", "cols", "dataflow", "timing", "trace")
        given = dict(zip(names, args)) | kwargs
        r, c = given.get("rows", 4), given.get("cols", 4)  # simulate's defaults
        if (r, c) != (rows, cols):
            self._refuse(f"sim was called with rows={r}, cols={c}, but the array is "
                         f"rows={rows}, cols={cols}",
                         "pass the array's size on every call: sim(a_tile, b_tile, rows, cols)")
        if given.get("dataflow", "ws") != "ws":
            self._refuse(f"sim was called with dataflow={given['dataflow']!r}",
                         "this exercise tiles b onto the weight-stationary array: leave "
                         "dataflow at 'ws'")
        x, w = np.asarray(x), np.asarray(w)
        where = _locate(self.b, w)
        if where is None:
            flipped = _locate(self.b, w.T) if w.ndim == 2 else None
            if flipped is not None:
                k0, n0, h, wd = flipped
                self._refuse(f"the weight tile b[{_span(k0, h)}, {_span(n0, wd)}] went into "
                             "sim transposed",
                             "the weight tile for rows k and columns n is "
                             "b[k0:k0+rows, n0:n0+cols], not its transpose")
            if _locate(self.a, w) is not None and _locate(self.b, x) is not None:
                self._refuse("sim's arguments are in the wrong order: a tile of b came first",
                             "sim(a_tile, b_tile, rows, cols): the activations first, the "
                             "weights (a tile of b) second")
            self._refuse("sim's second argument (the weights) is not a tile cut from b",
                          "pass the tile itself, b[k0:k0+rows, n0:n0+cols] (zero padding at "
                          "the edge of b is fine)")
        k0, n0, kh, nw = where
        if w.shape[0] > rows or w.shape[1] > cols:
            shape = "x".join(map(str, w.shape))
            swapped = w.shape[0] <= cols and w.shape[1] <= rows
            self._refuse(f"a tile of b is {shape}, but the array is {rows}x{cols} (rows x cols): "
                         "it does not fit",
                         "you cut tiles of cols x rows: the array's rows hold b's rows (K) and "
                         "its columns b's columns (N), so a tile is b[k0:k0+rows, n0:n0+cols]"
                         if swapped else
                         "cut b into tiles of at most rows x cols: b[k0:k0+rows, n0:n0+cols]")
        got = _locate(self.a, x)
        if got is None:
            self._refuse("sim's first argument (the activations) is not a tile cut from a",
                         "pass a[:, k0:k0+rows], the columns of a that meet the rows of this "
                         "tile of b")
        i0, ka, mh, kw = got
        if (ka, kw) != (k0, kh):
            self._refuse(f"the tile of a (columns {_span(ka, kw)}) does not line up with the "
                         f"tile of b (rows {_span(k0, kh)})",
                         "a[:, k0:k0+rows] meets b[k0:k0+rows, n0:n0+cols]: the same k0 and "
                         "the same rows on both")
        self.count[i0:i0 + mh, k0:k0 + kh, n0:n0 + nw] += 1
        self.blocks.append((i0, mh, n0, nw))
        run = systolic.simulate(x, w, *args, **kwargs)
        if self.mark:
            run = dataclasses.replace(run, result=run.result + self.mark)
        return run


def _as_product(got: Any, m: int, k: int, n: int) -> np.ndarray:
    """The learner's return value as an M x N array, or a failure that says what it is."""
    if isinstance(got, systolic.SystolicRun):
        refuse(EX2, "you returned a SystolicRun, not the product matrix",
               hint="return the assembled output array; a run's product is run.result")
    if got is None:
        refuse(EX2, "your function returned None", hint="return the output array")
    try:
        got = np.asarray(got)
    except (TypeError, ValueError) as err:
        refuse(EX2, f"your result is not an array of numbers ({err})",
               hint="assemble one (M x N) array from the tiles' run.result")
    if got.dtype == object:
        refuse(EX2, "your result is not an array of numbers (a list of runs or tiles?)",
               hint="assemble one (M x N) array from the tiles' run.result")
    if got.shape != (m, n):
        hint = ("that is the shape of b.T @ a.T: a transposed result" if got.shape == (n, m)
                else "padding left in? slice the edge tiles back to their real size")
        refuse(EX2, f"result shape {got.shape}, but a ({m}x{k}) @ ({k}x{n}) product is {m}x{n}",
               hint=hint)
    return got


def _run_tiled(tiled_matmul: Callable[..., Any], a: np.ndarray, b: np.ndarray,
               sim: _Sim) -> Any:
    try:
        return tiled_matmul(a, b, sim.rows, sim.cols, sim)
    except TypeError as err:
        if any(word in str(err) for word in ("SystolicRun", "dtype('O')", "object")):
            refuse(EX2, f"your code raised TypeError: {str(err)[:200]}",
                   hint="sim(...) returns a SystolicRun (cycles, utilisation, ...); the "
                        "product itself is its .result")
        raise


@LAB.exercise(EX2, minutes=25, kind="write", hidden=lambda rng: _ex2_hidden(rng))
def check_tiled_matmul(tiled_matmul: Callable[..., Any], rows: int = 4, cols: int = 3,
                       shape: tuple[int, int, int] = (10, 13, 11), seed: int = 1) -> CheckResult:
    """Exercise 2: ``tiled_matmul(a, b, rows, cols, sim)`` must compute ``a @ b`` by calling
    ``sim`` (a stand-in for ``systolic.simulate``) on tiles of ``b`` that fit the array:
    every product through ``sim``, once, and the output assembled from the runs' results."""
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a, b = _distinct(rng, (m, k)), _distinct(rng, (k, n))
    kt, nt = math.ceil(k / rows), math.ceil(n / cols)
    tiling = (f"{kt} x {nt} = {kt * nt} tiles of b, b[k0:k0+{rows}, n0:n0+{cols}] for k0 in "
              f"range(0, {k}, {rows}) and n0 in range(0, {n}, {cols}); each one times "
              f"a[:, k0:k0+{rows}] on the array, its run.result added into out[:, n0:n0+{cols}]")
    sim = _Sim(a, b, rows, cols, tiling)
    got = _as_product(_run_tiled(tiled_matmul, a, b, sim), m, k, n)
    want = a @ b
    size = f"{m}x{k} @ {k}x{n} on a {rows}x{cols} array"
    if not sim.blocks:
        whole = course_code_used(tiled_matmul, [systolic.simulate, systolic.reference_matmul])
        refuse(EX2, "your function never called sim(...)",
               hint="call the sim you are given on each tile yourself: systolic's own "
                    "functions do the tiling for you, which is this exercise" if whole else
                    "multiply each tile on the array with the sim you are given, "
                    "sim(a_tile, b_tile, rows, cols); do not use a @ b", answer=tiling)
    missing, repeated = np.argwhere(sim.count == 0), np.argwhere(sim.count > 1)
    right = np.array_equal(got, want)
    if not right:
        kts = range(0, k, rows)
        last = a[:, kts[-1]:] @ b[kts[-1]:, :]
        first = a[:, :rows] @ b[:rows, :]
        if np.array_equal(got, last) or np.array_equal(got, first):
            refuse(EX2, "only one K tile's partial sums are in the result",
                   hint="the K tiles of one output block add up: out[...] += ..., not =",
                   answer=tiling)
    if len(missing):
        _, kk, nn = (int(v) for v in missing[0])
        k0, n0 = kk // rows * rows, nn // cols * cols
        done = 1 - len(missing) / sim.count.size
        start = ("your result is right, but not every product went through sim" if right
                 else "sim never multiplied part of the problem")
        refuse(EX2, f"{start}: it did {done:.0%} of the products, and never b[{kk}, {nn}] "
                    f"(in the tile b[{_span(k0, rows)}, {_span(n0, cols)}])",
               hint="every product goes through sim, tile by tile: loop over every (k-tile, "
                    "n-tile) of b, ceil(K/rows) x ceil(N/cols) of them; do not finish with "
                    "a @ b", answer=tiling)
    if len(repeated):
        _, kk, nn = (int(v) for v in repeated[0])
        refuse(EX2, f"sim multiplied some products more than once (b[{kk}, {nn}] among them)",
               hint="each (k-tile, n-tile) of b goes through sim once: do the loops step by "
                    "rows (over K) and by cols (over N)?", answer=tiling)
    if not right:
        i, j = (int(v) for v in np.argwhere(got != want)[0])
        refuse(EX2, f"{int(np.sum(got != want))} of {want.size} entries differ, the first at "
                    f"[{i},{j}]",
               hint="check where each tile's result goes in the output: rows of a, columns "
                    "n0:n0+cols", answer=f"(a @ b)[{i}, {j}] = {want[i, j]}, you have {got[i, j]}")
    marked = _Sim(a, b, rows, cols, tiling, mark=1)
    try:
        again = _as_product(_run_tiled(tiled_matmul, a, b, marked), m, k, n)
    except Exception as err:
        if isinstance(err, Verdict):
            raise
        refuse(EX2, f"your function raised {type(err).__name__} when the check ran it a second "
                    "time with sim's results marked (each one plus 1), to see that your output "
                    "is assembled from them", hint="do not compare sim's results with a @ b "
                    "inside your function: the check does that")
    expect = want.copy()
    for i0, mh, n0, nw in marked.blocks:
        expect[i0:i0 + mh, n0:n0 + nw] += 1
    if not np.array_equal(again, expect):
        whole = np.array_equal(again, want)
        refuse(EX2, "your result does not come from sim's runs: " + (
            "the runs' .result are not in it (the product was computed some other way)"
            if whole else "some output entries were not assembled from them"),
            hint="assemble the output from each tile's run.result, the product the array "
                 "computed; do not recompute it with a @ b", answer=tiling)
    need = kt * nt
    return ok(EX2, f"matches a @ b for {size}, every product done on the array by sim "
                   f"({len(sim.blocks)} tile runs; the fewest is {need})")


def _ex2_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """Other shapes on non-square arrays: wider than tall, taller than wide, and a
    product whose K and N are whole multiples of the array."""
    cases = []
    for kind in ("wide", "tall", "exact"):
        rows, cols = _non_square(rng)
        if (kind == "wide") == (rows > cols) and kind != "exact":
            rows, cols = cols, rows
        m = int(rng.integers(1, 9))
        if kind == "exact":
            k, n = rows * int(rng.integers(2, 4)), cols * int(rng.integers(2, 4))
        else:
            k = rows * int(rng.integers(1, 4)) + int(rng.integers(1, rows))
            n = cols * int(rng.integers(1, 4)) + int(rng.integers(1, cols))
        cases.append((f"a {m}x{k} @ {k}x{n} product on a non-square {rows}x{cols} array",
                      {"rows": rows, "cols": cols, "shape": (m, k, n),
                       "seed": int(rng.integers(1 << 30))}))
    return cases


# -- Exercise 3 ------------------------------------------------------------------------


def _pair(value: Any, side: int) -> tuple[float, float]:
    what = f"predicted_{side}"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        refuse(EX3, f"{what} should be a pair (cycles, utilisation), but it is "
                    f"{type(value).__name__}: {value!r:.60}",
               hint=f"predicted_{side} = (cycles, utilisation), e.g. (1000, 0.5)")
    cycles = as_number(EX3, value[0], f"the cycle count in {what}")
    util = as_number(EX3, value[1], f"the utilisation in {what}")
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


@LAB.exercise(EX3, minutes=15, kind="predict")
def check_gemm_prediction(predicted_128: Any, predicted_256: Any, finishes_first: Any,
                          shape: tuple[int, int, int] = GEMM, rel: float = 0.05) -> CheckResult:
    """Exercise 3: (cycles, utilisation) predicted for ``shape`` on a 128x128 and a 256x256
    weight-stationary array, and which finishes first, against ``systolic.simulate``.
    Cycles and utilisation pass within ``rel`` (5 %)."""
    m, k, n = shape
    runs = {side: _simulated(shape, side) for side in (128, 256)}
    answer = "; ".join(f"{s}x{s}: {r.cycles:,} cycles, utilisation {r.utilization:.3f}"
                       for s, r in runs.items())
    faster = min(runs, key=lambda s: runs[s].cycles)
    answer += f"; the {faster}x{faster} array finishes first"
    for side, value in ((128, predicted_128), (256, predicted_256)):
        cyc, util = _pair(value, side)
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
            refuse(EX3, f"your cycle count for the {side}x{side} array is "
                        f"{abs(cyc / run.cycles - 1):.0%} off the simulator's "
                        f"(tolerance {rel:.0%})", hint=hint, answer=answer)
        if util > 1 and util <= 100 and math.isclose(util / 100, run.utilization, rel_tol=rel):
            refuse(EX3, f"your utilisation for {side}x{side} looks like a percentage",
                   hint="give it as a fraction between 0 and 1", answer=answer)
        if not math.isclose(util, run.utilization, rel_tol=rel):
            padded = (m * math.ceil(k / side) * side * math.ceil(n / side) * side
                      / (side * side * run.cycles))
            hint = ("you counted the padded MACs as useful: only M*K*N are"
                    if math.isclose(util, padded, rel_tol=rel) else
                    "utilisation = M*K*N useful MACs / (cells * cycles)")
            refuse(EX3, f"your utilisation for the {side}x{side} array is off the "
                        f"simulator's by more than {rel:.0%}", hint=hint, answer=answer)
    side = _side(finishes_first)
    if side is None:
        refuse(EX3, f"finishes_first should name one array, 128 or 256; you gave "
                    f"{finishes_first!r:.40}", hint='finishes_first = "256x256" (or 128x128)')
    if side != faster:
        refuse(EX3, f"the {side}x{side} array does not finish first",
               hint="compare your two cycle counts", answer=answer)
    slow = 384 - faster
    return ok(EX3, f"{answer}. Your predictions are within {rel:.0%} of the simulator: the "
                   f"bigger array wins on time ({runs[slow].cycles / runs[faster].cycles:.2f}x "
                   "fewer cycles with 4x the cells) and loses on utilisation")


# -- Exercise 4 ------------------------------------------------------------------------

#: Exercise 4's cases (K, N, rows, cols): many folds, one fold, a v6e-sized array, a layer
#: whose padding alone wastes more than 10 %, and a non-square array.
BATCH_CASES = ((1024, 1024, 128, 128), (128, 128, 128, 128), (4096, 4096, 256, 256),
               (100, 1024, 128, 128), (1000, 2048, 128, 256))


def _smallest(util: Callable[[int], float], target: float = 0.9) -> int | None:
    """The smallest M with ``util(M) >= target`` for a utilisation that grows with M."""
    hi = 1
    while util(hi) < target:
        hi *= 2
        if hi > 1 << 30:
            return None
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if util(mid) >= target else (mid + 1, hi)
    return lo


def _batch_mistake(number: float, K: int, N: int, r: int, c: int, want: int) -> str:
    """A hint naming the mistake that gives ``number`` for this layer."""
    kp, np_ = math.ceil(K / r) * r, math.ceil(N / c) * c
    folds = (kp // r) * (np_ // c)

    def cycles(m: int, R: int = r, C: int = c) -> int:
        return R + (folds - 1) * max(m, R) + m + R + C - 2

    if r != c and number == _answers.smallest_batch(K, N, c, r):
        return ("you swapped rows and cols: the array's rows hold K (and the weight load "
                "takes R cycles, folds are max(M, R) apart), its columns hold N")
    if number == _smallest(lambda m: systolic.utilization(m, K, N, r, c, "ws", "scalesim")):
        return ("that is the batch with SCALE-Sim's serial folds; with timing='tpu' only the "
                "first weight load is exposed and folds follow each other max(M, R) apart")
    if number == _smallest(lambda m: m * kp * np_ / (r * c * cycles(m))):
        return ("you counted the padding's MACs as useful: only M*K*N are; the padded rows "
                "and columns of the last tiles are idle cells")
    if number == r:
        return ("M = rows hides each fold's weight load behind the stream, but the fill and "
                "drain of the pipeline (R + C - 2 cycles) and the first load still cost: "
                "count them")
    if abs(number - want) == 1:
        return "off by one: the smallest M with utilisation >= 0.9"
    return ("write the utilisation as a function of M with systolic's cycle model "
            "(careful: max(M, R) between folds), and solve for >= 0.9")


@LAB.exercise(EX4, minutes=15, kind="apply", hidden=lambda rng: _ex4_hidden(rng))
def check_smallest_batch(smallest_batch: Callable[..., Any],
                         cases: tuple[tuple[int, int, int, int], ...] = BATCH_CASES,
                         time_limit_s: float = 20.0) -> CheckResult:
    """Exercise 4: ``smallest_batch(K, N, rows, cols)`` is the smallest batch M for which a
    K x N weight matrix keeps the array at least 90 % busy, or None if no M does."""
    refuse_course_code(EX4, smallest_batch, _answers.smallest_batch, *_CYCLE_HELPERS)
    for case in cases:
        K, N, r, c = case
        want = _answers.smallest_batch(K, N, r, c)
        where = f"K={K}, N={N} on a {r}x{c} array"
        try:
            with _time_limit(time_limit_s):
                got = smallest_batch(K, N, r, c)
        except TimeoutError:
            refuse(EX4, f"for {where} your function ran for more than {time_limit_s:g} s",
                   hint="can every layer reach 90 %? Padding K or N up to the array size is "
                        "waste that no batch size removes: return None then")
        answer = f"{where}: {want}"
        if want is None:
            if got is None:
                continue
            refuse(EX4, f"for {where} you returned {got!r:.40}, but no batch gets there",
                   hint="K and N are padded to multiples of the array size: what is the "
                        "utilisation with an endless batch?", answer=answer)
        if got is None:
            refuse(EX4, f"for {where} you returned None, but some batch does reach 90 %",
                   hint="utilisation grows with M; look further", answer=answer)
        number = as_number(EX4, got, f"the batch for {where}")
        if number == want:
            continue
        util = systolic.utilization(max(1, int(number)), K, N, r, c)
        if number < want:
            msg = (f"for {where}, M={number:g} keeps the array only {util:.1%} busy "
                   "(simulate it to see)")
        else:
            msg = f"for {where} a smaller batch than {number:g} already reaches 90 %"
        refuse(EX4, msg, hint=_batch_mistake(number, K, N, r, c, want), answer=answer)
    answers = ", ".join(f"{_answers.smallest_batch(*cs)}" for cs in cases)
    return ok(EX4, f"right for all {len(cases)} layers (batches {answers}): one fold needs a "
                   "batch in the thousands to hide the pipeline's fill, many folds need about "
                   "the array's height, and padding can waste more than any batch recovers")


def _ex4_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """Other layers on other arrays: many folds and one fold on non-square arrays, and a
    layer whose K is padded a lot."""
    arrays = ((128, 256), (256, 128), (64, 128), (128, 64))
    cases = []
    r, c = arrays[int(rng.integers(len(arrays)))]
    K = int(rng.integers(6, 20)) * r - int(rng.integers(0, max(2, r // 32)))
    N = int(rng.integers(6, 20)) * c
    cases.append((f"a layer with many folds, K={K}, N={N}, on a non-square {r}x{c} array",
                  {"cases": ((K, N, r, c),)}))
    r, c = arrays[int(rng.integers(len(arrays)))]
    K, N = r - int(rng.integers(0, r // 32 + 1)), c - int(rng.integers(0, c // 32 + 1))
    cases.append((f"a one-fold layer, K={K}, N={N}, on a non-square {r}x{c} array",
                  {"cases": ((K, N, r, c),)}))
    r, c = arrays[int(rng.integers(len(arrays)))]
    K, N = int(rng.integers(2, 6)) * r + r // 4, int(rng.integers(2, 6)) * c
    cases.append((f"a layer K={K}, N={N} on a non-square {r}x{c} array",
                  {"cases": ((K, N, r, c),)}))
    return cases


# -- Exercise 5 ------------------------------------------------------------------------

#: Exercise 5's shapes (M, K, N, rows, cols): each dataflow wins on a non-square array,
#: where it matters which dimension lies along the rows, and on a square one.
DATAFLOW_CASES = ((384, 640, 192, 256, 128), (96, 640, 192, 128, 256),
                  (1536, 16, 384, 256, 128), (96, 1000, 700, 128, 128),
                  (16, 1024, 1024, 128, 128), (64, 200, 1024, 128, 256))
_DATAFLOW_WORDS = {"weight": "ws", "input": "is", "output": "os"}

#: What each dataflow lays along the array's rows and columns and streams (the chapter's
#: table), and the mistaken readings of it the hints name.
_LAYOUT = {"ws": ("K", "N", "M"), "is": ("K", "M", "N"), "os": ("M", "N", "K")}
_DATAFLOW_MISTAKES: tuple[tuple[dict[str, Any], str], ...] = (
    ({"swap": ("is",)}, ("input-stationary keeps a transposed in the cells: K along the "
                         "rows, M along the columns, N streams; on a non-square array the "
                         "side M sits on changes the folds")),
    ({"swap": ("ws",)}, ("weight-stationary keeps b as it is: K along the rows, N along "
                         "the columns, M streams")),
    ({"swap": ("os",)}, ("output-stationary keeps c in the cells: M along the rows, N "
                         "along the columns, K streams")),
    ({"swap": ("ws", "is", "os")}, ("every dataflow's two held dimensions are on the wrong "
                                    "sides: the first of the table's pair lies along the "
                                    "rows (ws: K; is: K; os: M), the second along the "
                                    "columns")),
    ({"exchange": True}, ("rows and cols are swapped: rows is the array's height (what the "
                          "row dimension is cut by, and the R in the load, in max(T, R) and "
                          "in the drain), cols its width")),
    ({"timing": "scalesim"}, ("that is the winner with SCALE-Sim's serial folds; with "
                              "timing='tpu' only the first load is exposed and folds follow "
                              "each other max(T, R) apart")),
    ({"drain": False}, ("'os' needs R more cycles at the end, to shift the results out of "
                        "the bottom edge")),
)


def _model_cycles(M: int, K: int, N: int, R: int, C: int, swap: tuple[str, ...] = (),
                  timing: str = "tpu", drain: bool = True,
                  exchange: bool = False) -> dict[str, int]:
    """Cycles of each dataflow by the chapter's model, read right or in one of the
    mistaken ways (``swap``: the row and column dimensions of those dataflows swapped;
    ``exchange``: the array's rows and cols swapped)."""
    ext = {"M": M, "K": K, "N": N}
    R, C = (C, R) if exchange else (R, C)
    out = {}
    for d, (rd, cd, t) in _LAYOUT.items():
        rd, cd = (cd, rd) if d in swap else (rd, cd)
        folds = math.ceil(ext[rd] / R) * math.ceil(ext[cd] / C)
        load = 0 if d == "os" else R
        T = ext[t]
        if timing == "scalesim":
            out[d] = folds * (load + T + R + C - 2) - 1
        else:
            out[d] = load + (folds - 1) * max(T, R) + T + R + C - 2 + (
                R if d == "os" and drain else 0)
    return out


def _dataflow_hint(chosen: list[tuple[tuple[int, int, int, int, int], str]]) -> str:
    """The mistake that explains every choice the learner made (``(case, dataflow)``)."""
    for kwargs, hint in _DATAFLOW_MISTAKES:
        if all(key in _best(_model_cycles(*case, **kwargs)) for case, key in chosen):
            return hint
    return ("for each dataflow: which of M, K, N sit on the rows and columns (folds), and "
            "which one streams (T)? cycles = P + (F-1) max(T, R) + T + R + C - 2 (+ R to "
            "drain for 'os')")


@LAB.exercise(EX5, minutes=15, kind="apply", hidden=lambda rng: _ex5_hidden(rng))
def check_best_dataflow(best_dataflow: Callable[..., Any],
                        cases: tuple[tuple[int, int, int, int, int], ...] = DATAFLOW_CASES
                        ) -> CheckResult:
    """Exercise 5: ``best_dataflow(M, K, N, rows, cols)`` returns the dataflow ('ws', 'is'
    or 'os') with the fewest cycles (``timing="tpu"``); on a tie any of the tied ones.
    Derived from the cycle model, not by running ``systolic``."""
    refuse_course_code(EX5, best_dataflow, _answers.best_dataflows, _answers.dataflow_cycles,
                       *_CYCLE_HELPERS, systolic.fold_count, systolic.simulate)
    chosen = []
    for case in cases:
        got = best_dataflow(*case)
        key = str(got).strip().lower() if isinstance(got, str) else None
        if key is not None and key not in systolic.DATAFLOWS:
            key = next((v for w, v in _DATAFLOW_WORDS.items() if w in key), None)
        if key is None:
            m, k, n, r, c = case
            refuse(EX5, f"for M={m}, K={k}, N={n} on {r}x{c} you returned {got!r:.40}, not a "
                        "dataflow", hint="return one of the strings 'ws', 'is', 'os'")
        chosen.append((case, key))
    for (m, k, n, r, c), key in chosen:
        if key in _answers.best_dataflows(m, k, n, r, c):
            continue
        counts = _answers.dataflow_cycles(m, k, n, r, c)
        where = f"M={m}, K={k}, N={n} on {r}x{c}"
        refuse(EX5, f"for {where}, {key!r} takes {counts[key] / min(counts.values()) - 1:.0%} "
                    "more cycles than the best dataflow", hint=_dataflow_hint(chosen),
               answer=f"{where}: " + ", ".join(f"{d} {v:,}" for d, v in counts.items()))
    return ok(EX5, f"the fastest dataflow on all {len(cases)} shapes: the dimension that "
                   "streams should be the long one, and the stationary ones should fill the "
                   "array, along the side that fits them")


def _ex5_hidden(rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """Other shapes on non-square arrays, each with one clear winner that a mistaken
    reading of the dataflow table gets wrong: the first one input-stationary with M on the
    wrong side, the others a different winner each where possible."""
    arrays = ((128, 256), (256, 128), (64, 128), (128, 64))
    cases: list[tuple[int, int, int, int, int]] = []
    spare: list[tuple[int, int, int, int, int]] = []
    for _ in range(2000):
        r, c = arrays[int(rng.integers(len(arrays)))]
        case = (*(int(v) for v in rng.integers(8, 2049, 3)), r, c)
        winners = _answers.best_dataflows(*case)
        if len(winners) != 1:
            continue
        fools = [winners[0] not in _best(_model_cycles(*case, **kw))
                 for kw, _ in _DATAFLOW_MISTAKES[:5]]
        if not cases:
            if fools[0]:  # input-stationary with M along the rows picks another one
                cases.append(case)
        elif any(fools) and winners[0] not in {_answers.best_dataflows(*x)[0] for x in cases}:
            cases.append(case)
        elif any(fools) and len(spare) < 2:
            spare.append(case)
        if len(cases) == 3:
            break
    cases = [*cases, *spare][:3]
    return [(f"M={m}, K={k}, N={n} on a non-square {r}x{c} array", {"cases": ((m, k, n, r, c),)})
            for m, k, n, r, c in cases]


def _best(counts: dict[str, int]) -> list[str]:
    return [d for d, v in counts.items() if v == min(counts.values())]


# -- Exercise 6 ------------------------------------------------------------------------


@LAB.exercise(EX6, minutes=10, kind="predict")
def check_stall(predicted_stall: Any, term: float = STALL_TERM, rel: float = 0.05) -> CheckResult:
    """Exercise 6: where a bf16 running sum of ``term`` stops growing (within ``rel``)."""
    got = as_number(EX6, predicted_stall, "your predicted stall value")
    want = _answers.stall(term)
    answer = f"a bf16 running sum of {term} stops at {want:g}"
    if math.isclose(got, want, rel_tol=rel):
        return ok(EX6, f"{answer}: at {want:g} the gap between bf16 numbers is "
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
    return fail(EX6, "that is not where the sum stops", hint=hint, answer=answer)


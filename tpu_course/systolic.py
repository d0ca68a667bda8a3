"""A cycle-level systolic-array simulator, its closed-form cycle count, and a traffic model.

``simulate(a, b, rows, cols, dataflow, timing)`` multiplies ``a`` (M x K) by ``b`` (K x N)
on a ``rows x cols`` grid of multiply-accumulate (MAC) cells. It really moves values: each
cycle every operand register passes its value to the neighbouring cell, every cell does
one multiply-accumulate, and results leave at the array's edge. The whole grid is updated
with a few numpy operations per cycle (never a Python loop over cells). The cycle count it
observes is checked against :func:`cycle_count`, a closed form derived independently.

With ``trace=False`` (the default) the weight-stationary engine advances a whole batch of
folds per numpy step: every register array gets a leading fold axis, each fold runs on
its own timeline, and the controller then places the folds on one clock from the times
it observed (when weights latched, when vectors entered, when tagged results left). The
values and the cycle count are the same as cycle by cycle on one array, which
``trace=True`` still does (for animations of small arrays), and a test holds the two
engines equal.

Notation (fixed for the module and chapter 1)
---------------------------------------------
``R`` = ``rows``, ``C`` = ``cols``; ``F`` = number of folds (tiles of the problem that the
array handles one after another); ``T`` = vectors streamed per fold.

=========  ===================================  ===========  ==========  ======  ======
dataflow   what stays in the cells              rows hold    cols hold   T       folds
=========  ===================================  ===========  ==========  ======  ======
``"ws"``   weights ``b`` (the TPU MXU)          K            N           M       ceil(K/R) ceil(N/C)
``"is"``   inputs ``a`` (transposed)            K            M           N       ceil(K/R) ceil(M/C)
``"os"``   outputs ``c`` (accumulators)         M            N           K       ceil(M/R) ceil(N/C)
=========  ===================================  ===========  ==========  ======  ======

Folds are ordered as SCALE-Sim orders them: the column tile outer, the row tile inner (so
for ``"ws"`` the K tiles of one N tile follow each other and their partial sums can be
accumulated).

The cycle model
---------------
* A **cycle** is one clock period. In it every cell reads the registers its neighbours
  wrote at the end of the previous cycle, does at most one MAC, and writes its own
  registers at the end of the cycle. Cycles are numbered from 0; ``cycles`` is how many
  there are, up to and including the one in which the last result leaves the array.
* **Weight-stationary** (``"ws"``; ``"is"`` is the same machine with ``a`` transposed in
  the cells and ``b`` streaming). Stationary values travel down a separate load path in
  each column, one row per cycle, column ``j`` starting ``j`` cycles after column 0; after
  ``R`` cycles a column latches them into its cells' *shadow* registers. When the first
  activation of a fold reaches a cell, the cell swaps the shadow into its *active*
  register. Activation ``x[i, k]`` of the fold that starts streaming at cycle ``s`` enters
  row ``k`` at the left edge at cycle ``s + i + k`` (the edge buffer skews row ``k`` by
  ``k`` cycles) and moves one cell right per cycle, so it is in cell ``(k, j)`` at cycle
  ``s + i + k + j``. Partial sums move down one row per cycle; result ``(i, j)`` leaves the
  bottom of column ``j`` at the end of cycle ``s + i + (R - 1) + j``. A fold streaming
  ``T`` vectors therefore takes ``T + R + C - 2`` cycles from its first vector to its
  last result.
* **Output-stationary** (``"os"``): ``a[i, k]`` enters row ``i`` at cycle ``s + k + i``
  and moves right, ``b[k, j]`` enters column ``j`` at ``s + k + j`` and moves down; they
  meet in cell ``(i, j)`` at ``s + i + j + k``, which accumulates in place. Cell
  ``(i, j)`` finishes at ``s + K - 1 + i + j`` and copies its result to an output
  register.

Two timing conventions (``timing=``):

``"scalesim"``
    SCALE-Sim 3.0.0's conventions with ideal memory (no stalls). Folds do not overlap:
    a ``"ws"``/``"is"`` fold loads its ``R`` rows of weights (``R`` exposed cycles, even
    when the tile uses fewer rows), streams, and drains completely before the next fold
    loads. An ``"os"`` fold charges no cycles to move finished outputs out (they are read
    from the output registers the cycle they finish). Every fold's partial sums leave the
    array and are added in the output buffer. SCALE-Sim reports the number of the last
    cycle (counting from 0), one less than the number of cycles; ``cycles`` reproduces
    its 'Total Cycles' exactly and ``count_offset`` is ``-1``.
``"tpu"`` (default)
    What an MXU does better. Weights are double-buffered: the next fold's weights start
    down the load path when the current fold starts streaming, so only the first fold's
    load is exposed, and the next fold streams right behind the current one (no bubble
    when ``T >= R``; otherwise the load of ``R`` cycles sets the pace). Partial sums of
    the K tiles accumulate in accumulators at the bottom of each column, so only final
    outputs are written out. ``"os"`` double-buffers its output registers; a column's
    finished results shift down and out of the bottom edge (``R`` cycles), which the next
    fold's computation hides except after the last fold.

The closed forms these rules give are derived in :func:`cycle_count`.

>>> import numpy as np
>>> a = np.arange(12).reshape(3, 4); b = np.arange(8).reshape(4, 2)
>>> run = simulate(a, b, rows=4, cols=2)
>>> bool((run.result == a @ b).all()), run.cycles, cycle_count(3, 4, 2, 4, 2)
(True, 11, 11)
>>> simulate(a, b, rows=4, cols=2, timing="scalesim").cycles
10
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any, Sequence

import numpy as np

from tpu_course import errors

DATAFLOWS = ("ws", "os", "is")
TIMINGS = ("tpu", "scalesim")
_DATAFLOW_NAMES = {"ws": "weight-stationary", "os": "output-stationary", "is": "input-stationary"}


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fold:
    """One tile of the problem on the array, with its traffic and when it ran.

    ``row_block``/``col_block`` index the tile along the array's rows and columns (for
    ``"ws"``: K tile and N tile). ``rows_used``/``cols_used`` are the cells the tile
    fills (the rest hold padding). Traffic is counted in values (not bytes):
    ``stationary_in`` enter the cells before the stream (weights, or inputs for
    ``"is"``; 0 for ``"os"``), ``streamed_in`` enter at the left (and, for ``"os"``,
    top) edge, ``results_out`` leave the array for the output buffer.
    """

    index: int
    row_block: int
    col_block: int
    rows_used: int
    cols_used: int
    stationary_in: int
    streamed_in: int
    results_out: int
    stream_start_cycle: int
    a_in: int = 0  # values of ``a`` among the above (SCALE-Sim's 'ifmap' reads)
    b_in: int = 0  # values of ``b`` among the above (SCALE-Sim's 'filter' reads)


@dataclasses.dataclass(frozen=True)
class Frame:
    """What the array holds at the end of one cycle (``trace=True``).

    Arrays are ``rows x cols``; ``nan`` marks an empty register. ``held`` is the
    stationary operand (``"ws"``: weights; ``"is"``: inputs; ``"os"``: the
    accumulators; for ``"ws"``/``"is"`` a cell shows its latched shadow weight until the
    fold's first activation reaches it and swaps it in, and ``nan`` before its column has
    latched any weight: not yet loaded, which is not the same as a weight of 0),
    ``horizontal`` the operands moving right, ``vertical`` what moves down
    (partial sums for ``"ws"``/``"is"``, ``b`` for ``"os"``), ``output`` the M x N result
    as written so far.
    """

    cycle: int
    phase: str
    held: np.ndarray
    horizontal: np.ndarray
    vertical: np.ndarray
    output: np.ndarray
    note: str = ""


@dataclasses.dataclass(frozen=True)
class SystolicRun:
    """What :func:`simulate` observed. Cycles are counts of clock cycles; traffic in values.

    ``cycles == preload_cycles + fill_cycles + steady_cycles + drain_cycles + count_offset``.
    The phases are measured per stream segment (each fold for ``"scalesim"``, the whole
    run for ``"tpu"``): *preload* = exposed cycles loading stationary values before the
    stream; *fill* = from the first streamed vector until the first result leaves;
    *steady* = from then until the last operand enters; *drain* = after that until the
    last result leaves. ``stall_cycles`` counts steady cycles in which no vector entered
    (``"tpu"`` with ``T < R``).
    """

    result: np.ndarray
    shape: tuple[int, int, int]  # (M, K, N)
    rows: int
    cols: int
    dataflow: str
    timing: str
    cycles: int
    preload_cycles: int
    fill_cycles: int
    steady_cycles: int
    drain_cycles: int
    stall_cycles: int
    count_offset: int
    folds: int
    fold_grid: tuple[int, int]  # (row tiles, column tiles)
    fold_order: str
    fold_stats: tuple[Fold, ...]
    useful_macs: int
    macs_per_cycle: np.ndarray  # useful MACs done in each cycle (length = cycles simulated)
    stationary_reads: int
    streamed_reads: int
    result_writes: int
    trace: tuple[Frame, ...] | None = None

    @property
    def utilization(self) -> float:
        """Useful MACs / (cells x cycles): the fraction of the array's MAC slots used.

        (SCALE-Sim reports 0 cycles for a 1x1x1 output-stationary product on a 1x1
        array; the count is then taken as 1.)
        """
        return self.useful_macs / (self.rows * self.cols * max(self.cycles, 1))

    @property
    def mapping_efficiency(self) -> float:
        """Used cells / all cells, averaged over folds (SCALE-Sim's 'Mapping Efficiency')."""
        cells = self.rows * self.cols
        return sum(f.rows_used * f.cols_used for f in self.fold_stats) / (cells * self.folds)

    @property
    def padding_waste(self) -> float:
        """Fraction of the cells' stream slots spent on padding (1 - mapping efficiency)."""
        return 1.0 - self.mapping_efficiency

    @property
    def peak_utilization(self) -> float:
        """The busiest cycle's useful MACs / cells: 1.0 only when a full, unpadded tile
        fills the whole pipeline."""
        return float(self.macs_per_cycle.max()) / (self.rows * self.cols)

    @property
    def operand_reads(self) -> int:
        """Values that entered the array from its edge buffers (stationary + streamed)."""
        return self.stationary_reads + self.streamed_reads

    def summary(self) -> str:
        """A few lines: the machine, the cycles and their parts, utilisation, traffic."""
        m, k, n = self.shape
        return "\n".join([
            f"{self.rows}x{self.cols} {_DATAFLOW_NAMES[self.dataflow]} array, "
            f"timing={self.timing!r}: ({m}x{k}) @ ({k}x{n}) in {self.folds} fold(s) "
            f"({self.fold_grid[0]} x {self.fold_grid[1]}, {self.fold_order})",
            f"cycles {self.cycles:,} = preload {self.preload_cycles:,} + fill "
            f"{self.fill_cycles:,} + steady {self.steady_cycles:,} + drain "
            f"{self.drain_cycles:,}" + (f" {self.count_offset:+d}" if self.count_offset else ""),
            f"utilisation {self.utilization:.1%} (mapping efficiency "
            f"{self.mapping_efficiency:.1%}, padding waste {self.padding_waste:.1%})",
            f"traffic: {self.stationary_reads:,} stationary + {self.streamed_reads:,} "
            f"streamed values in, {self.result_writes:,} results out",
        ])

    def __repr__(self) -> str:
        m, k, n = self.shape
        return (f"SystolicRun({self.dataflow}, {self.timing}, {self.rows}x{self.cols}, "
                f"M={m} K={k} N={n}: cycles={self.cycles}, folds={self.folds}, "
                f"utilization={self.utilization:.3f})")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(line)}</td></tr>" for line in self.summary().split("\n"))
        return f"<table>{rows}</table>"


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------


def _positive_int_error(v: Any) -> type[errors.CourseError]:
    """The error class for a value that is not a positive integer: type or value."""
    wrong_type = isinstance(v, bool) or not isinstance(v, (int, np.integer))
    return errors.CourseTypeError if wrong_type else errors.CourseValueError


def _check_sizes(**sizes: Any) -> None:
    """The matmul's extents M, K, N: positive integers."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise _positive_int_error(v)(f"{name} must be a positive integer, got {v!r}")


def _check_array_size(rows: Any, cols: Any) -> None:
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise _positive_int_error(v)(
                f"{name} must be a positive integer (the array's {name}), got {v!r}; "
                "for example rows=4, cols=4 for a toy array or 128, 128 for a TPU v5e MXU"
            )


def _check_dataflow(dataflow: Any, timing: Any) -> None:
    if dataflow not in DATAFLOWS:
        raise errors.CourseValueError(
            f"unknown dataflow {dataflow!r}; expected one of {DATAFLOWS}: 'ws' "
            "(weight-stationary, the TPU MXU), 'os' (output-stationary) or 'is' "
            "(input-stationary)"
        )
    if timing not in TIMINGS:
        raise errors.CourseValueError(
            f"unknown timing {timing!r}; expected 'tpu' (double-buffered weights, "
            "in-place accumulation) or 'scalesim' (SCALE-Sim 3.0.0's conventions)"
        )


def _check_operands(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(a)
    b = np.asarray(b)
    for name, x in (("a", a), ("b", b)):
        if x.ndim != 2:
            raise errors.CourseValueError(
                f"{name} must be a 2-D matrix, got an array of shape {x.shape} "
                f"({x.ndim}-D); reshape it (e.g. x.reshape(1, -1) for a vector) or "
                "multiply batches one matrix at a time"
            )
        if x.size == 0:
            raise errors.CourseValueError(f"{name} is empty (shape {x.shape}); every dimension must be >= 1")
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise errors.CourseValueError(f"{name} must hold numbers, got dtype {x.dtype}")
    if a.shape[1] != b.shape[0]:
        raise errors.CourseValueError(
            f"inner dimensions do not match: a is {a.shape[0]}x{a.shape[1]} and b is "
            f"{b.shape[0]}x{b.shape[1]}; a @ b needs a.shape[1] == b.shape[0] "
            f"(got {a.shape[1]} and {b.shape[0]}). Did you mean b.T?"
        )
    return a, b


def _acc_dtype(a: np.ndarray, b: np.ndarray) -> np.dtype:
    """Integers accumulate in int64 (bit-exact); floats in their common float type."""
    dt = np.result_type(a.dtype, b.dtype)
    if dt == np.bool_ or np.issubdtype(dt, np.integer):
        return np.dtype(np.int64)
    if np.issubdtype(dt, np.complexfloating):
        return dt
    if dt.itemsize < 4:  # float16 and friends: accumulate in float32, as an MXU does
        return np.dtype(np.float32)
    return dt


def _dims(dataflow: str, m: int, k: int, n: int) -> tuple[int, int, int]:
    """(extent mapped to array rows, extent mapped to array cols, vectors per fold T)."""
    return {"ws": (k, n, m), "is": (k, m, n), "os": (m, n, k)}[dataflow]


# --------------------------------------------------------------------------------------
# The closed form
# --------------------------------------------------------------------------------------


def fold_count(M: int, K: int, N: int, rows: int, cols: int, dataflow: str = "ws") -> int:
    """How many tiles (folds) of a ``rows x cols`` array an M x K x N matmul needs.

    >>> fold_count(100, 100, 100, 128, 128), fold_count(512, 512, 512, 128, 128)
    (1, 16)
    """
    _check_dataflow(dataflow, "tpu")
    _check_array_size(rows, cols)
    _check_sizes(M=M, K=K, N=N)
    d_r, d_c, _ = _dims(dataflow, M, K, N)
    return math.ceil(d_r / rows) * math.ceil(d_c / cols)


def cycle_count(M: int, K: int, N: int, rows: int, cols: int, dataflow: str = "ws",
                timing: str = "tpu") -> int:
    """Closed-form cycle count of ``simulate`` for C[M x N] = A[M x K] @ B[K x N].

    Derivation (``R`` rows, ``C`` cols, ``F`` folds, ``T`` vectors per fold; see the
    module docstring for the table mapping M, K, N to them).

    *One fold's stream.* The vector that enters first reaches cell ``(k, j)`` ``k + j``
    cycles after the stream starts (the edge skew plus one hop per column). Vector ``i``
    enters ``i`` cycles after the first, so the last one, ``i = T - 1``, reaches the
    bottom-right cell ``(R - 1, C - 1)`` at ``T - 1 + R - 1 + C - 1``; its result leaves
    at the end of that cycle. Counting from 0, the stream occupies
    ``T + R + C - 2`` cycles. For ``"os"`` the same holds with ``T = K``: the last
    operands meet in the corner cell ``K - 1 + R - 1 + C - 1`` cycles after the start.

    *Weight load.* ``R`` cycles: the load path shifts one row per cycle, and column 0 is
    latched after ``R`` shifts, just before the first activation reaches it.

    ``"scalesim"``: folds run one after another, each ``P + T + R + C - 2`` cycles with
    ``P = R`` (load) for ``"ws"``/``"is"`` and ``P = 0`` for ``"os"``; SCALE-Sim reports
    the last cycle's number, one less than the count::

        cycles = F * (P + T + R + C - 2) - 1

    ``"tpu"``: the next fold starts streaming ``max(T, R)`` cycles after the current one
    (its ``T`` vectors must have entered, and its successor's weights, started down the
    load path when it began, need ``R`` cycles). Only the first load is exposed, and the
    last fold's stream ends as above; ``"os"`` needs ``R`` more cycles at the end to
    shift the last results out of the bottom edge (``D = R``, else ``D = 0``)::

        cycles = P + (F - 1) * max(T, R) + T + R + C - 2 + D

    >>> cycle_count(4, 4, 4, 4, 4)   # one fold: 4 load + 4 vectors + 4 + 4 - 2 skew
    14
    >>> cycle_count(512, 512, 512, 128, 128, "ws", "scalesim")
    14303
    >>> cycle_count(512, 512, 512, 128, 128, "ws", "tpu")
    8574
    """
    _check_dataflow(dataflow, timing)
    _check_array_size(rows, cols)
    _check_sizes(M=M, K=K, N=N)
    r, c = int(rows), int(cols)
    f = fold_count(M, K, N, r, c, dataflow)
    t = _dims(dataflow, M, K, N)[2]
    preload = 0 if dataflow == "os" else r
    stream = t + r + c - 2
    if timing == "scalesim":
        return f * (preload + stream) - 1
    drain_out = r if dataflow == "os" else 0
    return preload + (f - 1) * max(t, r) + stream + drain_out


def utilization(M: int, K: int, N: int, rows: int, cols: int, dataflow: str = "ws",
                timing: str = "tpu") -> float:
    """Closed-form utilisation: ``M*K*N / (rows * cols * cycle_count(...))``.

    >>> round(utilization(100, 100, 100, 128, 128), 3), round(utilization(10_000, 10_000, 10_000, 128, 128), 3)
    (0.127, 0.978)
    """
    cycles = cycle_count(M, K, N, rows, cols, dataflow, timing)  # checks every argument
    return M * K * N / (rows * cols * max(1, cycles))


# --------------------------------------------------------------------------------------
# The simulator
# --------------------------------------------------------------------------------------


def simulate(a: Any, b: Any, rows: int = 4, cols: int = 4, dataflow: str = "ws",
             timing: str = "tpu", trace: bool = False) -> SystolicRun:
    """Multiply ``a`` (M x K) by ``b`` (K x N) on a ``rows x cols`` systolic array.

    Values move cell to cell each cycle (see the module docstring for the exact cycle
    model and the two timing conventions). Integer inputs are multiplied and accumulated
    in int64 (bit-exact); floats in their own precision (float16 in float32), in the order
    :func:`reference_matmul` reproduces.

    Args:
        a, b: 2-D arrays with ``a.shape[1] == b.shape[0]``.
        rows, cols: the array's size (128, 128 for a v2-v5p MXU; 256, 256 for v6e).
        dataflow: ``"ws"`` (weight-stationary, the TPU), ``"os"`` or ``"is"``.
        timing: ``"tpu"`` or ``"scalesim"`` (SCALE-Sim 3.0.0, ideal memory).
        trace: record a :class:`Frame` per cycle (for small arrays: the animation).
            ``"ws"``/``"is"`` then run one array cycle by cycle instead of a batch of
            folds per numpy step (same values and cycles, much slower on big problems).

    Returns:
        A :class:`SystolicRun` with the result, cycles and their parts, folds,
        utilisation and traffic.
    """
    a, b = _check_operands(a, b)
    _check_array_size(rows, cols)
    _check_dataflow(dataflow, timing)
    rows, cols = int(rows), int(cols)
    m, k = a.shape
    n = b.shape[1]
    acc = _acc_dtype(a, b)
    if trace and rows * cols * cycle_count(m, k, n, rows, cols, dataflow, timing) > 20_000_000:
        raise errors.CourseValueError(
            "trace=True records every register in every cycle; this run would store "
            f"{rows * cols * cycle_count(m, k, n, rows, cols, dataflow, timing):,} cell-cycles. "
            "Use a small array and small matrices for traces (e.g. 4x4), or trace=False."
        )
    if dataflow == "os":
        sim = _run_os(a.astype(acc), b.astype(acc), rows, cols, timing, trace)
    else:
        x, s = (a, b) if dataflow == "ws" else (b.T, a.T)
        if trace:   # cycle by cycle on one array, recording every register
            sim = _run_stationary(x.astype(acc), s.astype(acc), rows, cols, timing, trace,
                                  transpose_out=(dataflow == "is"))
        else:       # the same machine, many folds per numpy step
            sim = _run_stationary_batched(x.astype(acc), s.astype(acc), rows, cols, timing,
                                          transpose_out=(dataflow == "is"))
    offset = -1 if timing == "scalesim" else 0
    cycles_sim = sim["cycles"]
    phases = sim["phases"]
    order = "column tile outer, row tile inner"
    return SystolicRun(
        result=sim["result"], shape=(m, k, n), rows=rows, cols=cols, dataflow=dataflow,
        timing=timing, cycles=cycles_sim + offset, preload_cycles=phases[0],
        fill_cycles=phases[1], steady_cycles=phases[2], drain_cycles=phases[3],
        stall_cycles=phases[4], count_offset=offset, folds=len(sim["folds"]),
        fold_grid=sim["grid"], fold_order=order, fold_stats=tuple(sim["folds"]),
        useful_macs=m * k * n, macs_per_cycle=sim["macs"],
        stationary_reads=sum(f.stationary_in for f in sim["folds"]),
        streamed_reads=sum(f.streamed_in for f in sim["folds"]),
        result_writes=sum(f.results_out for f in sim["folds"]),
        trace=tuple(sim["frames"]) if trace else None,
    )


# --------------------------------------------------------------------------------------
# Engines. Each runs cycle by cycle: a small controller (Python integers) decides when a
# fold's stationary values start down the load path and when its stream starts; the
# datapath (numpy over the whole grid) moves every register one step per cycle. The
# weight-stationary machine has two engines: one array cycle by cycle (_run_stationary,
# used with trace=True) and a batch of folds per step (_run_stationary_batched, trace off).
# --------------------------------------------------------------------------------------


def _diagonals(R: int, C: int) -> list[np.ndarray]:
    """Flat indices of the cells on each anti-diagonal ``k + j = d``."""
    kk, jj = np.indices((R, C))
    d = (kk + jj).ravel()
    order = np.argsort(d, kind="stable")
    starts = np.searchsorted(d[order], np.arange(R + C))
    return [order[starts[x]:starts[x + 1]] for x in range(R + C - 1)]


def _ones_conv(*lengths: int) -> np.ndarray:
    """``out[u]`` = how many index tuples (each ``idx_n < lengths[n]``) sum to ``u``."""
    out = np.ones(1, np.int64)
    for n in lengths:
        out = np.convolve(out, np.ones(n, np.int64))
    return out


def _fold_grid(kd: int, nd: int, R: int, C: int
               ) -> tuple[int, int, list[tuple[int, int]], list[int], list[int]]:
    """Tiles of a Kd x Nd stationary matrix on an R x C array: counts, order and used sizes.

    Folds run column tile outer, K tile inner (so a column's partial sums accumulate
    over consecutive folds); ``ru``/``cu`` are the rows/columns each fold really uses.
    """
    nkb, nnb = math.ceil(kd / R), math.ceil(nd / C)
    folds = [(kb, nb) for nb in range(nnb) for kb in range(nkb)]
    ru = [min(R, kd - kb * R) for kb, _ in folds]
    cu = [min(C, nd - nb * C) for _, nb in folds]
    return nkb, nnb, folds, ru, cu


def _fold_accounting(folds: list[tuple[int, int]], stream_start: Any, T: int, ru: Any, cu: Any,
                     nkb: int, timing: str, transpose_out: bool,
                     size: int) -> tuple[list["Fold"], np.ndarray]:
    """Per-fold traffic records and useful MACs per cycle, from each fold's stream start.

    A real operand x[i, k] (k < ru) does a useful MAC in cell (k, j < cu) at cycle
    ``s0 + i + k + j``; partial sums leave the array only in the SCALE-Sim convention or
    on the last K tile (the TPU convention accumulates in place).
    """
    stats, macs = [], np.zeros(size, np.int64)
    for f, (kb, nb) in enumerate(folds):
        s0 = stream_start[f]
        writes = T * cu[f] if (timing == "scalesim" or kb == nkb - 1) else 0
        stats.append(Fold(f, kb, nb, ru[f], cu[f], ru[f] * cu[f], T * ru[f], writes, s0,
                          b_in=ru[f] * cu[f] if not transpose_out else T * ru[f],
                          a_in=T * ru[f] if not transpose_out else ru[f] * cu[f]))
        conv = _ones_conv(T, ru[f], cu[f])
        macs[s0:s0 + len(conv)] += conv
    return stats, macs


def _phase_parts(segments: list[tuple[int, int, int, int, int]], issue: np.ndarray
                 ) -> tuple[tuple[int, int, int, int, int], np.ndarray]:
    """Preload/fill/steady/drain/stall cycle counts and a per-cycle label array.

    A segment is (load start, stream start, first result out, last operand in, last
    result out), observed cycle numbers. ``issue[t]`` is True when a vector entered.
    """
    n = len(issue)
    labels = np.full(n, "", dtype=object)
    pre = fill = steady = drain = stall = 0
    for load0, s0, first_out, last_in, last_out in segments:
        first_out = min(first_out, last_in + 1)
        pre += s0 - load0
        fill += first_out - s0
        steady += last_in + 1 - first_out
        stall += int(np.count_nonzero(~issue[first_out:last_in + 1]))
        drain += last_out - last_in
        labels[load0:s0] = "preload"
        labels[s0:first_out] = "fill"
        labels[first_out:last_in + 1] = "steady"
        labels[last_in + 1:last_out + 1] = "drain"
    return (pre, fill, steady, drain, stall), labels


def _run_stationary(x: np.ndarray, s: np.ndarray, R: int, C: int, timing: str, trace: bool,
                    transpose_out: bool) -> dict[str, Any]:
    """Weight-stationary engine: rows of ``x`` (T x Kd) stream past cells holding ``s`` (Kd x Nd).

    One array, cycle by cycle, with overlapping folds sharing it (``"tpu"``); it can
    record every register in every cycle (``trace``). Returns ``x @ s`` (transposed when
    ``transpose_out``) and what the run observed.
    """
    T, kd = x.shape
    nd = s.shape[1]
    nkb, nnb, folds, ru, cu = _fold_grid(kd, nd, R, C)
    F = len(folds)
    dt = x.dtype
    # Left-edge buffers: row k of K tile kb sends x[i, kb*R + k] at relative cycle i + k.
    feed = np.zeros((nkb, T + R - 1, R), dt)
    for kb in range(nkb):
        blk = x[:, kb * R:(kb + 1) * R]
        for k in range(blk.shape[1]):
            feed[kb, k:k + T, k] = blk[:, k]
    # Top-edge load path: column j pushes weight rows bottom first, starting j cycles late.
    lfeed = np.zeros((F, R + C - 1, C), dt)
    for f, (kb, nb) in enumerate(folds):
        tile = np.zeros((R, C), dt)
        tile[:ru[f], :cu[f]] = s[kb * R:kb * R + ru[f], nb * C:nb * C + cu[f]]
        for j in range(C):
            lfeed[f, j:j + R, j] = tile[::-1, j]
    diag = _diagonals(R, C)

    act, act_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)
    psum, psum_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)
    prod = np.zeros((R, C), dt)
    w_active, w_shadow, chain = np.zeros((R, C), dt), np.zeros((R, C), dt), np.zeros((R, C), dt)
    zero_col = np.zeros(R, dt)
    bound = F * (T + 2 * R + C) + 4
    bottom = np.zeros((bound, C), dt)
    issue = np.zeros(bound, bool)
    load_start, stream_start = [-1] * F, [-1] * F
    latched = [False] * F
    loads: list[int] = [0]
    load_start[0] = 0
    streams: list[int] = []   # folds whose skewed feed is still entering
    swaps: list[int] = []     # folds whose first activation is still crossing the array
    inflight: list[int] = []  # folds with a vector somewhere in the array
    nxt = 0                   # next fold to stream
    prev_done = True          # (scalesim) the previous fold's last result has left
    corner = R - 1 + C - 1    # cycles from a vector's entry to its result leaving column C-1
    frames: list[Frame] = []
    if trace:
        slot_ok = np.zeros((R, C), bool)
        live = np.zeros((R, C), bool)   # cells whose active weight is in use
        loaded = np.zeros((R, C), bool)  # cells that have latched a weight at all
        out_trace = np.zeros((T, nd), dt)
        out_seen = np.zeros((T, nd), bool)
    t = 0
    while True:
        # -- controller
        if timing == "scalesim" and prev_done and nxt < F and load_start[nxt] < 0:
            load_start[nxt] = t
            loads.append(nxt)
        issuing = bool(streams) and t - stream_start[streams[-1]] < T
        if nxt < F and latched[nxt] and not issuing and (timing == "tpu" or prev_done):
            f = nxt
            stream_start[f] = t
            streams.append(f)
            swaps.append(f)
            inflight.append(f)
            nxt += 1
            prev_done = False
            if timing == "tpu" and f + 1 < F:      # double buffering: next weights start now
                load_start[f + 1] = t
                loads.append(f + 1)
        # -- swap: where a fold's first activation arrives, the shadow weights go live
        if swaps:
            for f in swaps:
                sel = diag[t - stream_start[f]]
                w_active.flat[sel] = w_shadow.flat[sel]
                if trace:
                    live.flat[sel] = True
            if t - stream_start[swaps[0]] >= R + C - 2:
                swaps.pop(0)
        # -- the band of columns that hold a vector of some fold (others are idle)
        lo, hi = C, 0
        while inflight and t - stream_start[inflight[0]] > T - 1 + corner:
            inflight.pop(0)                   # its last result has left
        for f in inflight:                    # vector u - k - j of fold f is in cell (k, j)
            u = t - stream_start[f]
            lo = min(lo, max(0, u - (T - 1) - (R - 1)))
            hi = max(hi, min(C, u + 1))
        if lo < hi:
            # -- left edge: the skewed feeds of the folds still entering
            if lo == 0:
                xin = zero_col
                for f in streams:
                    u = t - stream_start[f]
                    xin = feed[folds[f][0], u] if xin is zero_col else xin + feed[folds[f][0], u]
                    if u < T:
                        issue[t] = True
                if streams and t - stream_start[streams[0]] >= T + R - 2:
                    streams.pop(0)
                act_nxt[:, 0] = xin
                a0 = 1
            else:
                a0 = lo
            # -- datapath: activations one cell right, MAC, partial sums one cell down
            act_nxt[:, a0:hi] = act[:, a0 - 1:hi - 1]
            act, act_nxt = act_nxt, act
            np.multiply(act[:, lo:hi], w_active[:, lo:hi], out=prod[:, lo:hi])
            psum_nxt[0, lo:hi] = prod[0, lo:hi]
            np.add(psum[:-1, lo:hi], prod[1:, lo:hi], out=psum_nxt[1:, lo:hi])
            psum, psum_nxt = psum_nxt, psum
            bottom[t, lo:hi] = psum[R - 1, lo:hi]
        # -- load path: column j shifts down during steps 0..R-1, latches at step R-1
        for f in loads:
            u = t - load_start[f]
            lo, hi = max(0, u - R + 1), min(C, u + 1)
            if lo < hi:
                chain[1:, lo:hi] = chain[:-1, lo:hi].copy()
                chain[0, lo:hi] = lfeed[f, u, lo:hi]
            j = u - (R - 1)
            if 0 <= j < C:
                w_shadow[:, j] = chain[:, j]
                latched[f] = latched[f] or j == 0
                if trace:
                    loaded[:, j] = True
        if loads and t - load_start[loads[0]] >= R + C - 2:
            loads.pop(0)
        if trace:
            slot_ok[:, 1:] = slot_ok[:, :-1]
            slot_ok[:, 0] = False
            for f in range(F):
                if stream_start[f] >= 0:
                    u = t - stream_start[f] - np.arange(R)
                    slot_ok[:, 0] |= (u >= 0) & (u < T)
            shown = np.where(live, w_active, np.where(loaded, w_shadow, np.nan))  # nan: empty
            _ws_trace_step(frames, t, act, psum, shown, slot_ok, bottom[t], stream_start,
                           folds, cu, T, R, C, timing, nkb, out_trace, out_seen, transpose_out)
        # -- observe the last result of the newest fold leaving the bottom-right cell
        last = nxt - 1
        if last >= 0 and t - stream_start[last] == T - 1 + corner:
            prev_done = True
            if last == F - 1:
                t += 1
                break
        t += 1
    ncyc = t
    issue = issue[:ncyc]

    # -- collect: result (t, j) belongs to the vector that entered R-1+j cycles earlier
    y = np.zeros((F, T, C), dt)
    cols = np.arange(C)
    for f in range(F):
        tt = stream_start[f] + np.arange(T)[:, None] + (R - 1) + cols[None, :]
        y[f] = bottom[tt, cols[None, :]]
    out = np.zeros((T, nd), dt)
    for f, (kb, nb) in enumerate(folds):            # K tiles in order: same as accumulating
        sl = slice(nb * C, nb * C + cu[f])
        out[:, sl] = out[:, sl] + y[f, :, :cu[f]]
    # -- measured traffic, MACs per cycle and phases
    stats, macs = _fold_accounting(folds, stream_start, T, ru, cu, nkb, timing, transpose_out,
                                   ncyc + T + R + C)
    segs = [(load_start[f], s0, s0 + R - 1, s0 + T - 1 + ru[f] - 1, s0 + T - 1 + corner)
            for f, s0 in enumerate(stream_start[:len(folds)])]
    if timing == "tpu":
        segs = [(0, segs[0][1], segs[0][2], max(sg[3] for sg in segs), segs[-1][4])]
    parts, labels = _phase_parts(segs, issue)
    if trace:
        frames = [dataclasses.replace(fr, phase=str(labels[fr.cycle])) for fr in frames]
    return {"result": out.T.copy() if transpose_out else out, "cycles": ncyc, "phases": parts,
            "folds": stats, "grid": (nkb, nnb), "macs": macs[:ncyc], "frames": frames}


# Cells (folds x rows x cols) one batched step may cover: 16 folds of a 128 x 128 array.
# Bigger batches mean fewer Python-level steps; on a 2-core EPYC 8-16 folds of 128 x 128
# were equally fast (bench/bench_systolic.py) and 1-2 folds clearly slower.
_BATCH_CELLS = 1 << 18


def _stream_tags(T: int, R: int, C: int) -> dict[str, Any]:
    """Simulate the valid bits (*tags*) of one fold's stream of ``T`` vector slots.

    A tag enters each row at the left edge when the skewed edge buffer issues a slot
    (row ``k`` from stream cycle ``k`` to ``k + T - 1``), moves one cell right per cycle
    with its activation, and a partial sum's tag moves one row down per cycle (valid when
    the partial sum above was and the activation here is). Every fold streams ``T``
    slots through the same ``R x C`` cells, so the tags move the same way for every fold
    and are simulated once. What they show, in cycles since the stream started: when a
    vector entered (``issue``), which cells the first vector reaches in each cycle (they
    swap in the fold's weights: ``swaps``), when it first reaches the top of each column
    and when the last cell of each column swaps, and which values leaving the bottom
    edge are results (``out``).
    """
    n_feed = T + R - 1
    slot = np.zeros((n_feed, R), bool)
    for k in range(R):
        slot[k:k + T, k] = True
    bound = T + R + C + 1                       # more stream cycles than a fold may take
    tag_act, tag_nxt = np.zeros((R, C), bool), np.zeros((R, C), bool)
    tag_ps, tag_ps_nxt = np.zeros((R, C), bool), np.zeros((R, C), bool)
    live = np.zeros((R, C), bool)
    out = np.zeros((bound, C), bool)
    issue = np.zeros(bound, bool)
    swaps: list[tuple[int, np.ndarray]] = []
    first_arrival, last_swap = np.full(C, -1), np.full(C, -1)
    swapping = True
    u = 0
    while True:
        if u >= bound:
            raise RuntimeError("systolic: a fold's stream did not drain (simulator bug)")
        tag_nxt[:, 1:] = tag_act[:, :-1]
        tag_nxt[:, 0] = slot[u] if u < n_feed else False
        tag_act, tag_nxt = tag_nxt, tag_act
        tag_ps_nxt[0] = tag_act[0]
        np.logical_and(tag_ps[:-1], tag_act[1:], out=tag_ps_nxt[1:])
        tag_ps, tag_ps_nxt = tag_ps_nxt, tag_ps
        issue[u] = bool(tag_act[0, 0])
        if swapping:
            arrive = tag_act & ~live
            sel = np.flatnonzero(arrive)
            if len(sel):
                swaps.append((u, sel))
                live |= arrive
                last_swap[sel % C] = u
                first_arrival[arrive[0]] = u
                swapping = not live.all()
        out[u] = tag_ps[R - 1]
        u += 1
        if u >= n_feed and not tag_act.any():
            break
    out_cycles = np.flatnonzero(out.any(axis=1))
    return {"slot": slot, "issue": issue[:u], "swaps": swaps, "out": out[:u],
            "first_arrival": first_arrival, "last_swap": last_swap,
            "first_out": int(out_cycles[0]), "last_out": int(out_cycles[-1]),
            "last_issue": int(np.flatnonzero(issue)[-1]), "cycles": u}


def _run_stationary_batched(x: np.ndarray, s: np.ndarray, R: int, C: int, timing: str,
                            transpose_out: bool) -> dict[str, Any]:
    """The weight-stationary engine with the trace off: many folds per numpy step.

    The machine is the one :func:`_run_stationary` runs (same registers, same moves, same
    additions in the same order), but each register array gets a leading *fold* axis:
    slot ``b`` of a batch holds the array as it runs fold ``b`` (folds of one K tile
    share their activation registers, which hold the same values), and one numpy step
    advances every fold of the batch by one cycle of its own timeline. A fold's values never meet
    another fold's (in any cycle a cell holds one fold's vector), so they are the values
    the shared array computes; only the clock differs. Each fold's timeline is observed
    in cycles since its own start -- when its first column of weights latches, when its
    edge buffer issues vectors and when tagged results leave the bottom edge
    (:func:`_stream_tags`) -- and the controller then places the folds on one clock by
    the ``timing`` rule, from those observed times: one after another for
    ``"scalesim"``, double-buffered for ``"tpu"``. It checks the hazards the shared
    array would have: a column's weights must latch before its first vector arrives,
    and (``"tpu"``) the next fold's weights must not overwrite a shadow register before
    the current fold has swapped it in.
    """
    T, kd = x.shape
    nd = s.shape[1]
    nkb, nnb, folds, ru, cu = _fold_grid(kd, nd, R, C)
    F = len(folds)
    dt = x.dtype
    tags = _stream_tags(T, R, C)
    slot, n_feed, U = tags["slot"], T + R - 1, tags["cycles"]
    # Left-edge buffers, one per K tile: row k sends x[i, kb*R + k] at stream cycle i + k.
    feed = np.zeros((nkb, n_feed, R), dt)
    for kb in range(nkb):
        blk = x[:, kb * R:(kb + 1) * R]
        for k in range(blk.shape[1]):
            feed[kb, k:k + T, k] = blk[:, k]
    # The n-th tagged value out of the bottom of column j is result n of that column.
    jj, uu = np.divmod(np.flatnonzero(tags["out"].T.ravel()), U)
    if len(uu) != T * C:
        raise RuntimeError("systolic: results lost in the array (simulator bug)")

    # -- load path, every fold at once: column j pushes its weight rows (bottom row
    #    first) down from the top edge, starting j cycles late, and latches them into
    #    the shadow registers after R shifts
    tiles = np.zeros((F, R, C), dt)
    for f, (kb, nb) in enumerate(folds):
        tiles[f, :ru[f], :cu[f]] = s[kb * R:kb * R + ru[f], nb * C:nb * C + cu[f]]
    lfeed = np.zeros((R + C - 1, C, F), dt)     # (load cycle, column, fold)
    rr, jc = np.indices((R, C))
    lfeed[rr + jc, jc] = tiles[:, ::-1].transpose(1, 2, 0)
    lfeed = lfeed.transpose(0, 2, 1).copy()     # (load cycle, fold, column)
    chains = [np.zeros((F, R, C), dt) for _ in range(2)]
    shadow = np.zeros((F, R, C), dt)
    latch = np.full(C, -1)
    for v in range(R + C - 1):                  # cycles since the load started
        old, chain = chains[v & 1], chains[1 - (v & 1)]
        lo, hi = max(0, v - R + 1), min(C, v + 1)
        chain[:, 1:, lo:hi] = old[:, :-1, lo:hi]
        chain[:, 0, lo:hi] = lfeed[v, :, lo:hi]
        j = v - (R - 1)
        if 0 <= j < C:
            shadow[:, :, j] = chain[:, :, j]
            latch[j] = v
    del tiles, lfeed, chains

    # -- streams, a batch of folds at a time. Folds that share a K tile receive the same
    #    activation stream, so in every cycle of their timelines their activation
    #    registers hold the same values: a batch keeps one copy of them per K tile.
    out = np.zeros((T, nd), dt)
    kb_per = min(nkb, max(1, _BATCH_CELLS // (R * C)))
    nb_per = max(1, _BATCH_CELLS // (kb_per * R * C))
    for kb0 in range(0, nkb, kb_per):
        KB = min(kb_per, nkb - kb0)
        bfeed = feed[kb0:kb0 + KB].transpose(1, 0, 2).copy()     # (cycle, K tile, row)
        for nb0 in range(0, nnb, nb_per):
            NB = min(nb_per, nnb - nb0)
            fidx = (np.arange(nb0, nb0 + NB)[:, None] * nkb + np.arange(kb0, kb0 + KB)[None, :])
            res = _stream_batch(bfeed, shadow[fidx], tags, uu, jj, T, R, C)
            for b_nb, nb in enumerate(range(nb0, nb0 + NB)):   # K tiles in order: the
                sl = slice(nb * C, min(nd, nb * C + C))         # same order as accumulating
                for b_kb in range(KB):
                    out[:, sl] = out[:, sl] + res[b_nb, b_kb, :, :sl.stop - sl.start]
    # -- controller: place the folds' observed timelines on one clock
    load_start, stream_start = [0] * F, [0] * F
    for f in range(F):
        if f > 0 and timing == "scalesim":  # the next load starts once the last result left
            load_start[f] = stream_start[f - 1] + tags["last_out"] + 1
        elif f > 0:                          # double buffering: load while the previous streams
            load_start[f] = stream_start[f - 1]
            if np.any(load_start[f] + latch < stream_start[f - 1] + tags["last_swap"]):
                raise RuntimeError("systolic: shadow weights overwritten before their swap")
        stream_start[f] = load_start[f] + int(latch[0]) + 1      # column 0 has latched
        if f > 0 and timing == "tpu":        # ... and the previous fold has issued its vectors
            stream_start[f] = max(stream_start[f], stream_start[f - 1] + tags["last_issue"] + 1)
        if np.any(load_start[f] + latch >= stream_start[f] + tags["first_arrival"]):
            raise RuntimeError("systolic: a column's weights latched after its first vector")
    ncyc = stream_start[-1] + tags["last_out"] + 1
    issue = np.zeros(ncyc, bool)
    for f in range(F):
        issue[stream_start[f]:stream_start[f] + U] |= tags["issue"][:ncyc - stream_start[f]]
    stats, macs = _fold_accounting(folds, stream_start, T, ru, cu, nkb, timing, transpose_out,
                                   ncyc + T + R + C)
    segs = []
    for f in range(len(folds)):
        s0 = stream_start[f]
        last_in = int(np.flatnonzero(slot[:, :ru[f]].any(axis=1))[-1])   # last real operand
        segs.append((load_start[f], s0, s0 + tags["first_out"], s0 + last_in,
                     s0 + tags["last_out"]))
    if timing == "tpu":
        segs = [(0, segs[0][1], segs[0][2], max(sg[3] for sg in segs), segs[-1][4])]
    parts, _ = _phase_parts(segs, issue)
    return {"result": out.T.copy() if transpose_out else out, "cycles": ncyc, "phases": parts,
            "folds": stats, "grid": (nkb, nnb), "macs": macs[:ncyc], "frames": []}


def _stream_batch(bfeed: np.ndarray, w_shadow: np.ndarray, tags: dict[str, Any], uu: np.ndarray,
                  jj: np.ndarray, T: int, R: int, C: int) -> np.ndarray:
    """Stream a batch of folds (``NB`` column tiles x ``KB`` K tiles) through the array.

    ``bfeed[u, b]`` is what K tile ``b``'s skewed edge buffer sends into the left edge at
    stream cycle ``u``; ``w_shadow`` (NB x KB x R x C) the latched weights. Each cycle:
    where the first vector arrives (``tags["swaps"]``) the shadow weights go live; the
    edge buffer feeds column 0 and every other activation moves one cell right; each
    cell multiplies its activation by its weight and adds the partial sum arriving from
    the cell above; the bottom row leaves the array. Returns the tagged results,
    NB x KB x T x C (result ``i`` of column ``j`` is the ``i``-th tagged value that left
    the bottom of column ``j``).
    """
    NB, KB = w_shadow.shape[:2]
    dt = w_shadow.dtype
    U, n_feed = tags["cycles"], T + R - 1
    acts = [np.zeros((KB, R, C), dt) for _ in range(2)]
    psums = [np.zeros((NB, KB, R, C), dt) for _ in range(2)]
    w_active = np.zeros((NB, KB, R, C), dt)
    bottom = np.zeros((U, NB, KB, C), dt)
    wa_flat, ws_flat = w_active.reshape(NB * KB, R * C), w_shadow.reshape(NB * KB, R * C)
    swaps = iter(tags["swaps"])
    next_swap = next(swaps, (-1, None))
    views: dict[tuple[int, int, int, int, int], tuple[Any, ...]] = {}
    for u in range(U):
        if u == next_swap[0]:                   # the first vector reaches these cells now
            wa_flat[:, next_swap[1]] = ws_flat[:, next_swap[1]]
            next_swap = next(swaps, (-1, None))
        # the rectangle of cells that can hold a vector this cycle (the rest are idle)
        r0, r1 = max(0, u - (T - 1) - (C - 1)), min(R, u + 1)
        lo, hi = max(0, u - (T - 1) - (R - 1)), min(C, u + 1)
        if r0 >= r1 or lo >= hi:
            continue
        key = (u & 1, r0, r1, lo, hi)
        v = views.get(key)
        if v is None:
            a_old, a_new = acts[u & 1], acts[1 - (u & 1)]
            p_old, p_new = psums[u & 1], psums[1 - (u & 1)]
            a0, k0 = max(lo, 1), max(r0, 1)
            v = views[key] = (
                a_new[:, r0:r1, 0] if lo == 0 else None,
                a_new[:, r0:r1, a0:hi], a_old[:, r0:r1, a0 - 1:hi - 1],
                a_new[:, r0:r1, lo:hi], w_active[..., r0:r1, lo:hi], p_new[..., r0:r1, lo:hi],
                p_new[..., k0:r1, lo:hi], p_old[..., k0 - 1:r1 - 1, lo:hi],
                p_new[..., R - 1, lo:hi] if r1 == R else None)
        edge, a_dst, a_src, a_cur, w_cur, p_cur, p_acc, p_above, p_bottom = v
        if edge is not None:                    # activations: the edge buffer feeds column 0
            edge[...] = bfeed[u, :, r0:r1] if u < n_feed else 0
        a_dst[...] = a_src                      # ... and every other one moves one cell right
        np.multiply(a_cur, w_cur, out=p_cur)    # each cell's product (every column tile);
        if p_acc.size:                          # then add the partial sum from above
            np.add(p_acc, p_above, out=p_acc)
        if p_bottom is not None:
            bottom[u, ..., lo:hi] = p_bottom
    return bottom[uu, :, :, jj].reshape(C, T, NB, KB).transpose(2, 3, 1, 0)


def _ws_trace_step(frames, t, act, psum, w_active, slot_ok, bottom_row, stream_start, folds,
                   cu, T, R, C, timing, nkb, out_trace, out_seen, transpose_out) -> None:
    """Append one :class:`Frame` for the weight-stationary engine (trace mode only)."""
    note = ""
    for f, (kb, nb) in enumerate(folds):
        s0 = stream_start[f]
        if s0 < 0:
            continue
        for j in range(cu[f]):
            i = t - s0 - (R - 1) - j
            if 0 <= i < T:
                out_trace[i, nb * C + j] += bottom_row[j]
                out_seen[i, nb * C + j] = True
                if timing == "tpu" and kb < nkb - 1:
                    note = "partial sums added into the accumulators"
    horizontal = np.where(slot_ok, act, np.nan)
    vertical = np.where(slot_ok, psum, np.nan)
    shown = np.where(out_seen, out_trace, np.nan)
    frames.append(Frame(t, "", w_active.astype(float), horizontal.astype(float),
                        vertical.astype(float), (shown.T if transpose_out else shown).astype(float),
                        note))


def _run_os(a: np.ndarray, b: np.ndarray, R: int, C: int, timing: str, trace: bool) -> dict[str, Any]:
    """Output-stationary engine: ``a`` rows enter at the left, ``b`` columns at the top."""
    M, K = a.shape
    N = b.shape[1]
    nmb, nnb = math.ceil(M / R), math.ceil(N / C)
    folds = [(mb, nb) for nb in range(nnb) for mb in range(nmb)]
    F = len(folds)
    ru = [min(R, M - mb * R) for mb, _ in folds]
    cu = [min(C, N - nb * C) for _, nb in folds]
    dt = a.dtype
    afeed = np.zeros((nmb, K + R - 1, R), dt)   # row i gets a[i, k] at relative cycle k + i
    for mb in range(nmb):
        blk = a[mb * R:(mb + 1) * R]
        for i in range(blk.shape[0]):
            afeed[mb, i:i + K, i] = blk[i]
    bfeed = np.zeros((nnb, K + C - 1, C), dt)   # column j gets b[k, j] at relative cycle k + j
    for nb in range(nnb):
        blk = b[:, nb * C:(nb + 1) * C]
        for j in range(blk.shape[1]):
            bfeed[nb, j:j + K, j] = blk[:, j]
    diag = _diagonals(R, C)
    ah, ah_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)   # moving right
    bv, bv_nxt = np.zeros((R, C), dt), np.zeros((R, C), dt)   # moving down
    acc, prod, outreg = np.zeros((R, C), dt), np.zeros((R, C), dt), np.zeros((R, C), dt)
    chain = np.zeros((R, C), dt)
    zr, zc = np.zeros(R, dt), np.zeros(C, dt)
    bound = F * (max(K, R) + K + 2 * R + C) + 4
    bottom = np.zeros((bound, C), dt)
    issue = np.zeros(bound, bool)
    stream_start = [-1] * F
    y = np.zeros((F, R, C), dt)
    chain_load: dict[tuple[int, int], int] = {}
    active: list[int] = []   # folds with operands still entering or cells still finishing
    nxt = 0
    prev_done = True
    corner = R - 1 + C - 1
    frames: list[Frame] = []
    if trace:
        out_trace = np.full((M, N), np.nan)
        a_ok = np.zeros((R, C), bool)
        b_ok = np.zeros((R, C), bool)
    t = 0
    end_t = -1
    while True:
        # -- controller
        if nxt < F:
            cur = nxt - 1
            if timing == "scalesim":
                go = prev_done
            else:
                go = cur < 0 or (t - stream_start[cur] >= K and t - stream_start[cur] >= R)
            if go:
                stream_start[nxt] = t
                active.append(nxt)
                nxt += 1
                prev_done = False
        xin, yin = zr, zc
        for f in active:
            u = t - stream_start[f]
            if u < K + R - 1:
                xin = afeed[folds[f][0], u] if xin is zr else xin + afeed[folds[f][0], u]
            if u < K + C - 1:
                yin = bfeed[folds[f][1], u] if yin is zc else yin + bfeed[folds[f][1], u]
            issue[t] |= u < K
            if u < R + C - 1:                       # a fold's first operands: start from 0
                acc.flat[diag[u]] = 0
        ah_nxt[:, 1:] = ah[:, :-1]
        ah_nxt[:, 0] = xin
        ah, ah_nxt = ah_nxt, ah
        bv_nxt[1:] = bv[:-1]
        bv_nxt[0] = yin
        bv, bv_nxt = bv_nxt, bv
        np.multiply(ah, bv, out=prod)
        np.add(acc, prod, out=acc)
        if timing == "tpu":                         # finished columns shift out of the bottom
            bottom[t] = chain[R - 1]
            chain[1:] = chain[:-1].copy()
            chain[0] = 0
        still = []
        for f in active:
            d = t - stream_start[f] - (K - 1)
            if 0 <= d < R + C - 1:                  # cells that just did their last MAC
                sel = diag[d]
                outreg.flat[sel] = acc.flat[sel]
                if timing == "scalesim":            # read out where they are (no drain)
                    y[f].flat[sel] = acc.flat[sel]
                else:
                    j = d - (R - 1)                 # column j's bottom cell is done
                    if 0 <= j < C:
                        chain[:, j] = outreg[:, j]
                        chain_load[(f, j)] = t
            if d < R + C - 2:
                still.append(f)
            elif f == nxt - 1 or timing == "scalesim":
                prev_done = True
        active = still
        if trace:
            a_ok[:, 1:] = a_ok[:, :-1]
            b_ok[1:] = b_ok[:-1]
            a_ok[:, 0] = False
            b_ok[0] = False
            for f in range(F):
                if stream_start[f] >= 0:
                    u = t - stream_start[f]
                    a_ok[:, 0] |= (u - np.arange(R) >= 0) & (u - np.arange(R) < K)
                    b_ok[0] |= (u - np.arange(C) >= 0) & (u - np.arange(C) < K)
            _os_trace_step(frames, t, ah, bv, acc, a_ok, b_ok, timing, folds, stream_start,
                           K, R, C, ru, cu, y, bottom[t], chain_load, out_trace)
        if nxt == F and not active and end_t < 0:
            end_t = t if timing == "scalesim" else t + R  # tpu: the last column shifts out
        if end_t >= 0 and t >= end_t:
            t += 1
            break
        t += 1
    ncyc = t
    issue = issue[:ncyc]
    if timing == "tpu":
        for (f, j), c0 in chain_load.items():
            y[f][::-1, j] = bottom[c0 + 1:c0 + 1 + R, j]
    out = np.zeros((M, N), dt)
    stats = []
    macs = np.zeros(ncyc + K + R + C, np.int64)
    segs = []
    for f, (mb, nb) in enumerate(folds):
        out[mb * R:mb * R + ru[f], nb * C:nb * C + cu[f]] = y[f, :ru[f], :cu[f]]
        s0 = stream_start[f]
        stats.append(Fold(f, mb, nb, ru[f], cu[f], 0, K * (ru[f] + cu[f]), ru[f] * cu[f], s0,
                          a_in=K * ru[f], b_in=K * cu[f]))
        conv = _ones_conv(K, ru[f], cu[f])
        macs[s0:s0 + len(conv)] += conv
        last_in = s0 + K - 1 + max(ru[f], cu[f]) - 1
        done = s0 + K - 1 + corner
        out_first = s0 + K - 1 if timing == "scalesim" else s0 + K - 1 + R - 1 + 1
        out_last = done if timing == "scalesim" else done + R
        segs.append((s0, s0, out_first, last_in, out_last))
    if timing == "tpu":
        segs = [(0, 0, segs[0][2], max(sg[3] for sg in segs), segs[-1][4])]
    parts, labels = _phase_parts(segs, issue)
    if trace:
        frames = [dataclasses.replace(fr, phase=str(labels[fr.cycle])) for fr in frames]
    return {"result": out, "cycles": ncyc, "phases": parts, "folds": stats,
            "grid": (nmb, nnb), "macs": macs[:ncyc], "frames": frames}


def _os_trace_step(frames, t, ah, bv, acc, a_ok, b_ok, timing, folds, stream_start, K, R, C,
                   ru, cu, y, bottom_row, chain_load, out_trace) -> None:
    """Append one :class:`Frame` for the output-stationary engine (trace mode only)."""
    for f, (mb, nb) in enumerate(folds):
        s0 = stream_start[f]
        if s0 < 0:
            continue
        if timing == "scalesim":
            for i in range(ru[f]):
                for j in range(cu[f]):
                    if t == s0 + K - 1 + i + j:
                        out_trace[mb * R + i, nb * C + j] = y[f][i, j]
        else:
            for j in range(cu[f]):
                c0 = chain_load.get((f, j))
                if c0 is not None and c0 < t <= c0 + R:
                    i = R - 1 - (t - c0 - 1)
                    if i < ru[f]:
                        out_trace[mb * R + i, nb * C + j] = bottom_row[j]
    frames.append(Frame(t, "", acc.astype(float), np.where(a_ok, ah, np.nan).astype(float),
                        np.where(b_ok, bv, np.nan).astype(float), out_trace.copy()))


def reference_matmul(a: Any, b: Any, rows: int, cols: int = 1, dataflow: str = "ws") -> np.ndarray:
    """``a @ b`` accumulated in the order the simulator uses (a plain loop over k).

    ``"ws"``/``"is"``: each K tile of ``rows`` is summed k by k starting from the first
    product, then the tiles' partial sums are added in order; ``"os"``: one running sum
    over all of K. Same dtypes as :func:`simulate` (int64 for integers).

    >>> import numpy as np
    >>> x = np.array([[1e8, 1.0, -1e8, 1.0]], np.float32); y = np.ones((4, 1), np.float32)
    >>> float(reference_matmul(x, y, rows=2)[0, 0]), float(reference_matmul(x, y, rows=4)[0, 0])
    (0.0, 1.0)
    """
    a, b = _check_operands(a, b)
    _check_array_size(rows, cols)
    _check_dataflow(dataflow, "tpu")
    acc = _acc_dtype(a, b)
    a, b = a.astype(acc), b.astype(acc)
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), acc)
    step = k if dataflow == "os" else rows
    for k0 in range(0, k, step):
        part = a[:, k0, None] * b[None, k0, :]
        for kk in range(k0 + 1, min(k, k0 + step)):
            part = part + a[:, kk, None] * b[None, kk, :]
        out = out + part
    return out


# --------------------------------------------------------------------------------------
# Memory accesses per MAC: von Neumann CPU, GPU, systolic array
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AccessModel:
    """Memory accesses per multiply-accumulate for one machine on an n x n x n matmul."""

    machine: str
    n: int
    reads: float   # operand reads from the memory that feeds the multipliers
    writes: float  # result or partial-sum writes to that memory
    macs: int

    @property
    def per_mac(self) -> float:
        """(reads + writes) / MACs."""
        return (self.reads + self.writes) / self.macs


def memory_accesses_per_mac(n: int, machine: str, *, tile: int = 64, rows: int = 128,
                            cols: int = 128) -> AccessModel:
    """How many memory accesses each multiply-accumulate of an n x n x n matmul costs.

    A deliberately small model of *where operands come from*, not a timing model. It
    counts accesses to the one memory that feeds the multipliers directly: for the CPU
    its memory, for the GPU its shared memory (SMEM, read into registers), for the
    systolic array its edge buffers (fed from VMEM). Registers are not counted, nor is
    the tier below (HBM to SMEM or to VMEM): that traffic is the roofline's business
    (chapter 4), and it is left out for all three machines alike.

    * ``"cpu"`` (von Neumann, one ALU): every MAC loads ``a[i,k]`` and ``b[k,j]`` and
      loads and stores the running sum ``c[i,j]``: ``2 n^3`` reads of operands,
      ``n^3`` reads and ``n^3`` writes of the sum: **4** per MAC.
    * ``"gpu"``: a kernel keeps a ``tile x tile`` block of outputs in registers (a
      warp's tile of tensor-core fragments: 64 x 64 in CUTLASS's SM80 examples, under a
      128 x 128 thread-block tile in SMEM; NVIDIA/cutlass ``media/docs/efficient_gemm.md``
      describes the hierarchy). Each step along ``k`` reads ``tile`` values of ``a`` and
      ``tile`` of ``b`` from SMEM and does ``tile^2`` MACs with them, so each ``a[i,k]``
      is read once per column tile and each ``b[k,j]`` once per row tile:
      ``2 n^2 ceil(n/tile)`` reads; each ``c[i,j]`` is written once (``n^2``). Per MAC
      about ``2/tile + 1/n``. ``tile=1`` (no register tiling: one thread per output)
      gives the naive ``2 + 1/n``.
    * ``"systolic"`` (weight-stationary ``rows x cols``): a weight is read once
      (``n^2``), each activation once per column tile (``n^2 ceil(n/cols)``), and each
      partial sum written once per row tile (``n^2 ceil(n/rows)``) -- exactly the
      ``timing="scalesim"`` traffic that :func:`simulate` counts as it moves the values.
      Per MAC ``(1 + ceil(n/cols) + ceil(n/rows)) / n``: ``2/128 + 1/n`` on a
      128 x 128 array when ``n`` is a multiple of 128.

    The GPU's reuse factor is a software choice bounded by its register file; the
    systolic array's is its side, built into the wires.

    >>> round(memory_accesses_per_mac(1024, "cpu").per_mac, 2)
    4.0
    >>> memory_accesses_per_mac(1024, "gpu", tile=1).per_mac == 2 + 1 / 1024
    True
    >>> memory_accesses_per_mac(1024, "gpu").per_mac == 2 / 64 + 1 / 1024
    True
    >>> memory_accesses_per_mac(1024, "systolic").per_mac == 2 / 128 + 1 / 1024
    True
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise _positive_int_error(n)(f"n must be a positive integer (the matmul size), got {n!r}")
    errors.check_int("tile", tile, low=1)
    _check_array_size(rows, cols)
    macs = n ** 3
    if machine == "cpu":
        return AccessModel("cpu", n, 3.0 * macs, 1.0 * macs, macs)
    if machine == "gpu":
        return AccessModel("gpu", n, 2.0 * n * n * math.ceil(n / tile), float(n * n), macs)
    if machine == "systolic":
        reads = n * n + n * n * math.ceil(n / cols)
        return AccessModel("systolic", n, float(reads), float(n * n * math.ceil(n / rows)), macs)
    raise errors.CourseValueError(f"unknown machine {machine!r}; expected 'cpu', 'gpu' or 'systolic'")

"""A cycle-level systolic-array simulator, its closed-form cycle count, and a traffic model.

``simulate(a, b, rows, cols, dataflow, timing)`` multiplies ``a`` (M x K) by ``b`` (K x N)
on a ``rows x cols`` grid of multiply-accumulate (MAC) cells. It really moves values: each
cycle every operand register passes its value to the neighbouring cell, every cell does
one multiply-accumulate, and results leave at the array's edge. The whole grid is updated
with a few numpy operations per cycle (never a Python loop over cells). The cycle count it
observes is checked against :func:`cycle_count`, a closed form derived independently.

With ``trace=False`` (the default) the movement is simulated once per run rather than
once per fold: every fold streams the same number of vectors through the same cells, so
one fold's tags (valid bits) and labels, moved cycle by cycle, show when its weights
latch, when vectors enter, which vector meets which cell in which cycle and when tagged
results leave. The values then follow one array row at a time for a batch of folds (the
same multiplies and adds in the same order), and a controller places the folds on one
clock from the observed times. The values and every count are the same as cycle by
cycle on one array, which ``trace=True`` still does (for animations of small arrays),
and a test holds the two engines equal.

Where things are: :mod:`.dataflows` (the table :data:`DATAFLOW` of what each dataflow
is, the fold grid, the argument checks and the closed form :func:`cycle_count`),
:mod:`.results` (:class:`SystolicRun`, :class:`Fold`, :class:`Frame`), :mod:`.engines`
(the parts every engine shares and the cycle-by-cycle engines), :mod:`.batched` (the
engines with the trace off) and :mod:`.access` (memory accesses per MAC, chapter 1's
model).

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
from typing import Any

from tpu_course import errors
from tpu_course.systolic import batched, engines
from tpu_course.systolic.access import AccessModel, memory_accesses_per_mac
from tpu_course.systolic.dataflows import (DATAFLOW, DATAFLOWS, TIMINGS, Dataflow, FoldGrid,
                                           acc_dtype, check_array_size, check_dataflow,
                                           check_operands, closed_form_cycles, cycle_count,
                                           fold_count, reference_matmul, utilization)
from tpu_course.systolic.results import EngineRun, Fold, Frame, SystolicRun

__all__ = [
    "DATAFLOW", "DATAFLOWS", "TIMINGS", "AccessModel", "Dataflow", "EngineRun", "Fold",
    "FoldGrid", "Frame", "SystolicRun", "cycle_count", "fold_count",
    "memory_accesses_per_mac", "reference_matmul", "simulate", "utilization",
]

# Cell-cycles a trace may record (each stores every register): enough for a 4 x 4 array
# and small matrices, far below what would exhaust a laptop's memory.
TRACE_LIMIT = 20_000_000


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
            The engine then moves every register of one array cycle by cycle (same
            values and cycles, much slower on big problems).

    Returns:
        A :class:`SystolicRun` with the result, cycles and their parts, folds,
        utilisation and traffic.
    """
    a, b = check_operands(a, b)
    check_array_size(rows, cols)
    df = check_dataflow(dataflow, timing)
    rows, cols = int(rows), int(cols)
    m, k = a.shape
    n = b.shape[1]
    acc = acc_dtype(a, b)
    if trace:
        cells = rows * cols * closed_form_cycles(df, m, k, n, rows, cols, timing)
        if cells > TRACE_LIMIT:
            raise errors.CourseValueError(
                "trace=True records every register in every cycle; this run would store "
                f"{cells:,} cell-cycles. Use a small array and small matrices for traces "
                "(e.g. 4x4), or trace=False."
            )
    engine = engines if trace else batched   # cycle by cycle, or many folds per step
    a, b = a.astype(acc), b.astype(acc)
    if df.key == "os":
        sim = engine.run_os(df, a, b, rows, cols, timing)
    else:   # "is" is the weight-stationary machine with b.T streaming past a.T
        x, s = (a, b) if df.key == "ws" else (b.T, a.T)
        sim = engine.run_stationary(df, x, s, rows, cols, timing)
    (pre, fill, steady, drain, stall), labels = engines.phase_parts(
        list(sim.segments), sim.issue, merge=timing == "tpu")
    frames = tuple(dataclasses.replace(fr, phase=str(labels[fr.cycle])) for fr in sim.frames)
    offset = -1 if timing == "scalesim" else 0
    return SystolicRun(
        result=sim.result, shape=(m, k, n), rows=rows, cols=cols, dataflow=df.key,
        timing=timing, cycles=sim.cycles + offset, preload_cycles=pre, fill_cycles=fill,
        steady_cycles=steady, drain_cycles=drain, stall_cycles=stall, count_offset=offset,
        folds=len(sim.folds), fold_grid=sim.grid, fold_order="column tile outer, row tile inner",
        fold_stats=sim.folds, useful_macs=m * k * n, macs_per_cycle=sim.macs,
        stationary_reads=sum(f.stationary_in for f in sim.folds),
        streamed_reads=sum(f.streamed_in for f in sim.folds),
        result_writes=sum(f.results_out for f in sim.folds),
        trace=frames if trace else None,
    )

"""What a simulation returns: its folds, its frames (``trace=True``) and the run."""

from __future__ import annotations

import dataclasses

import numpy as np

from tpu_course import tables
from tpu_course.systolic.dataflows import DATAFLOW

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
            f"{self.rows}x{self.cols} {DATAFLOW[self.dataflow].name} array, "
            f"timing={self.timing!r}: ({m}x{k}) @ ({k}x{n})",
            f"{self.folds} fold(s) ({self.fold_grid[0]} x {self.fold_grid[1]}, "
            f"{self.fold_order})",
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
        return tables.html([(line,) for line in self.summary().split("\n")])



@dataclasses.dataclass(frozen=True)
class EngineRun:
    """What an engine observed, before :func:`~tpu_course.systolic.simulate` sums it up.

    ``cycles`` counts every cycle simulated (from 0 to the one the last result left);
    ``segments`` are (load start, stream start, first result out, last operand in, last
    result out) per fold, observed cycle numbers; ``issue[t]`` is True when a vector
    entered in cycle ``t``; ``macs[t]`` the useful MACs done in it.
    """

    result: np.ndarray
    cycles: int
    segments: tuple[tuple[int, int, int, int, int], ...]
    issue: np.ndarray
    folds: tuple[Fold, ...]
    grid: tuple[int, int]
    macs: np.ndarray
    frames: tuple[Frame, ...] = ()

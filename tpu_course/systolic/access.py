"""Memory accesses per multiply-accumulate: a von Neumann CPU, a GPU, a systolic array.

A small model of *where operands come from* (chapter 1), apart from the simulator; the
systolic count is the traffic :func:`tpu_course.systolic.simulate` measures with
``timing="scalesim"``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tpu_course import errors
from tpu_course.systolic.dataflows import check_array_size, positive_int_error

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
        raise positive_int_error(n)(f"n must be a positive integer (the matmul size), got {n!r}")
    errors.check_int("tile", tile, low=1)
    check_array_size(rows, cols)
    macs = n ** 3
    if machine == "cpu":
        return AccessModel("cpu", n, 3.0 * macs, 1.0 * macs, macs)
    if machine == "gpu":
        return AccessModel("gpu", n, 2.0 * n * n * math.ceil(n / tile), float(n * n), macs)
    if machine == "systolic":
        reads = n * n + n * n * math.ceil(n / cols)
        return AccessModel("systolic", n, float(reads), float(n * n * math.ceil(n / rows)), macs)
    raise errors.CourseValueError(f"unknown machine {machine!r}; expected 'cpu', 'gpu' or 'systolic'")

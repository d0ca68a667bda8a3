"""What each dataflow is, the fold grid, the argument checks and the closed-form cycle count.

:data:`DATAFLOW` is the one table that says what a dataflow means: which operand stays in
the cells, which streams, what the array's rows and columns hold (and so the fold grid),
and what one fold costs in cycles. The engines, :func:`cycle_count`, the pictures
(``tpu_course.viz``) and the tests read it; nothing else spells a dataflow out.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from tpu_course import errors

TIMINGS = ("tpu", "scalesim")


@dataclasses.dataclass(frozen=True)
class Dataflow:
    """One dataflow of a ``rows x cols`` array multiplying A (M x K) by B (K x N).

    ``rows_hold``/``cols_hold`` name the extents laid along the array's rows and columns
    (they set the fold grid), ``streams`` the extent of vectors streamed per fold (``T``).
    ``held``, ``horizontal`` and ``vertical`` say what a :class:`~.results.Frame`'s three
    arrays hold (what stays in the cells, what moves right, what moves down).
    ``preload``: the stationary operand is loaded down the columns before a fold streams
    (``R`` exposed cycles). ``shift_out``: with ``timing="tpu"`` the finished results
    shift out of the bottom edge after the last fold (``R`` cycles).
    """

    key: str
    name: str
    held: str
    horizontal: str
    vertical: str
    rows_hold: str
    cols_hold: str
    streams: str
    preload: bool
    shift_out: bool

    def dims(self, m: int, k: int, n: int) -> tuple[int, int, int]:
        """(extent along the array's rows, extent along its columns, vectors per fold T)."""
        ext = {"M": m, "K": k, "N": n}
        return ext[self.rows_hold], ext[self.cols_hold], ext[self.streams]

    def grid(self, m: int, k: int, n: int, rows: int, cols: int) -> "FoldGrid":
        """The folds of an M x K x N matmul on a ``rows x cols`` array."""
        rd, cd, _ = self.dims(m, k, n)
        return FoldGrid.of(rd, cd, rows, cols)

    def fold_cycles(self, t: int, rows: int, cols: int) -> int:
        """Cycles of one fold run alone: load (if any), then ``T`` vectors through the
        skewed array until the last result leaves the bottom-right cell."""
        return (rows if self.preload else 0) + t + rows + cols - 2


DATAFLOW: dict[str, Dataflow] = {d.key: d for d in (
    Dataflow("ws", "weight-stationary", "weight", "activation", "partial sum",
             rows_hold="K", cols_hold="N", streams="M", preload=True, shift_out=False),
    Dataflow("os", "output-stationary", "accumulator", "a", "b",
             rows_hold="M", cols_hold="N", streams="K", preload=False, shift_out=True),
    Dataflow("is", "input-stationary", "input", "weight", "partial sum",
             rows_hold="K", cols_hold="M", streams="N", preload=True, shift_out=False),
)}
DATAFLOWS = tuple(DATAFLOW)


@dataclasses.dataclass(frozen=True)
class FoldGrid:
    """Tiles of an ``rd x cd`` matrix on an ``R x C`` array, in the order they run.

    Folds run column tile outer, row tile inner (SCALE-Sim's order; for ``"ws"`` the K
    tiles of one N tile follow each other, so their partial sums accumulate);
    ``rows_used``/``cols_used`` are the cells each fold really fills.
    """

    row_tiles: int
    col_tiles: int
    folds: tuple[tuple[int, int], ...]
    rows_used: tuple[int, ...]
    cols_used: tuple[int, ...]

    @classmethod
    def of(cls, rd: int, cd: int, R: int, C: int) -> "FoldGrid":
        nrb, ncb = math.ceil(rd / R), math.ceil(cd / C)
        folds = tuple((rb, cb) for cb in range(ncb) for rb in range(nrb))
        return cls(nrb, ncb, folds, tuple(min(R, rd - rb * R) for rb, _ in folds),
                   tuple(min(C, cd - cb * C) for _, cb in folds))

    def __len__(self) -> int:
        return len(self.folds)


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------


def positive_int_error(v: Any) -> type[errors.CourseError]:
    """The error class for a value that is not a positive integer: type or value."""
    wrong_type = isinstance(v, bool) or not isinstance(v, (int, np.integer))
    return errors.CourseTypeError if wrong_type else errors.CourseValueError


def check_sizes(**sizes: Any) -> None:
    """The matmul's extents M, K, N: positive integers."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise positive_int_error(v)(f"{name} must be a positive integer, got {v!r}")


def check_array_size(rows: Any, cols: Any) -> None:
    for name, v in (("rows", rows), ("cols", cols)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise positive_int_error(v)(
                f"{name} must be a positive integer (the array's {name}), got {v!r}; "
                "for example rows=4, cols=4 for a toy array or 128, 128 for a TPU v5e MXU"
            )


def check_dataflow(dataflow: Any, timing: Any = "tpu") -> Dataflow:
    """The :class:`Dataflow` named ``dataflow``, after checking it and ``timing``."""
    if not isinstance(dataflow, str) or dataflow not in DATAFLOW:
        raise errors.CourseValueError(
            f"unknown dataflow {dataflow!r}; expected one of {DATAFLOWS}: "
            + ", ".join(f"{d.key!r} ({d.name}{', the TPU MXU' if d.key == 'ws' else ''})"
                        for d in DATAFLOW.values())
        )
    if not isinstance(timing, str) or timing not in TIMINGS:
        raise errors.CourseValueError(
            f"unknown timing {timing!r}; expected 'tpu' (double-buffered weights, "
            "in-place accumulation) or 'scalesim' (SCALE-Sim 3.0.0's conventions)"
        )
    return DATAFLOW[dataflow]


def check_operands(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
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


def acc_dtype(a: np.ndarray, b: np.ndarray) -> np.dtype:
    """Integers accumulate in int64 (bit-exact); floats in their common float type."""
    dt = np.result_type(a.dtype, b.dtype)
    if dt == np.bool_ or np.issubdtype(dt, np.integer):
        return np.dtype(np.int64)
    if np.issubdtype(dt, np.complexfloating):
        return dt
    if dt.itemsize < 4:  # float16 and friends: accumulate in float32, as an MXU does
        return np.dtype(np.float32)
    return dt


def _checked(M: Any, K: Any, N: Any, rows: Any, cols: Any, dataflow: Any,
             timing: Any = "tpu") -> Dataflow:
    df = check_dataflow(dataflow, timing)
    check_array_size(rows, cols)
    check_sizes(M=M, K=K, N=N)
    return df


# --------------------------------------------------------------------------------------
# The closed form
# --------------------------------------------------------------------------------------


def fold_count(M: int, K: int, N: int, rows: int, cols: int, dataflow: str = "ws") -> int:
    """How many tiles (folds) of a ``rows x cols`` array an M x K x N matmul needs.

    >>> fold_count(100, 100, 100, 128, 128), fold_count(512, 512, 512, 128, 128)
    (1, 16)
    """
    df = _checked(M, K, N, rows, cols, dataflow)
    rd, cd, _ = df.dims(M, K, N)
    return math.ceil(rd / rows) * math.ceil(cd / cols)


def closed_form_cycles(df: Dataflow, M: int, K: int, N: int, R: int, C: int, timing: str) -> int:
    """:func:`cycle_count` for arguments already checked."""
    rd, cd, t = df.dims(M, K, N)
    f = math.ceil(rd / R) * math.ceil(cd / C)
    if timing == "scalesim":
        return f * df.fold_cycles(t, R, C) - 1
    preload = R if df.preload else 0
    return preload + (f - 1) * max(t, R) + t + R + C - 2 + (R if df.shift_out else 0)


def cycle_count(M: int, K: int, N: int, rows: int, cols: int, dataflow: str = "ws",
                timing: str = "tpu") -> int:
    """Closed-form cycle count of ``simulate`` for C[M x N] = A[M x K] @ B[K x N].

    Derivation (``R`` rows, ``C`` cols, ``F`` folds, ``T`` vectors per fold; the table
    :data:`DATAFLOW` maps M, K, N to them).

    *One fold's stream.* The vector that enters first reaches cell ``(k, j)`` ``k + j``
    cycles after the stream starts (the edge skew plus one hop per column). Vector ``i``
    enters ``i`` cycles after the first, so the last one, ``i = T - 1``, reaches the
    bottom-right cell ``(R - 1, C - 1)`` at ``T - 1 + R - 1 + C - 1``; its result leaves
    at the end of that cycle. Counting from 0, the stream occupies
    ``T + R + C - 2`` cycles. For ``"os"`` the same holds with ``T = K``: the last
    operands meet in the corner cell ``K - 1 + R - 1 + C - 1`` cycles after the start.

    *Weight load.* ``R`` cycles: the load path shifts one row per cycle, and column 0 is
    latched after ``R`` shifts, just before the first activation reaches it.

    ``"scalesim"``: folds run one after another, each ``P + T + R + C - 2`` cycles
    (:meth:`Dataflow.fold_cycles`) with ``P = R`` (load) for ``"ws"``/``"is"`` and
    ``P = 0`` for ``"os"``; SCALE-Sim reports the last cycle's number, one less than
    the count::

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
    df = _checked(M, K, N, rows, cols, dataflow, timing)
    return closed_form_cycles(df, M, K, N, int(rows), int(cols), timing)


def utilization(M: int, K: int, N: int, rows: int, cols: int, dataflow: str = "ws",
                timing: str = "tpu") -> float:
    """Closed-form utilisation: ``M*K*N / (rows * cols * cycle_count(...))``.

    >>> round(utilization(100, 100, 100, 128, 128), 3), round(utilization(10_000, 10_000, 10_000, 128, 128), 3)
    (0.127, 0.978)
    """
    cycles = cycle_count(M, K, N, rows, cols, dataflow, timing)  # checks every argument
    return M * K * N / (rows * cols * max(1, cycles))


def reference_matmul(a: Any, b: Any, rows: int, cols: int = 1, dataflow: str = "ws") -> np.ndarray:
    """``a @ b`` accumulated in the order the simulator uses (a plain loop over k).

    ``"ws"``/``"is"``: each K tile of ``rows`` is summed k by k starting from the first
    product, then the tiles' partial sums are added in order; ``"os"``: one running sum
    over all of K. Same dtypes as ``simulate`` (int64 for integers).

    >>> import numpy as np
    >>> x = np.array([[1e8, 1.0, -1e8, 1.0]], np.float32); y = np.ones((4, 1), np.float32)
    >>> float(reference_matmul(x, y, rows=2)[0, 0]), float(reference_matmul(x, y, rows=4)[0, 0])
    (0.0, 1.0)
    """
    a, b = check_operands(a, b)
    check_array_size(rows, cols)
    df = check_dataflow(dataflow)
    acc = acc_dtype(a, b)
    a, b = a.astype(acc), b.astype(acc)
    m, k = a.shape
    out = np.zeros((m, b.shape[1]), acc)
    step = rows if df.rows_hold == "K" else k   # K tiled along the rows, or one running sum
    for k0 in range(0, k, step):
        part = a[:, k0, None] * b[None, k0, :]
        for kk in range(k0 + 1, min(k, k0 + step)):
            part = part + a[:, kk, None] * b[None, kk, :]
        out = out + part
    return out

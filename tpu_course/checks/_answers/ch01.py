"""Lab 1's own answers, for its checkers only (private: an answer that is, or calls, one of
these, or the ``systolic`` helper that computes the same result, is refused, since the
learner writes it).

Exercise 1's cycle of the weight-stationary array is written here in numpy (its checker
grades against the simulator's own trace, ``systolic.simulate(..., trace=True)``, and a
test holds the two equal); Exercise 4's smallest batch comes from ``systolic.utilization``
(the closed form a test holds equal to the simulator), Exercise 5's fastest dataflow from
``systolic.cycle_count``, and Exercise 6's stall from a bf16 running sum done bit by bit
in numpy.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from tpu_course import systolic

# ------------------------------------------------------------------------ Exercise 1


def ws_cycle(w: np.ndarray, act: np.ndarray, psum: np.ndarray, a: np.ndarray,
             s: int) -> tuple[np.ndarray, np.ndarray]:
    """One cycle of a weight-stationary array holding ``w`` (R x C) while ``a`` (M x K,
    K <= R) streams: the activation and partial-sum registers at the end of stream cycle
    ``s`` from those at the end of cycle ``s - 1``."""
    rows = w.shape[0]
    m, k = a.shape
    x = np.zeros(rows, np.result_type(act, a))
    for r in range(min(rows, k)):
        if 0 <= s - r < m:
            x[r] = a[s - r, r]
    act = np.hstack([x[:, None], act[:, :-1]])
    psum = np.vstack([np.zeros_like(psum[:1]), psum[:-1]]) + act * w
    return act, psum


# ------------------------------------------------------------------------ Exercise 4


def smallest_batch(K: int, N: int, rows: int, cols: int, max_waste: float = 0.1) -> int | None:
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


# ------------------------------------------------------------------------ Exercise 5


def dataflow_cycles(M: int, K: int, N: int, rows: int, cols: int) -> dict[str, int]:
    """Cycles of each dataflow (``timing="tpu"``) for an M x K x N GEMM on the array."""
    return {d: systolic.cycle_count(M, K, N, rows, cols, d) for d in systolic.DATAFLOWS}


def best_dataflows(M: int, K: int, N: int, rows: int, cols: int) -> list[str]:
    """The dataflows with the fewest cycles (several on a tie), sorted."""
    counts = dataflow_cycles(M, K, N, rows, cols)
    best = min(counts.values())
    return sorted(d for d, v in counts.items() if v == best)


# ------------------------------------------------------------------------ Exercise 6


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


@functools.lru_cache(maxsize=16)
def stall(term: float) -> float:
    """Where a bf16 running sum of ``term`` stops growing (summed until well past it)."""
    return bf16_running_sum(np.full(int(8 / term * 256), term, np.float32))

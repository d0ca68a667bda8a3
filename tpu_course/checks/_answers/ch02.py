"""The course's own answers to lab 2 (private: the checkers refuse them as answers)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def matmul_flops(m: int, k: int, n: int) -> int:
    """Exercise 1: an (m x k) @ (k x n) matmul does 2·m·k·n FLOPs."""
    return 2 * m * k * n


def time_call(fn: Callable[..., Any], *args: Any, repeats: int = 5) -> float:
    """Exercise 2: seconds per call, after an untimed warm-up, waiting for the whole
    result, the median of ``repeats`` calls."""
    import jax

    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def h2d_bandwidth(host_array: Any, repeats: int = 5) -> float:
    """Exercise 3: bytes per second of ``jax.device_put``, after a warm-up copy."""
    import jax

    jax.device_put(host_array).block_until_ready()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.device_put(host_array).block_until_ready()
        samples.append(time.perf_counter() - start)
    return host_array.nbytes / statistics.median(samples)


def fraction_of_peak(flops: float, seconds: float, chip: str) -> float:
    """Exercise 5: achieved FLOP/s over the chip's dense bf16 peak."""
    from tpu_course import hardware

    return flops / seconds / hardware.get(chip).peak_bf16_flops_per_s

"""Lab 2 checkers accept the solution and reject the classic mistakes, naming them."""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from tpu_course import hardware
from tpu_course.checks import ch02


def test_matmul_flops():
    assert ch02.check_matmul_flops(lambda m, k, n: 2 * m * k * n)
    r = ch02.check_matmul_flops(lambda m, k, n: m * k * n)
    assert not r and "multiply-accumulates" in r.message
    r = ch02.check_matmul_flops(lambda m, k, n: 2 * m * n)
    assert not r and "dimension is missing" in r.message


def test_fraction_of_peak():
    right = lambda f, s, c: f / s / hardware.get(c).peak_bf16_flops_per_s  # noqa: E731
    assert ch02.check_fraction_of_peak(right)
    r = ch02.check_fraction_of_peak(lambda f, s, c: 100 * right(f, s, c))
    assert not r and "percentage" in r.message
    r = ch02.check_fraction_of_peak(lambda f, s, c: 1 / right(f, s, c))
    assert not r and "inverse" in r.message


def _timed(fn, x, warm: bool, wait: bool) -> float:
    if warm:
        jax.block_until_ready(fn(x))
    samples = []
    for _ in range(5 if warm else 1):
        start = time.perf_counter()
        out = fn(x)
        if wait:
            jax.block_until_ready(out)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def test_time_call_accepts_a_correct_timer():
    assert ch02.check_time_call(lambda fn, x: _timed(fn, x, warm=True, wait=True))


def test_time_call_catches_missing_wait():
    r = ch02.check_time_call(lambda fn, x: _timed(fn, x, warm=True, wait=False))
    assert not r and "dispatch" in r.message


def test_time_call_catches_missing_warmup():
    r = ch02.check_time_call(lambda fn, x: _timed(fn, x, warm=False, wait=True))
    assert not r and "compilation" in r.message


def test_h2d_bandwidth():
    def right(host):
        start = time.perf_counter()
        jax.device_put(host).block_until_ready()
        return host.nbytes / (time.perf_counter() - start)

    assert ch02.check_h2d_bandwidth(right)
    r = ch02.check_h2d_bandwidth(lambda host: right(host) / 1e9)
    assert not r and "GB/s" in r.message
    r = ch02.check_h2d_bandwidth(lambda host: -1.0)
    assert not r


def test_transfer_sweep_measures_every_size():
    from tpu_course import transfer

    sweep = transfer.measure_transfers([4096, 2**20], repeats=2)
    assert [p.n_bytes for p in sweep.points] == [4096, 2**20]
    assert all(p.h2d_s > 0 and p.d2h_s > 0 for p in sweep.points)
    assert "CPU" in str(sweep) and sweep.best() == max(p.h2d_bytes_per_s for p in sweep.points)


def test_transfer_rejects_odd_sizes():
    import pytest

    from tpu_course import transfer

    with pytest.raises(ValueError, match="multiples of 4"):
        transfer.measure_transfers([6])
    assert np.float32(0).nbytes == 4

"""Checkers for lab 2: FLOP counts, timing a call correctly, transfer bandwidth, peak."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import numpy as np

from tpu_course import hardware
from tpu_course.checks._core import CheckResult, fail, ok


def check_matmul_flops(matmul_flops: Callable[[int, int, int], float]) -> CheckResult:
    """Exercise 1: FLOPs of an (m x k) @ (k x n) matmul are 2·m·k·n."""
    name = "Exercise 1 (matmul FLOPs)"
    for m, k, n in ((2, 3, 4), (128, 256, 512), (1, 1000, 7)):
        want = 2 * m * k * n
        got = matmul_flops(m, k, n)
        if got == want:
            continue
        if got == m * k * n:
            return fail(name, f"for {m}x{k} @ {k}x{n} you returned {got}, the number of "
                              "multiply-accumulates; each MAC is a multiply and an add, 2 FLOPs.")
        if got in (2 * m * n, 2 * m * k, 2 * k * n):
            return fail(name, f"got {got}: one dimension is missing; every output element "
                              f"c[i,j] needs k={k} multiply-adds.")
        return fail(name, f"for ({m}x{k}) @ ({k}x{n}) expected {want} FLOPs, got {got}.")
    return ok(name, "2·m·k·n: one multiply and one add per (i, j, k) triple.")


def check_fraction_of_peak(fraction_of_peak: Callable[[float, float, str], float]) -> CheckResult:
    """Exercise 4: achieved FLOP/s over the chip's dense bf16 peak, as a fraction."""
    name = "Exercise 4 (fraction of peak)"
    chip = hardware.get("v5e")
    flops, seconds = 2 * 8192**3, 0.01
    peak = hardware.peak_flops_per_s(chip)
    want = flops / seconds / peak
    got = fraction_of_peak(flops, seconds, "v5e")
    if np.isclose(got, want, rtol=1e-6):
        return ok(name, f"{got:.3f} of the v5e's {peak / 1e12:.0f} TFLOP/s.")
    if np.isclose(got, 100 * want, rtol=1e-6):
        return fail(name, f"got {got:.1f}: that is a percentage; return a fraction ({want:.3f}).")
    if np.isclose(got, 1 / want, rtol=1e-6):
        return fail(name, f"got {got:.3f}, the inverse of the answer: divide achieved FLOP/s "
                          "(flops / seconds) by the peak.")
    if np.isclose(got, flops * seconds / peak, rtol=1e-6):
        return fail(name, "you multiplied by the time: achieved FLOP/s is flops / seconds.")
    return fail(name, f"for {flops:.3g} FLOPs in {seconds} s on a v5e expected {want:.3f}, got {got}. "
                      "Take the peak from tpu_course.hardware.get(chip).peak_bf16_flops_per_s.")


def _slow_pair() -> tuple[Callable, Any]:
    """A fresh jitted function returning a pytree whose leaves take real time."""
    import jax
    import jax.numpy as jnp

    def two_outputs(x):
        y = x
        for _ in range(4):
            y = jnp.tanh(y @ x)
        return {"small": x[:1] * 2.0, "big": y}

    x = jax.random.normal(jax.random.key(0), (768, 768), jnp.float32)
    return jax.jit(two_outputs), x


def check_time_call(time_call: Callable[..., float]) -> CheckResult:
    """Exercise 2: seconds per call, with a warm-up and waiting for the whole result.

    The reference is :func:`tpu_course.bench.benchmark` on the same function; the
    learner's median must be within a factor of 2.5 of it (a CPU is noisy, but the
    mistakes are off by 10x or more: no wait measures dispatch only, no warm-up
    measures the compiler).
    """
    from tpu_course import bench

    name = "Exercise 2 (timing a call)"
    fn, x = _slow_pair()
    got = time_call(fn, x)
    ref = bench.benchmark(fn, x, repeats=5, min_time=0.2, warn=False)
    if not isinstance(got, (float, int)) or got <= 0:
        return fail(name, f"return the time per call in seconds (a positive float), got {got!r}.")
    ratio = got / ref.median_s
    if ratio < 0.3:
        return fail(name, f"you measured {got * 1e3:.3f} ms but the call takes about "
                          f"{ref.median_s * 1e3:.1f} ms: you timed the dispatch only. Wait for "
                          "every output with jax.block_until_ready(result) before stopping the clock.")
    if ratio > 2.5:
        if ref.compile_time_s and got >= 0.5 * ref.compile_time_s:
            return fail(name, f"you measured {got * 1e3:.1f} ms against {ref.median_s * 1e3:.1f} ms "
                              f"per call, and compiling takes {ref.compile_time_s * 1e3:.0f} ms: "
                              "your timing includes the compilation. Call the function once "
                              "before timing (warm-up).")
        return fail(name, f"you measured {got * 1e3:.1f} ms, the harness {ref.median_s * 1e3:.1f} ms "
                          "per call. Time several calls and take the median.")
    return ok(name, "your time per call agrees with the benchmark harness (within a factor of "
                    "2.5): warmed up, and waiting for the whole result.")


def check_h2d_bandwidth(h2d_bandwidth: Callable[[np.ndarray], float]) -> CheckResult:
    """Exercise 3: host-to-device bandwidth in bytes per second for one array."""
    from tpu_course import transfer

    name = "Exercise 3 (host-to-device bandwidth)"
    host = np.random.default_rng(1).random(2**22, dtype=np.float32)  # 16 MiB
    got = h2d_bandwidth(host)
    ref = host.nbytes / statistics.median(transfer.time_h2d(host) for _ in range(5))
    if not isinstance(got, (float, int)) or got <= 0:
        return fail(name, f"return bytes per second (a positive float), got {got!r}.")
    if got < 1e6 <= ref:
        return fail(name, f"got {got:.3g}; that looks like GB/s or seconds. Return bytes/s "
                          f"(about {ref:.3g} here).")
    if not 0.1 <= got / ref <= 10:
        return fail(name, f"got {got / 1e9:.2f} GB/s, the reference measured {ref / 1e9:.2f} GB/s. "
                          "Divide array.nbytes by the seconds from device_put to block_until_ready.")
    return ok(name, "bytes per second, within a factor of 10 of the reference measurement "
                    "on this runtime.")

"""Tests for tpu_course.bench: each timing mistake the harness claims to prevent."""

from __future__ import annotations

import itertools
import time

import jax
import jax.numpy as jnp
import pytest

from tpu_course import bench, hardware


def _chain(a):
    """Chained matmuls: tens of milliseconds on a small CPU (and on a GPU at its size)."""
    for _ in range(8 if jax.default_backend() == "cpu" else 40):
        a = jnp.tanh(a @ a)
    return a


def test_a_pytree_output_is_waited_on_leaf_by_leaf():
    fast = jax.jit(lambda a: a[0, 0] + 1.0)
    slow = jax.jit(_chain)
    n = 512 if jax.default_backend() == "cpu" else 8192
    a = jnp.ones((n, n)) / n

    def two_outputs(a):
        # two separate dispatches: the fast result is ready long before the slow one
        return {"fast": fast(a), "slow": slow(a)}

    jax.block_until_ready(two_outputs(a))
    slow_s = naive_s = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(slow(a))
        slow_s = min(slow_s, time.perf_counter() - start)
        # the mistake the harness avoids: waiting on the first leaf only
        start = time.perf_counter()
        out = two_outputs(a)
        out["fast"].block_until_ready()
        naive_s = min(naive_s, time.perf_counter() - start)
        jax.block_until_ready(out)
    assert naive_s < 0.5 * slow_s, "precondition: dispatch is asynchronous here"

    r = bench.benchmark(two_outputs, a, repeats=3, min_time=0.0, number=1, warn=False)
    assert r.min_s > 0.5 * slow_s


def test_block_waits_for_every_leaf():
    calls = []

    class Leaf:
        def __init__(self, i):
            self.i = i

        def block_until_ready(self):
            calls.append(self.i)
            return self

    tree = {"a": Leaf(0), "b": [Leaf(1), (Leaf(2), 3.0)]}
    assert bench.block(tree) is tree
    assert sorted(calls) == [0, 1, 2]


def test_compile_time_is_measured_apart_and_not_in_the_samples():
    def many_ops(x):
        for i in range(150):
            x = jnp.sin(x) * (1.0 + i / 1000)
        return x

    r = bench.benchmark(jax.jit(many_ops), jnp.ones(8), repeats=5, min_time=0.0, warn=False)
    assert r.compile_time_s is not None
    assert max(r.times_s) < 0.2 * r.compile_time_s  # no sample paid for the compiler
    assert r.recompilations == 0
    assert r.warmup >= 1


def test_a_recompile_during_timing_is_reported():
    counter = itertools.count()
    total = jax.jit(lambda a: a.sum())

    def new_shape_each_call(a):
        return total(a[: next(counter) % 40 + 1])  # a new shape -> a new compile

    with pytest.warns(bench.BenchmarkWarning, match="compilation"):
        r = bench.benchmark(new_shape_each_call, jnp.ones(64), repeats=5, min_time=0.0,
                            number=1)
    assert r.recompilations > 0
    assert any("compilation" in w for w in r.warnings)


def test_a_stable_function_reports_no_recompile():
    f = jax.jit(lambda a: a * 2)
    r = bench.benchmark(f, jnp.ones(64), repeats=5, min_time=0.0, warn=False)
    assert r.recompilations == 0


def test_a_noisy_timing_is_flagged():
    flip = itertools.cycle([0.001, 0.012])

    def jittery(a):
        time.sleep(next(flip))
        return a

    with pytest.warns(bench.BenchmarkWarning, match="spread"):
        r = bench.benchmark(jittery, jnp.ones(4), repeats=8, min_time=0.0, number=1,
                            flops=1.0, bytes_accessed=1.0)
    assert r.spread > bench.SPREAD_WARN


def test_flops_rate_and_json_round_trip():
    n = 128
    f = jax.jit(lambda a, b: a @ b)
    r = bench.benchmark(f, jnp.ones((n, n)), jnp.ones((n, n)), repeats=3, min_time=0.0,
                        warn=False)
    if jax.default_backend() == "cpu":
        assert r.flops == 2 * n**3  # from XLA's cost analysis
    else:  # GPU library matmuls may count a little extra (or nothing: None)
        assert r.flops is None or r.flops == pytest.approx(2 * n**3, rel=0.05)
    if r.flops is None:
        return
    assert r.flops_per_s == pytest.approx(r.flops / r.median_s)
    if jax.default_backend() == "cpu":
        assert r.platform == "cpu" and r.chip is None and r.fraction_of_peak is None
        assert "CPU timing" in str(r)
    assert "<table>" in r._repr_html_()
    again = bench.BenchResult.from_json(r.to_json())
    assert again == r and again.median_s == r.median_s


def test_fraction_of_peak_uses_the_hardware_table():
    base = bench.BenchResult(
        name="x", times_s=(1e-3, 1e-3, 1e-3), number=1, compile_time_s=0.1, first_call_s=0.1,
        warmup=1, flops=197e9 / 2, bytes_accessed=None, platform="tpu", device_kind="TPU v5 lite",
        chip="v5e", peak_flops_per_s=hardware.get("v5e").peak_bf16_flops_per_s,
        peak_name="bf16 dense", recompilations=0)
    assert base.fraction_of_peak == pytest.approx(0.5)  # 98.5 TFLOP/s of 197
    assert bench.device_peak(hardware.get("h100"), "fp32") == (67e12, "fp32")
    assert bench.device_peak(None, "bf16") == (None, "unknown")


@pytest.mark.parametrize("name", ["v2", "v3", "7x"])
def test_one_device_of_a_two_device_chip_is_compared_with_half_the_chip(name):
    """On v2, v3 and 7x each TensorCore is a JAX device: a one-device benchmark reaching
    half the chip's peak is at 100 % of what that device can do."""
    chip = hardware.get(name)
    assert chip.devices_per_chip == 2
    peak, label = bench.device_peak(chip)
    assert peak == chip.peak_bf16_flops_per_s / 2
    assert "chip peak / 2" in label
    r = bench.BenchResult(
        name="x", times_s=(1.0,), number=1, compile_time_s=None, first_call_s=1.0, warmup=1,
        flops=chip.peak_bf16_flops_per_s / 2, bytes_accessed=None, platform="tpu",
        device_kind=chip.device_kinds[0], chip=name, peak_flops_per_s=peak, peak_name=label,
        recompilations=0)
    assert r.fraction_of_peak == pytest.approx(1.0)


def test_megacore_and_gpu_chips_are_one_device():
    for name in ("v4", "v5e", "v5p", "v6e", "h100"):
        chip = hardware.get(name)
        assert bench.device_peak(chip)[0] == chip.peak_bf16_flops_per_s, name


def test_t4_bf16_is_compared_with_its_fp32_peak_and_says_so():
    peak, label = bench.device_peak(hardware.get("t4"))
    assert peak == hardware.get("t4").peak_fp32_flops_per_s
    assert "no bf16" in label and "fp32" in label
    assert bench.device_peak(hardware.get("t4"), "fp16")[0] == 65e12


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="repeats"):
        bench.benchmark(jnp.sin, jnp.ones(2), repeats=0)

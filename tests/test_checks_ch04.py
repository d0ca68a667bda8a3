"""Lab 4 checkers accept right answers and reject plausible wrong ones, saying why."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import pytest

from tpu_course import hlo
from tpu_course.checks import ch04


def test_matmul_flops():
    assert ch04.check_matmul_flops(2 * 64 * 128 * 32, 64, 128, 32)
    r = ch04.check_matmul_flops(64 * 128 * 32, 64, 128, 32)
    assert not r and "multiply-adds" in r.message
    assert not ch04.check_matmul_flops(64 * 128 * 32 * 3, 64, 128, 32)
    assert not ch04.check_matmul_flops("lots", 64, 128, 32)
    assert "XLA" in ch04.check_matmul_flops(2 * 8 * 8 * 8, 8, 8, 8, xla_flops=1024).message


def test_matmul_bytes_catches_dtype_and_missing_output():
    m, k, n = 256, 512, 128
    right = (m * k + k * n + m * n) * 2
    assert ch04.check_matmul_bytes(right, m, k, n, "bf16")
    r = ch04.check_matmul_bytes(right * 2, m, k, n, "bf16")  # used 4 bytes per element
    assert not r and "4-byte" in r.message
    r = ch04.check_matmul_bytes((m * k + k * n) * 2, m, k, n, "bf16")
    assert not r and "output" in r.message
    assert ch04.check_matmul_bytes(right * 2, m, k, n, "fp32")


def test_intensity_and_its_inverse():
    m = k = n = 1024
    want = 2 * m * k * n / ((m * k + k * n + m * n) * 2)
    assert ch04.check_intensity(want * 1.01, m, k, n)
    r = ch04.check_intensity(1 / want, m, k, n)
    assert not r and "bytes per FLOP" in r.message
    assert not ch04.check_intensity(want * 1.5, m, k, n)


def test_bound_on_v5e_and_v6e():
    # v5e ridge ~240, v6e ridge ~560: intensity 400 is compute-bound on one, memory on the other
    assert ch04.check_bound("compute", 400, "v5e")
    assert ch04.check_bound("memory-bound", 400, "v6e")
    r = ch04.check_bound("compute", 400, "v6e")
    assert not r and "560" in r.message
    assert not ch04.check_bound("fast", 400, "v5e")


def test_roofline_time_rejects_a_sum_and_the_wrong_roof():
    flops, nbytes = 2 * 4096**3, 3 * 4096**2 * 2
    compute_s, memory_s = flops / 197e12, nbytes / 819e9
    assert ch04.check_roofline_time(max(compute_s, memory_s), flops, nbytes, "v5e")
    r = ch04.check_roofline_time(compute_s + memory_s, flops, nbytes, "v5e")
    assert not r and "overlap" in r.message
    r = ch04.check_roofline_time(memory_s, flops, nbytes, "v5e")
    assert not r and "memory time" in r.message


def test_xla_flops_hand_count_of_a_layer():
    B, D, H = 32, 256, 128
    args = (jax.ShapeDtypeStruct((B, D), jnp.float32), jax.ShapeDtypeStruct((D, H), jnp.float32),
            jax.ShapeDtypeStruct((H,), jnp.float32))

    def layer(x, w, b):
        return jax.nn.relu(x @ w + b)

    r = ch04.check_xla_flops(2 * B * D * H, layer, *args)
    assert r and "elementwise" in r.message  # close, and the gap explained
    r = ch04.check_xla_flops(B * D * H, layer, *args)
    assert not r and "multiply-adds" in r.message


def test_padded_bytes_model_and_compiler():
    assert ch04.tpu_padded_bytes((100, 100), "fp32") == 104 * 128 * 4
    assert ch04.tpu_padded_bytes((2, 129, 128), "bf16") == 2 * 136 * 128 * 2
    assert ch04.check_padded_bytes(104 * 128 * 4, (100, 100), "fp32")
    r = ch04.check_padded_bytes(100 * 100 * 4, (100, 100), "fp32")
    assert not r and "logical" in r.message
    with pytest.raises(ValueError):
        ch04.tpu_padded_bytes((1000,))


@pytest.mark.aot
def test_padding_model_agrees_with_the_tpu_compiler():
    if not hlo.tpu_compiler_available():
        pytest.skip(hlo.tpu_compiler_problem())
    for shape, dtype in (((100, 100), jnp.float32), ((129, 128), jnp.float32),
                         ((100, 100), jnp.bfloat16), ((8, 128), jnp.bfloat16)):
        r = hlo.inspect(lambda x: x + 1, jax.ShapeDtypeStruct(shape, dtype), target="v5e:1x1")
        name = "bf16" if dtype == jnp.bfloat16 else "fp32"
        assert r.argument_bytes == ch04.tpu_padded_bytes(shape, name), (shape, name)


def test_timing_flags_missing_block_and_timed_compile():
    f = jax.jit(lambda a: jnp.tanh(a @ a))
    a = jnp.ones((256, 256))
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    assert ch04.check_timing(best, f, a)
    r = ch04.check_timing(best / 100, f, a)
    assert not r and "block_until_ready" in r.message
    r = ch04.check_timing(best * 100, f, a)
    assert not r and "compile" in r.message

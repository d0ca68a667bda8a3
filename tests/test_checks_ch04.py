"""Lab 4 checkers: right answers pass, plausible wrong ones fail with a hint and hide the
expected value behind ``answer``; garbage never raises."""

from __future__ import annotations

import math

import pytest

from tpu_course import hardware, hlo, roofline
from tpu_course.checks import NotWritten, ch04


def flops(m, k, n):
    return 2 * m * k * n


def nbytes(m, k, n, s):
    return (m * k + k * n + m * n) * s


def test_registry():
    lab = ch04.LAB
    assert len(lab.exercises) == 7 and {"transfer", "predict"} <= {e.kind for e in lab.exercises}
    assert lab.exercises[-1].needs == "tpu-compiler"


def test_matmul_flops():
    assert ch04.check_matmul_flops(flops)
    r = ch04.check_matmul_flops(lambda m, k, n: m * k * n)
    assert not r and "multiply-adds" in r.message and r.answer and "100,663,296" not in r.message
    assert not ch04.check_matmul_flops(lambda m, k, n: "256")
    assert not ch04.check_matmul_flops(lambda m, k, n: m * n)
    assert ch04.check_matmul_flops(NotWritten("Exercise 1")).status == "not written"


def test_matmul_bytes():
    assert ch04.check_matmul_bytes(nbytes)
    r = ch04.check_matmul_bytes(lambda m, k, n, s: (m * k + k * n) * s)
    assert not r and "output" in r.message
    r = ch04.check_matmul_bytes(lambda m, k, n, s: nbytes(m, k, n, 4))
    assert not r and "4-byte" in r.message
    r = ch04.check_matmul_bytes(lambda m, k, n, s: nbytes(m, k, n, 1))
    assert not r and "elements" in r.message


def roof(ai, chip):
    return "memory" if ai < chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s else "compute"


def test_roofs():
    good = lambda m, k, n, s: flops(m, k, n) / nbytes(m, k, n, s)  # noqa: E731
    assert ch04.check_roofs(good, roof)
    r = ch04.check_roofs(lambda *a: 1 / good(*a), roof)
    assert not r and "bytes per FLOP" in r.message
    r = ch04.check_roofs(good, lambda ai, chip: "memory")
    assert not r and "ridge" in r.hint and r.answer
    r = ch04.check_roofs(good, lambda ai, chip: "compute" if ai < 240 else "memory")
    assert not r
    assert not ch04.check_roofs(good, lambda ai, chip: True)


def fastest(f, b, chip):
    return max(f / chip.peak_bf16_flops_per_s, b / chip.hbm_bytes_per_s)


def test_roofline_time():
    assert ch04.check_roofline_time(fastest)
    r = ch04.check_roofline_time(lambda f, b, c: f / c.peak_bf16_flops_per_s + b / c.hbm_bytes_per_s)
    assert not r and "added" in r.message
    r = ch04.check_roofline_time(lambda f, b, c: min(f / c.peak_bf16_flops_per_s, b / c.hbm_bytes_per_s))
    assert not r and "smaller" in r.message
    r = ch04.check_roofline_time(lambda f, b, c: 1e6 * fastest(f, b, c))
    assert not r and "microseconds" in r.message


def test_layer_flops_against_xla():
    assert ch04.check_xla_flops(lambda B, D, H: 2 * B * D * H + 2 * B * H)
    assert ch04.check_xla_flops(lambda B, D, H: 2 * B * D * H)  # within 5%: the gap is explained
    r = ch04.check_xla_flops(lambda B, D, H: B * D * H)
    assert not r and "multiply-adds" in r.hint
    assert not ch04.check_xla_flops(lambda B, D, H: None)


def test_tpu_padded_bytes_model_and_checker():
    assert ch04.tpu_padded_bytes((100, 100), "fp32") == 104 * 128 * 4
    with pytest.raises(ValueError):
        ch04.tpu_padded_bytes((100,), "fp32")
    good = lambda r, c, s: math.ceil(r / 8) * 8 * math.ceil(c / 128) * 128 * s  # noqa: E731
    assert ch04.check_padded_bytes(good)
    r = ch04.check_padded_bytes(lambda r, c, s: r * c * s)
    assert not r and "logical" in r.message and r.answer
    r = ch04.check_padded_bytes(lambda r, c, s: math.ceil(r / 128) * 128 * math.ceil(c / 8) * 8 * s)
    assert not r


def test_layer_norm_is_skipped_or_graded():
    t, f = ch04.LN_SHAPE
    right = (7 * t * f, 4 * t * f, "memory")
    if hlo.tpu_compiler_problem() is not None:
        assert ch04.check_layer_norm(*right).status == "skipped"
        return
    assert ch04.check_layer_norm(*right)
    r = ch04.check_layer_norm(t * f, 4 * t * f, "memory")  # one FLOP per element
    assert not r and "FLOPs" in r.message and r.answer
    r = ch04.check_layer_norm(7 * t * f, 8 * t * f, "memory")  # float32 bytes
    assert not r and "bf16" in r.hint
    r = ch04.check_layer_norm(7 * t * f, 4 * t * f, "compute")
    assert not r and "not compute-bound" in r.message
    assert not ch04.check_layer_norm("7", 4 * t * f, "memory")
    assert not ch04.check_layer_norm(7 * t * f, 4 * t * f, "fast")


def test_scorecard_of_an_empty_namespace():
    total = ch04.LAB.scorecard({}).total()
    assert total in ("Lab 4: 0 of 7 passed", "Lab 4: 0 of 6 passed, 1 skipped")

"""Lab 4's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check); shortcuts fail.

XLA's counts are cached per input (the instruments are pure functions of it), and the TPU
compile of Exercise 6 is made once per session, so the file stays cheap."""

from __future__ import annotations

import functools
import math

import jax
import pytest

import grading
from grading import ch04 as keys
from tests import assess
from tpu_course import hlo
from tpu_course.checks import NotWritten, ch04

LAB = 4
HAS_TPU_COMPILER = hlo.tpu_compiler_problem() is None
T, F = ch04.LN_SHAPE


_truth = ch04.layer_norm_truth


@functools.lru_cache(maxsize=None)
def _layer_norm_truth():
    return _truth()


@pytest.fixture(autouse=True)
def _cached_instruments(monkeypatch):
    monkeypatch.setattr(ch04, "xla_counts", _xla_counts)
    monkeypatch.setattr(ch04, "xla_layer_flops", _xla_layer_flops)
    monkeypatch.setattr(ch04, "layer_norm_truth", _layer_norm_truth)


_xla_counts = functools.lru_cache(maxsize=None)(ch04.xla_counts)
_xla_layer_flops = functools.lru_cache(maxsize=None)(ch04.xla_layer_flops)


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    if ex.needs == "tpu-compiler" and not HAS_TPU_COMPILER:
        pytest.skip("needs the TPU compiler (libtpu)")
    assess.assert_mistake_named(ex, key, mistake)


def xla_cost(fn, *args):
    """Trace first, and read the analysis as a list or a dict."""
    compiled = jax.jit(fn).trace(*args).lower().compile()
    cost = compiled.cost_analysis()
    cost = cost if isinstance(cost, dict) else cost[0]
    return float(cost["flops"]), float(cost["bytes accessed"])


def compute_bound_batch(k, n, chip):
    """Search instead of solving."""
    ridge = chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s
    if 2 * k * n / (2 * (k + n)) <= ridge:
        return None
    m = 1
    while 2 * m * k * n < ridge * 2 * (m * k + k * n + m * n):
        m = m * 2 if 2 * (2 * m) * k * n < ridge * 2 * (2 * m * k + k * n + 2 * m * n) else m + 1
    return m


def chain_time_s(kernels, chip):
    """The attainable rate of each kernel, then its FLOPs over that rate."""
    total = 0.0
    for f, b in kernels:
        rate = min(chip.peak_bf16_flops_per_s, f / b * chip.hbm_bytes_per_s)
        total += f / rate
    return total


def layer_flops(B, D, H):
    return B * H * (2 * D + 1 + 1)  # per output: D multiply-adds, the bias add, the relu


def tpu_bytes(shape, itemsize):
    r, c = shape
    up = lambda x, to: (x + to - 1) // to * to
    return itemsize * min(up(r, 8) * up(c, 128), up(c, 8) * up(r, 128))


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 1", xla_cost),
    ("Exercise 2", compute_bound_batch),
    ("Exercise 3", chain_time_s),
    ("Exercise 4", layer_flops),
    ("Exercise 5", tpu_bytes),
    pytest.param("Exercise 6", {"predicted_ln_flops": 8 * T * F, "predicted_ln_bytes": 17e6,
                                "predicted_ln_roof": "Memory-bound"},
                 marks=pytest.mark.skipif(not HAS_TPU_COMPILER, reason="needs libtpu")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []


def test_predictions_that_ask_the_compiler_fail():
    def asks(M, D, H):
        S = jax.ShapeDtypeStruct
        return xla_cost(ch04.layer, S((M, D), "float32"), S((D, H), "float32"), S((H,), "float32"))[0]

    assess.failed(ch04.check_xla_flops(asks), "asks the compiler", "by hand")
    assess.failed(ch04.check_xla_flops(lambda M, D, H: hlo.inspect(
        ch04.layer, *(jax.ShapeDtypeStruct(s, "float32") for s in ((M, D), (D, H), (H,)))).flops),
        "asks the compiler")
    assert ch04.check_xla_cost(xla_cost).passed  # the compiler works again afterwards


def test_lookups_of_the_visible_answers_fail_hidden():
    seen = {}
    for case in ch04.check_xla_cost.exercise.cases:
        fn, args = ch04.cost_case(**case.args)
        seen[case.args["kind"]] = xla_cost(fn, *args)
    lookup = lambda f, *a: seen["layer" if len(a) == 3 else "softmax"]
    assert ch04.check_xla_cost(lookup).passed
    assess.failed(assess.graded(LAB, "Exercise 1", lookup), "not show")

    def typed_chip(k, n, chip):  # the v5e's ridge typed in for every chip
        r = 197e12 / 819e9
        room = 2 * k * n - 2 * r * (k + n)
        return None if room <= 0 else math.ceil(2 * r * k * n / room)

    assess.failed(assess.graded(LAB, "Exercise 2", typed_chip), "x, w and y")
    assert ch04.check_xla_flops(lambda M, D, H: 1_310_720).passed
    assess.failed(assess.graded(LAB, "Exercise 4", lambda M, D, H: 1_310_720), "not show")
    table = {(40, 300): 40 * 384 * 4, (17, 127): 24 * 128 * 2, (1000, 12): 16 * 1024 * 4}
    lookup = lambda s, i: table.get(tuple(s), s[0] * s[1] * i)
    assert ch04.check_tpu_bytes(lookup).passed
    assess.failed(assess.graded(LAB, "Exercise 5", lookup), "not show")


@pytest.mark.parametrize(("title", "answer", "words"), [
    ("Exercise 1", lambda f, *a: f(*a), ["ShapeDtypeStruct", "nothing needs to run"]),
    ("Exercise 1", lambda f, *a: jax.jit(f).lower(*a).compile().cost_analysis(), ["pair"]),
    ("Exercise 1", lambda f, *a: ("1", 2), ["string"]),
    ("Exercise 2", lambda k, n, c: "272", ["string"]),
    ("Exercise 3", lambda ks, c: None, ["number"]),
    ("Exercise 5", lambda s, i: 1 / 0, ["ZeroDivisionError"]),
    ("Exercise 3", lambda ks, c, memo=[]: memo.append(chain_time_s(ks, c)) or memo[0],
     ["your time is"]),  # keeps the first answer
])
def test_garbage_fails_with_a_hint(title, answer, words):
    assess.failed(ch04.LAB.find(title).check(answer), *words)


def test_the_layout_model_is_the_tpu_compilers():
    if not HAS_TPU_COMPILER:
        pytest.skip("needs the TPU compiler (libtpu)")
    S = jax.ShapeDtypeStruct
    for shape, size in [*((s, 4) for s in keys.ROW_MAJOR_WINS[:2]),
                        *((s, 2) for s in keys.COLUMN_MAJOR_WINS[:2]), ((17, 127), 2)]:
        dtype = {2: "bfloat16", 4: "float32"}[size]
        got = hlo.inspect(lambda x: x + 1, S(shape, dtype), target="v5e:1x1").argument_bytes
        assert got == keys.tpu_bytes(shape, size), (shape, size)


def test_layer_norm_and_the_scorecard():
    check = ch04.check_layer_norm
    unwritten = check(NotWritten("Exercise 6"), 1, "memory")
    assert unwritten.status == ("not written" if HAS_TPU_COMPILER else "skipped"), unwritten
    total = ch04.LAB.scorecard({}).total()
    assert total in ("Lab 4: 0 of 6 passed", "Lab 4: 0 of 5 passed, 1 skipped")
    if HAS_TPU_COMPILER:
        assess.failed(check(7 * T * F, 4 * T * F, "fast"), "'memory' or 'compute'")
        assess.failed(check("7", 4 * T * F, "memory"), "string")

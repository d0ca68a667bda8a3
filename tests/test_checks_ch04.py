"""Lab 4 checkers: honest answers (not the course's) pass, also on the grader's hidden
shapes, itemsizes and chips; each mistake fails with a hint that names it and hides the
expected value behind ``answer``; the course's own functions are refused; garbage never
raises."""

from __future__ import annotations

import math

import jax
import pytest

from tpu_course import hardware, hlo, roofline
from tpu_course.checks import NotWritten, _core, ch04, grading_seed
from tpu_course.checks._answers import ch04 as reference

SEED = grading_seed("someone", 4)
HAS_TPU_COMPILER = hlo.tpu_compiler_problem() is None


@pytest.fixture(autouse=True)
def fresh_state():
    _core._PREDICTIONS.clear()
    yield
    _core._PREDICTIONS.clear()


def expect(result, *words):
    text = f"{result.message} {result.hint}"
    assert not result.passed, result
    assert all(w in text for w in words), result


def hidden(number, namespace):
    """The grader's verdict on exercise ``number`` with the hidden inputs of SEED."""
    return ch04.LAB.grade(namespace, seed=SEED)[number - 1]


# honest answers, written differently from the course's --------------------------------

def flops(m, k, n):  # counted output by output: k multiplies and k adds each
    return m * n * (k + k)


def nbytes(m, k, n, s):
    return sum(rows * cols for rows, cols in ((m, k), (k, n), (m, n))) * s


def intensity(m, k, n, s):
    return flops(m, k, n) / nbytes(m, k, n, s)


def roof(ai, chip):  # compares rates instead of dividing: memory-bound when ai * W < P
    return "memory" if ai * chip.hbm_bytes_per_s < chip.peak_bf16_flops_per_s else "compute"


def fastest(f, b, chip):
    times = sorted([f / chip.peak_bf16_flops_per_s, b / chip.hbm_bytes_per_s])
    return times[-1]


def layer_flops(B, D, H):
    return B * H * (2 * D + 1 + 1)  # per output: D multiply-adds, the bias add, the relu


def tpu_bytes(rows, cols, itemsize):
    pad = lambda x, to: (x + to - 1) // to * to
    return pad(rows, 8) * pad(cols, 128) * itemsize


HONEST = {"matmul_flops": flops, "matmul_bytes": nbytes, "intensity": intensity,
          "which_roof": roof, "fastest_time_s": fastest, "layer_flops": layer_flops,
          "tpu_bytes": tpu_bytes}


def test_registry():
    lab = ch04.LAB
    assert len(lab.exercises) == 7 and {"transfer", "predict"} <= {e.kind for e in lab.exercises}
    assert lab.exercises[-1].needs == "tpu-compiler"
    for e in lab.exercises[:6]:  # every function exercise has hidden inputs
        assert e.hidden is not None, e.title
    assert not hasattr(ch04, "tpu_padded_bytes")  # the reference is private now


def test_honest_answers_pass_visible_and_hidden():
    assert ch04.check_matmul_flops(flops)
    assert ch04.check_matmul_bytes(nbytes)
    assert ch04.check_roofs(intensity, roof)
    assert ch04.check_roofline_time(fastest)
    assert ch04.check_xla_flops(layer_flops)
    assert ch04.check_padded_bytes(tpu_bytes)
    results = ch04.LAB.grade(HONEST, seed=SEED)
    assert all(r.passed for r in results[:6]), results
    assert all("unseen" in r.message for r in results[:6])


# -- Exercise 1 and 2 ---------------------------------------------------------------------

@pytest.mark.parametrize("answer, words", [
    (lambda m, k, n: m * k * n, ["multiply-adds"]),
    (lambda m, k, n: m * n, ["x the right one"]),
    (lambda m, k, n: "256", ["string"]),
])
def test_matmul_flops_mistakes(answer, words):
    r = ch04.check_matmul_flops(answer)
    expect(r, *words)
    assert words == ["string"] or (r.answer and "100,663,296" not in r.message)


def test_matmul_flops_hard_coded_fails_hidden_and_course_code_is_refused():
    table = {ch04.MATMUL: 2 * math.prod(ch04.MATMUL), (3, 5, 7): 210}
    r = hidden(1, {"matmul_flops": lambda m, k, n: table.get((m, k, n), 0)})
    expect(r, "does not show", "other matmul shapes")
    for answer in (reference.matmul_flops, roofline.matmul_flops,
                   lambda m, k, n: roofline.matmul_flops(m, k, n)):
        expect(ch04.check_matmul_flops(answer), "course's own function")
    assert ch04.check_matmul_flops(NotWritten("Exercise 1")).status == "not written"


@pytest.mark.parametrize("answer, words", [
    (lambda m, k, n, s: (m * k + k * n) * s, ["not the output"]),
    (lambda m, k, n, s: nbytes(m, k, n, 4), ["4-byte elements"]),
    (lambda m, k, n, s: nbytes(m, k, n, 1), ["elements, not bytes"]),
    (lambda m, k, n, s: nbytes(m, k, n, s) * 3, ["x the right one"]),
])
def test_matmul_bytes_mistakes(answer, words):
    expect(ch04.check_matmul_bytes(answer), *words)


def test_matmul_bytes_typed_itemsize_fails_hidden_and_course_code_is_refused():
    two_or_four = lambda m, k, n, s: nbytes(m, k, n, 2 if s < 3 else 4)
    assert ch04.check_matmul_bytes(two_or_four)
    expect(hidden(2, {"matmul_bytes": two_or_four}), "does not show", "8-byte")
    expect(ch04.check_matmul_bytes(roofline.matmul_bytes), "course's own function")
    expect(ch04.check_matmul_bytes(reference.matmul_bytes), "course's own function")


# -- Exercise 3 ---------------------------------------------------------------------------

V5E_RIDGE = hardware.get("v5e").peak_bf16_flops_per_s / hardware.get("v5e").hbm_bytes_per_s


@pytest.mark.parametrize("ai, which, words", [
    (lambda *a: 1 / intensity(*a), roof, ["bytes per FLOP"]),
    (lambda m, k, n, s: flops(m, k, n) / nbytes(m, k, n, 1), roof, ["elements, not bytes"]),
    (lambda m, k, n, s: flops(m, k, n) / (m * k * s), roof, ["x the right one"]),
    (intensity, lambda ai, chip: "memory", ["ridge point"]),
    (intensity, lambda ai, chip: "compute" if ai < 240 else "memory", ["not the one"]),
    (intensity, lambda ai, chip: True, ["'memory' or 'compute'"]),
])
def test_roofs_mistakes(ai, which, words):
    expect(ch04.check_roofs(ai, which), *words)


def test_a_ridge_typed_for_one_chip_fails_hidden():
    typed = lambda ai, chip: "memory" if ai < (
        V5E_RIDGE if chip.name == "v5e" else 918e12 / 1640e9) else "compute"
    if ch04.check_roofs(intensity, typed):
        expect(hidden(3, {"intensity": intensity, "which_roof": typed}), "does not show")


def test_roofs_refuse_the_package_helpers():
    expect(ch04.check_roofs(lambda m, k, n, s: roofline.matmul_intensity(m, k, n, s), roof),
           "course's own function", "roofline.matmul_intensity")
    expect(ch04.check_roofs(intensity, lambda ai, chip: roofline.bound(ai, chip)),
           "course's own function", "roofline.bound")
    expect(ch04.check_roofs(intensity, reference.which_roof), "course's own function")
    expect(ch04.check_roofs(reference.intensity, roof), "course's own function")


# -- Exercise 4 ---------------------------------------------------------------------------

@pytest.mark.parametrize("answer, words", [
    (lambda f, b, c: f / c.peak_bf16_flops_per_s + b / c.hbm_bytes_per_s, ["added"]),
    (lambda f, b, c: min(f / c.peak_bf16_flops_per_s, b / c.hbm_bytes_per_s), ["smaller"]),
    (lambda f, b, c: 1e6 * fastest(f, b, c), ["microseconds"]),
    (lambda f, b, c: f / c.peak_bf16_flops_per_s, ["smaller"]),  # the compute time only
    (lambda f, b, c: "1e-3", ["string"]),
])
def test_roofline_time_mistakes(answer, words):
    expect(ch04.check_roofline_time(answer), *words)


def test_roofline_time_refuses_estimate_and_hidden_chips_catch_a_typed_chip():
    expect(ch04.check_roofline_time(lambda f, b, c: roofline.estimate(f, b, c).time_s),
           "course's own function")
    expect(ch04.check_roofline_time(reference.fastest_time_s), "course's own function")
    table = {"v6e": (918e12, 1640e9)}  # typed numbers, and the v5e's for every other chip

    def typed(f, b, c):
        peak, bandwidth = table.get(c.name, (197e12, 819e9))
        return max(f / peak, b / bandwidth)

    assert ch04.check_roofline_time(typed)
    expect(hidden(4, {"fastest_time_s": typed}), "does not show", "other layers")


# -- Exercise 5 (predict) -----------------------------------------------------------------

@pytest.mark.parametrize("answer, words", [
    (lambda B, D, H: B * D * H, ["multiply-adds"]),
    (lambda B, D, H: 2 * D * H + 2 * H, ["one row", "batch B"]),
    (lambda B, D, H: 3 * B * D * H, ["XLA's"]),
    (lambda B, D, H: None, ["number"]),
])
def test_layer_flops_mistakes(answer, words):
    r = ch04.check_xla_flops(answer)
    expect(r, *words)
    if words != ["number"]:
        assert r.answer and "XLA counts" in r.answer and "33,587,200" not in r.message


def test_layer_flops_matmul_only_passes_and_the_gap_is_explained():
    r = ch04.check_xla_flops(lambda B, D, H: 2 * B * D * H)
    assert r and "elementwise" in r.message


def test_layer_flops_refuses_asking_xla_and_the_reference():
    def ask_xla(B, D, H):
        S = jax.ShapeDtypeStruct
        return hlo.inspect(ch04.layer, S((B, D), "float32"), S((D, H), "float32"),
                           S((H,), "float32")).flops

    expect(ch04.check_xla_flops(ask_xla), "course's own function", "hlo.inspect")
    expect(ch04.check_xla_flops(lambda B, D, H: ch04.xla_layer_flops((B, D, H))),
           "course's own function")
    expect(ch04.check_xla_flops(reference.layer_flops), "course's own function")


def test_layer_flops_hard_coded_fails_hidden():
    typed = lambda B, D, H: 33_587_200
    assert ch04.check_xla_flops(typed)
    expect(hidden(5, {"layer_flops": typed}), "does not show", "another layer shape")


def test_layer_flops_prediction_is_locked_once_xla_is_shown(capsys):
    ch04.LAB.predict("Exercise 5", lambda B, D, H: B * D * H)
    assert ch04.LAB.predicted("Exercise 5")
    r = ch04.check_xla_flops(layer_flops)  # rewritten after XLA's count was shown
    assert not r and "recorded before the measurement" in r.message


# -- Exercise 6 ---------------------------------------------------------------------------

def test_padded_bytes_model():
    assert reference.tpu_padded_bytes((100, 100), 4) == 104 * 128 * 4
    assert reference.tpu_padded_bytes((2, 100, 100), 2) == 2 * 104 * 128 * 2
    with pytest.raises(ValueError):
        reference.tpu_padded_bytes((100,), 4)


@pytest.mark.parametrize("answer, words", [
    (lambda r, c, s: r * c * s, ["logical size"]),
    (lambda r, c, s: math.ceil(r / 128) * 128 * math.ceil(c / 8) * 8 * s,
     ["rows to 128", "LAST dimension"]),
    (lambda r, c, s: tpu_bytes(r, c, 1), ["padded elements, not bytes"]),
    (lambda r, c, s: math.ceil(r / 8) * 8 * c * s, ["x the right one"]),
])
def test_padded_bytes_mistakes(answer, words):
    r = ch04.check_padded_bytes(answer)
    expect(r, *words)
    assert r.answer


def test_padded_bytes_refuses_the_reference_and_hidden_catches_a_lookup():
    expect(ch04.check_padded_bytes(reference.tpu_bytes), "course's own function")
    expect(ch04.check_padded_bytes(
        lambda r, c, s: reference.tpu_padded_bytes((r, c), s)), "course's own function")
    table = {(100, 100): 53248, (129, 128): 136 * 128 * 4, (8, 1000): 8 * 1024 * 4}
    lookup = lambda r, c, s: table.get((r, c), r * c * s)
    assert ch04.check_padded_bytes(lookup)
    expect(hidden(6, {"tpu_bytes": lookup}), "does not show", "other 2-D shapes")


def test_padded_bytes_in_bf16_agrees_with_the_compiler_or_the_model():
    assert ch04.check_padded_bytes(tpu_bytes, cases=((100, 100), (17, 127)), dtype="bf16")


# -- Exercise 7 (predict, TPU compiler) ---------------------------------------------------

T, F = ch04.LN_SHAPE
RIGHT = (7 * T * F, 4 * T * F, "memory")


@pytest.mark.skipif(not HAS_TPU_COMPILER, reason="needs the TPU compiler (libtpu)")
@pytest.mark.parametrize("prediction, words", [
    ((7, 4 * T * F, "memory"), ["FLOPs per element", "multiply by the number of elements"]),
    ((7 * F, 4 * T * F, "memory"), ["one row", "multiply by the number of rows"]),
    ((7 * T * F, 4, "memory"), ["bytes per element", "multiply by the number of elements"]),
    ((T * F, 4 * T * F, "memory"), ["FLOPs are", "per element"]),  # one FLOP per element
    ((7 * T * F, 8 * T * F, "memory"), ["bf16"]),  # float32 bytes
    ((7 * T * F, 2 * T * F, "memory"), ["written as well"]),  # x read only
    ((7 * T * F, 4 * T * F, "compute"), ["not compute-bound"]),
    (("7", 4 * T * F, "memory"), ["string"]),
    ((7 * T * F, 4 * T * F, "fast"), ["'memory' or 'compute'"]),
])
def test_layer_norm_mistakes(prediction, words):
    r = ch04.check_layer_norm(*prediction)
    expect(r, *words)


def test_layer_norm_is_skipped_or_graded_and_locked():
    if not HAS_TPU_COMPILER:
        assert ch04.check_layer_norm(*RIGHT).status == "skipped"
        return
    r = ch04.check_layer_norm(*RIGHT)
    assert r and "fusions" in r.message
    ch04.LAB.predict("Exercise 7", 7, 4 * T * F, "memory")
    assert ch04.LAB.predicted("Exercise 7")
    r = ch04.check_layer_norm(*RIGHT)  # corrected after XLA's count was shown: the 7 counts
    assert not r and "recorded before the measurement" in r.message


def test_scorecard_of_an_empty_namespace():
    total = ch04.LAB.scorecard({}).total()
    assert total in ("Lab 4: 0 of 7 passed", "Lab 4: 0 of 6 passed, 1 skipped")

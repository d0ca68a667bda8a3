"""Lab 4 checkers: honest answers (not the course's) pass, also on the grader's hidden
functions, shapes, dtypes and chips; each mistake fails with a hint that names it and
hides the expected value behind ``answer``; the course's own functions are refused; a
prediction that asks the compiler is refused; garbage never raises."""

from __future__ import annotations

import math

import jax
import pytest

from tpu_course import hlo, roofline
from tpu_course.checks import NotWritten, ch04, grading_seed
from tpu_course.checks._answers import ch04 as reference

SEED = grading_seed("someone", 4)
HAS_TPU_COMPILER = hlo.tpu_compiler_problem() is None


def expect(result, *words):
    text = f"{result.message} {result.hint}"
    assert not result.passed, result
    assert all(w in text for w in words), result


def hidden(number, namespace):
    """The grader's verdict on exercise ``number`` with the hidden inputs of SEED."""
    return ch04.LAB.grade(namespace, seed=SEED)[number - 1]


# honest answers, written differently from the course's --------------------------------

def xla_cost(fn, *args):  # trace first, and read the analysis as a list or a dict
    compiled = jax.jit(fn).trace(*args).lower().compile()
    cost = compiled.cost_analysis()
    cost = cost if isinstance(cost, dict) else cost[0]
    return float(cost["flops"]), float(cost["bytes accessed"])


def compute_bound_batch(k, n, chip):  # search instead of solving
    ridge = chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s
    if 2 * k * n / (2 * (k + n)) <= ridge:
        return None
    m = 1
    while 2 * m * k * n < ridge * 2 * (m * k + k * n + m * n):
        m += 1
    return m


def chain_time_s(kernels, chip):
    total = 0.0
    for f, b in kernels:
        rate = min(chip.peak_bf16_flops_per_s, f / b * chip.hbm_bytes_per_s)  # roofline
        total += f / rate
    return total


def layer_flops(B, D, H):
    return B * H * (2 * D + 1 + 1)  # per output: D multiply-adds, the bias add, the relu


def tpu_bytes(shape, itemsize):
    r, c = shape
    up = lambda x, to: (x + to - 1) // to * to
    return itemsize * min(up(r, 8) * up(c, 128), up(c, 8) * up(r, 128))


HONEST = {"xla_cost": xla_cost, "compute_bound_batch": compute_bound_batch,
          "chain_time_s": chain_time_s, "layer_flops": layer_flops, "tpu_bytes": tpu_bytes}


def test_registry():
    lab = ch04.LAB
    assert len(lab.exercises) == 6 and {"apply", "predict"} <= {e.kind for e in lab.exercises}
    assert lab.exercises[-1].needs == "tpu-compiler"
    for e in lab.exercises[:5]:  # every function exercise has hidden inputs
        assert e.hidden is not None, e.title
    for name in ("tpu_padded_bytes", "xla_cost", "matmul_flops"):
        assert not hasattr(ch04, name)  # the references are private


def test_honest_answers_pass_visible_and_hidden():
    assert ch04.check_xla_cost(xla_cost)
    assert ch04.check_compute_bound_batch(compute_bound_batch)
    assert ch04.check_chain_time(chain_time_s)
    assert ch04.check_xla_flops(layer_flops)
    assert ch04.check_tpu_bytes(tpu_bytes)
    results = ch04.LAB.grade(HONEST, seed=SEED)
    assert all(r.passed for r in results[:5]), results
    assert all("unseen" in r.message for r in results[:5])


# -- Exercise 1: the compiler's own counts, with JAX's API ---------------------------------

def _pair(fn):
    def answer(f, *args):
        cost = jax.jit(f).lower(*args).compile().cost_analysis()
        return fn(cost, jax.jit(f).lower(*args))
    return answer


@pytest.mark.parametrize("answer, words", [
    (_pair(lambda c, lo: (c["bytes accessed"], c["flops"])), ["wrong way round"]),
    (_pair(lambda c, lo: (c["flops"], lo.cost_analysis()["bytes accessed"])),
     ["before XLA optimised", "compile() first"]),
    (_pair(lambda c, lo: c), ["whole analysis"]),
    (_pair(lambda c, lo: c["flops"]), ["pair"]),
    (_pair(lambda c, lo: (c["flops"], c["flops"])), ["bytes are", "bytes accessed"]),
    (lambda f, *args: f(*args), ["ShapeDtypeStruct", "nothing needs to run"]),
    (lambda f, *args: ("1", 2), ["string"]),
])
@pytest.mark.mistake
def test_xla_cost_mistakes(answer, words):
    r = ch04.check_xla_cost(answer)
    expect(r, *words)


@pytest.mark.mistake
def test_xla_cost_refuses_the_course_and_a_lookup_fails_hidden():
    expect(ch04.check_xla_cost(lambda f, *a: (hlo.inspect(f, *a).flops,
                                              hlo.inspect(f, *a).bytes_accessed)),
           "course's own function", "hlo.inspect")
    expect(ch04.check_xla_cost(reference.xla_cost), "course's own function")
    def normalised(f, *a):
        c = hlo.normalise_cost(jax.jit(f).lower(*a).compile().cost_analysis())
        return c["flops"], c["bytes accessed"]

    expect(ch04.check_xla_cost(normalised), "course's own function", "normalise_cost")
    seen = {}
    for kind, dims, dtype in (("layer", (64, 512, 256), "float32"), ("softmax", (96, 200, 0), "float32")):
        seen[kind] = xla_cost(*((lambda f, a: (f, *a))(*ch04._cost_case(kind, dims, dtype))))
    lookup = lambda f, *a: seen["layer" if len(a) == 3 else "softmax"]
    assert ch04.check_xla_cost(lookup)
    expect(hidden(1, {"xla_cost": lookup}), "does not show")
    assert ch04.check_xla_cost(NotWritten("Exercise 1")).status == "not written"


# -- Exercise 2: the batch where a layer turns compute-bound -------------------------------

def _ridge(chip):
    return chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s


def _solve(k, n, chip, out=True, size=2):
    r = _ridge(chip)
    room = 2 * k * n - size * r * (k + (n if out else 0))
    return None if room <= 0 else math.ceil(size * r * k * n / room)


@pytest.mark.parametrize("answer, words", [
    (lambda k, n, c: math.ceil(_ridge(c)), ["ridge point itself", "activations"]),
    (lambda k, n, c: _solve(k, n, c, out=False), ["output"]),
    (lambda k, n, c: _solve(k, n, c, size=1), ["elements, not bytes"]),
    (lambda k, n, c: (lambda m: None if m is None else m - 0.5)(_solve(k, n, c)), ["whole"]),
    (lambda k, n, c: (lambda m: None if m is None else m - 1)(_solve(k, n, c)),
     ["still memory-bound"]),
    (lambda k, n, c: _solve(k, n, c) or 1, ["no batch is large enough", "limit"]),
    (lambda k, n, c: None, ["said none"]),
    (lambda k, n, c: 3 * (_solve(k, n, c) or 1), ["x the least"]),
    (lambda k, n, c: "272", ["string"]),
])
@pytest.mark.mistake
def test_compute_bound_batch_mistakes(answer, words):
    r = ch04.check_compute_bound_batch(answer)
    expect(r, *words)
    if words != ["string"]:
        assert r.answer and r.answer.split(": ")[-1] not in r.message


@pytest.mark.mistake
def test_compute_bound_batch_refuses_the_course_and_a_typed_chip_fails_hidden():
    expect(ch04.check_compute_bound_batch(reference.compute_bound_batch), "course's own")
    uses_bound = lambda k, n, c: next((m for m in range(1, 10**5) if roofline.bound(
        roofline.matmul_intensity(m, k, n), c) == "compute"), None)
    expect(ch04.check_compute_bound_batch(uses_bound), "course's own function")
    table = {"v5e": 240.53724053724054, "v6e": 560.4395604395604}

    def typed(k, n, chip):
        r = table.get(chip.name, 240.5)
        room = 2 * k * n - 2 * r * (k + n)
        return None if room <= 0 else math.ceil(2 * r * k * n / room)

    assert ch04.check_compute_bound_batch(typed)
    expect(hidden(2, {"compute_bound_batch": typed}), "does not show")


# -- Exercise 3: the least time of a chain of kernels --------------------------------------

def _times(c, f, b):
    return f / c.peak_bf16_flops_per_s, b / c.hbm_bytes_per_s


@pytest.mark.parametrize("answer, words", [
    (lambda ks, c: max(sum(f for f, _ in ks) / c.peak_bf16_flops_per_s,
                       sum(b for _, b in ks) / c.hbm_bytes_per_s), ["pooled", "one after another"]),
    (lambda ks, c: sum(sum(_times(c, f, b)) for f, b in ks), ["added", "overlap"]),
    (lambda ks, c: max(max(_times(c, f, b)) for f, b in ks), ["slowest kernel", "add"]),
    (lambda ks, c: sum(min(_times(c, f, b)) for f, b in ks), ["smaller"]),
    (lambda ks, c: 1e6 * chain_time_s(ks, c), ["microseconds"]),
    (lambda ks, c: 2 * chain_time_s(ks, c), ["x the least"]),
    (lambda ks, c: None, ["number"]),
])
@pytest.mark.mistake
def test_chain_time_mistakes(answer, words):
    expect(ch04.check_chain_time(answer), *words)


@pytest.mark.mistake
def test_chain_time_refuses_the_course_and_a_typed_chip_fails_hidden():
    expect(ch04.check_chain_time(lambda ks, c: sum(roofline.estimate(f, b, c).time_s
                                                  for f, b in ks)), "course's own function")
    expect(ch04.check_chain_time(reference.chain_time_s), "course's own function")
    table = {"v6e": (918e12, 1640e9)}

    def typed(ks, c):
        peak, bw = table.get(c.name, (197e12, 819e9))
        return sum(max(f / peak, b / bw) for f, b in ks)

    assert ch04.check_chain_time(typed)
    expect(hidden(3, {"chain_time_s": typed}), "does not show")


# -- Exercise 4 (predict) -----------------------------------------------------------------

@pytest.mark.parametrize("answer, words", [
    (lambda B, D, H: 2 * B * D * H, ["matmul alone", "bias add"]),
    (lambda B, D, H: B * D * H, ["multiply-adds"]),
    (lambda B, D, H: 2 * D * H + 2 * H, ["one row", "batch M"]),
    (lambda B, D, H: 3 * B * D * H, ["XLA's"]),
    (lambda B, D, H: None, ["number"]),
])
@pytest.mark.mistake
def test_layer_flops_mistakes(answer, words):
    r = ch04.check_xla_flops(answer)
    expect(r, *words)
    if words != ["number"]:
        assert r.answer and "XLA counts" in r.answer and "1,310,720" not in r.message


@pytest.mark.mistake
def test_layer_flops_refuses_asking_xla_and_the_reference():
    def ask_xla(B, D, H):
        S = jax.ShapeDtypeStruct
        return hlo.inspect(ch04.layer, S((B, D), "float32"), S((D, H), "float32"),
                           S((H,), "float32")).flops

    expect(ch04.check_xla_flops(ask_xla), "course's own function", "hlo.inspect")
    expect(ch04.check_xla_flops(lambda B, D, H: ch04.xla_layer_flops((B, D, H))),
           "course's own function")
    expect(ch04.check_xla_flops(reference.layer_flops), "course's own function")

    def with_my_cost(B, D, H):  # the learner's own Exercise 1, asked instead of predicting
        S = jax.ShapeDtypeStruct
        return xla_cost(ch04.layer, S((B, D), "float32"), S((D, H), "float32"), S((H,), "float32"))[0]

    expect(ch04.check_xla_flops(with_my_cost), "asks the compiler", "by hand")


@pytest.mark.mistake
def test_layer_flops_hard_coded_fails_hidden():
    typed = lambda B, D, H: 1_310_720
    assert ch04.check_xla_flops(typed)
    expect(hidden(4, {"layer_flops": typed}), "does not show", "another layer")


def test_layer_flops_prediction_is_locked_once_xla_is_shown():
    ch04.LAB.predict("Exercise 4", lambda B, D, H: B * D * H)
    assert ch04.LAB.predicted("Exercise 4")
    r = ch04.check_xla_flops(layer_flops)  # rewritten after XLA's count was shown
    assert not r and "recorded before the measurement" in r.message


# -- Exercise 5 ---------------------------------------------------------------------------

def test_padded_bytes_model():
    assert reference.tpu_padded_bytes((100, 100), 4) == 104 * 128 * 4
    assert reference.tpu_padded_bytes((1000, 12), 4) == 16 * 1024 * 4
    assert reference.tpu_padded_bytes((2, 100, 100), 2) == 2 * 104 * 128 * 2
    with pytest.raises(ValueError):
        reference.tpu_padded_bytes((100,), 4)


up = lambda x, to: (x + to - 1) // to * to


@pytest.mark.parametrize("answer, words", [
    (lambda s, i: s[0] * s[1] * i, ["logical size"]),
    (lambda s, i: up(s[0], 8) * up(s[1], 128) * i, ["other way round", "{0,1}"]),
    (lambda s, i: up(s[0], 128) * up(s[1], 8) * i, ["rows to 128", "LAST dimension"]),
    (lambda s, i: tpu_bytes(s, 1), ["padded elements, not bytes"]),
    (lambda s, i: i * min(up(s[0], 8 * 4 // i) * up(s[1], 128),
                          up(s[1], 8 * 4 // i) * up(s[0], 128)), ["16 sublanes", "(2,1)"]),
    (lambda s, i: i * min(s[0] * up(s[1], 128), s[1] * up(s[0], 128)), ["only the minor"]),
    (lambda s, i: 3 * tpu_bytes(s, i), ["x the right one"]),
])
@pytest.mark.mistake
def test_tpu_bytes_mistakes(answer, words):
    r = ch04.check_tpu_bytes(answer)
    expect(r, *words)
    assert r.answer


@pytest.mark.mistake
def test_tpu_bytes_refuses_the_course_and_the_compiler_and_hidden_catches_a_lookup():
    expect(ch04.check_tpu_bytes(reference.tpu_bytes), "course's own function")
    expect(ch04.check_tpu_bytes(lambda s, i: reference.tpu_padded_bytes(s, i)),
           "course's own function")

    def asks(shape, itemsize):
        from jax.experimental import topologies
        return topologies.get_topology_desc("v5e:2x2", "tpu").devices[0].memory_analysis()

    expect(ch04.check_tpu_bytes(asks), "asks the compiler")
    table = {(40, 300): 40 * 384 * 4, (17, 127): 24 * 128 * 2, (1000, 12): 16 * 1024 * 4}
    lookup = lambda s, i: table.get(tuple(s), s[0] * s[1] * i)
    assert ch04.check_tpu_bytes(lookup)
    expect(hidden(5, {"tpu_bytes": lookup}), "does not show", "2-D shapes")


# -- Exercise 6 (predict, TPU compiler) ---------------------------------------------------

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
@pytest.mark.mistake
def test_layer_norm_mistakes(prediction, words):
    r = ch04.check_layer_norm(*prediction)
    expect(r, *words)


def test_layer_norm_is_skipped_or_graded_and_locked():
    if not HAS_TPU_COMPILER:
        assert ch04.check_layer_norm(*RIGHT).status == "skipped"
        return
    r = ch04.check_layer_norm(*RIGHT)
    assert r and "fusions" in r.message
    ch04.LAB.predict("Exercise 6", 7, 4 * T * F, "memory")
    assert ch04.LAB.predicted("Exercise 6")
    r = ch04.check_layer_norm(*RIGHT)  # corrected after XLA's count was shown: the 7 counts
    assert not r and "recorded before the measurement" in r.message


def test_scorecard_of_an_empty_namespace():
    total = ch04.LAB.scorecard({}).total()
    assert total in ("Lab 4: 0 of 6 passed", "Lab 4: 0 of 5 passed, 1 skipped")

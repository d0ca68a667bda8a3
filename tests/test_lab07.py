"""Lab 7's exercises: every known mistake is refused with its hint; honest kernels written
unlike the course's pass (grading's hidden cases and the notebook's check); incomplete
kernels (no K loop, one K block, float32 out of bf16 in, an index map right only on square
block grids) and shortcuts fail with a hint that names them."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import grading
from tests import assess
from tpu_course.checks import NotWritten, ch07, engine

LAB = 7


def on_cases(title, answer, cases):
    """The verdict on these cases alone (each kernel run costs a compile)."""
    ex = ch07.LAB.find(title)
    return engine.judge(ex, cases, ex.run({ex.provides[0]: answer}, cases),
                        [ex.expect(c) for c in cases],
                        [[(m, engine.NO_OUTPUT) for m in ex.rules] for _ in cases])


def on_one_case(title, answer, index):
    return on_cases(title, answer, [ch07.LAB.find(title).cases[index]])


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    if ex.unmet():
        pytest.skip(ex.unmet())
    assess.assert_mistake_named(ex, key, mistake)


# -- Exercise 1: an honest kernel unlike the course's, and incomplete ones --------------------


def honest_kernel(x_ref, w_ref, b_ref, o_ref, acc_ref, *, k_axis=2, mistake=None):
    """The accumulator starts at the bias; lax.dot_general; a where() ReLU."""
    step, last = pl.program_id(k_axis), pl.num_programs(k_axis) - 1

    @pl.when(step == 0)
    def _():
        acc_ref[...] = jnp.broadcast_to(b_ref[...].astype(jnp.float32), acc_ref.shape)

    part = jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)
    if mistake == "first only":  # the K loop runs, but only its first block is kept
        acc_ref[...] = jnp.where(step == 0, acc_ref[...] + part, acc_ref[...])
    else:
        acc_ref[...] = acc_ref[...] + part

    @pl.when(step == last)
    def _():
        z = acc_ref[...]
        o_ref[...] = jnp.where(z > 0, z, 0.0).astype(
            jnp.float32 if mistake == "float32 out" else o_ref.dtype)


def honest_dense(x, w, b, bm, bk, bn, interpret, *, mistake=None):
    """N-blocks outer, M-blocks inner, K last (another loop order than the course's)."""
    (m, k), n = x.shape, w.shape[1]
    swapped = mistake == "square only"  # grid order swapped, index maps not
    grid = (m // bm, n // bn, k // bk) if swapped else (n // bn, m // bm, k // bk)
    return pl.pallas_call(
        lambda *r: honest_kernel(*r, mistake=mistake),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32 if mistake == "float32 out"
                                       else x.dtype),
        grid=grid,
        in_specs=[pl.BlockSpec((bm, bk), lambda j, i, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda j, i, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda j, i, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda j, i, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret)(x, w, b)


def whole_k(x, w, b, bm, bk, bn, interpret):
    """No K loop: K in one block, bk ignored."""
    (m, k), n = x.shape, w.shape[1]

    def kernel(x_ref, w_ref, b_ref, o_ref):
        z = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32) + b_ref[...]
        o_ref[...] = jnp.maximum(z, 0).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                  pl.BlockSpec((k, bn), lambda i, j: (0, j)),
                  pl.BlockSpec((1, bn), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret=interpret)(x, w, b)


def copies(a, bm, bn, interpret):
    def kernel(a_ref, o_ref):
        o_ref[...] = a_ref[...]

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        grid=(a.shape[0] // bm, a.shape[1] // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret=interpret)(a)


def test_honest_dense_relu_passes():
    assess.assert_passes(LAB, "Exercise 1", jax.jit(honest_dense, static_argnums=(3, 4, 5, 6)))


@pytest.mark.parametrize(("answer", "case", "words"), [
    (lambda *a: honest_dense(*a, mistake="first only"), 0, "zero it only at the first K step"),
    (lambda *a: honest_dense(*a, mistake="float32 out"), 1, "return the inputs' dtype"),
    (whole_k, 0, "K-tiled grid"),
    (lambda x, w, b, bm, bk, bn, i: copies(jax.nn.relu(x @ w + b), bm, bn, i), 0,
     "inside the kernel"),
    (lambda x, w, b, bm, bk, bn, i: copies(honest_dense(x, w, b, bm, bk, bn, i), bm, bn, i), 0,
     "HBM"),
    (lambda x, w, b, *a: jax.nn.relu(x @ w + b), 1, "pl.pallas_call"),
    (lambda x, w, b, *a: jnp.asarray(np.asarray(x) @ w), 1, "must trace"),
], ids=["first K block only", "float32 out of bf16 in", "no K loop", "matmul outside",
        "two kernels", "no kernel", "untraceable"])
def test_incomplete_kernels_are_named(answer, case, words):
    result = on_one_case(1, answer, case)
    assert result.status == "failed" and words in result.hint, result


def test_an_index_map_right_only_on_square_block_grids_fails_grading():
    answer = jax.jit(lambda *a: honest_dense(*a, mistake="square only"),
                     static_argnums=(3, 4, 5, 6))
    assert on_one_case(1, answer, 0).passed  # the notebook's grids are 2x2 and 3x3
    ex = ch07.LAB.find(1)
    hidden = grading.keys(LAB)["Exercise 1"].hidden(grading.rng_for("s", "x", LAB, ex.title))
    assert not on_cases(1, answer, hidden).passed


def test_a_hard_coded_answer_and_garbage_fail():
    seen = {(c.args["m"], c.args["k"]): ch07.LAB.find(1).expect(c)["out"]
            for c in ch07.LAB.find(1).cases}

    def remembered(x, w, b, bm, bk, bn, interpret):  # the visible answers, copied out
        return copies(jnp.asarray(seen[x.shape]), bm, bn, interpret)

    result = on_one_case(1, remembered, 0)
    assert result.status == "failed" and "does no matmul" in result.message, result
    for bad in (lambda *a: None, lambda *a: "256", 42):
        assert ch07.check_dense_relu(bad).status == "failed"
    assert ch07.check_dense_relu(NotWritten("Exercise 1")).status == "not written"


# -- Exercise 4 -----------------------------------------------------------------------------------


def scores(q, k, bq, interpret, *, root=None, subtract_max=True, softmax_inside=True):
    """jnp.dot with k transposed in the kernel (the course contracts with dot_general)."""
    (lq, d), lk = q.shape, k.shape[0]

    def kernel(q_ref, k_ref, o_ref):
        s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)
        s = s * (1 / math.sqrt(root(q, k) if root else d))
        if subtract_max:
            s = s - jnp.max(s, axis=1, keepdims=True)
        e = jnp.exp(s) if softmax_inside else s
        o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True) if softmax_inside else e
                      ).astype(o_ref.dtype)

    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype), grid=(lq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)), pl.BlockSpec((lk, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bq, lk), lambda i: (i, 0)), interpret=interpret)(q, k)
    return out if softmax_inside else jax.nn.softmax(out, axis=-1)


def test_honest_attention_scores_pass():
    assess.assert_passes(LAB, "Exercise 4", scores)


@pytest.mark.parametrize(("answer", "case", "words"), [
    (lambda *a: scores(*a, root=lambda q, k: k.shape[0]), 0, "not the number of keys"),
    (lambda *a: scores(*a, root=lambda q, k: 64), 1, "rather than typing it"),
    (lambda *a: scores(*a, subtract_max=False), 1, "subtract each row's max"),
    (lambda *a: scores(*a, softmax_inside=False), 0, "never leave VMEM"),
    (lambda q, k, bq, i: scores(q, k, q.shape[0], i), 0, "Lq // bq"),
], ids=["scaled by sqrt(Lk)", "sqrt(64) typed in", "no max", "softmax outside", "one block"])
def test_attention_scores_mistakes_are_named(answer, case, words):
    result = on_one_case(4, answer, case)
    assert result.status == "failed" and words in result.hint, result


# -- Exercises 2, 3 and 5 -------------------------------------------------------------------------


def footprint(bm, bk, bn, itemsize):
    buffers = [bm * bk, bk * bn, bm * bn]
    return sum(2 * b * itemsize for b in buffers) + bm * bn * 4


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 2", footprint),
    ("Exercise 3", {"a": "OK", "b": "misaligned", "c": "fits", "d": "Too_Big",
                    "e": "misaligned", "f": "fit", "g": "too-big"}),
], ids=["footprint", "verdicts"])
def test_honest_answers_pass(title, answer):
    if ch07.LAB.find(title).unmet():
        pytest.skip(ch07.LAB.find(title).unmet())
    assess.assert_passes(LAB, title, answer)


def test_footprint_shortcuts_fail():
    visible = {tuple(c.args.values()): footprint(*c.args.values())
               for c in ch07.LAB.find(2).cases}
    lookup = lambda *a: visible.get(a, 2**20)  # the notebook's answers, typed in
    assert ch07.check_footprint(lookup).passed
    assert assess.graded(LAB, "Exercise 2", lookup).status == "failed"
    result = ch07.check_footprint(lambda *a: "4194304")
    assert result.status == "failed" and "remove the quotes" in result.hint
    assert ch07.check_footprint(lambda *a: None).status == "failed"


def test_verdicts_that_cannot_be_read_fail():
    ex = ch07.LAB.find(3)
    if ex.unmet():
        pytest.skip(ex.unmet())
    for bad, words in ((["fits"] * 7, "should be a dict"), ({"a": "fits"}, "verdicts['b']"),
                       ({c: "maybe" for c in ch07.CANDIDATES}, "verdicts['a']")):
        result = ch07.check_verdicts(bad)
        assert result.status == "failed" and words in result.message, result


def test_fast_reads_the_kernel_before_any_timing():
    """Exercise 5's probe and comparison on a CPU (the timing needs a TPU)."""
    ex = ch07.LAB.find(5)
    if jax.default_backend() != "tpu":
        assert ch07.check_fast(honest_dense, (512, 1024, 1024)).status == "skipped"
    for answer, blocks, words in [
            (honest_dense, (512, 1024, 1024), "run the notebook on a TPU"),
            (whole_k, (512, 1024, 1024), "K-tiled grid"),
            (lambda x, w, b, *a: jax.nn.relu(x @ w + b), (512, 512, 512), "pl.pallas_call"),
            (honest_dense, (512, 500, 512), "fast_blocks = (bm, bk, bn)"),
            (honest_dense, "512", "fast_blocks = (bm, bk, bn)")]:
        if jax.default_backend() == "tpu" and words.startswith("run"):
            continue
        result = grading.grade(dataclass_replace_needs(ex), grading.Key(),
                               ex.run({"dense_relu": answer, "fast_blocks": blocks}), ex.cases)
        assert result.status == "failed" and words in result.hint, result


def dataclass_replace_needs(ex):
    import dataclasses

    return dataclasses.replace(ex, needs="cpu")


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []

"""Lab 7 checkers: honest kernels written differently from the course's pass (also on the
grader's unseen inputs); each planted mistake and shortcut fails with a message that names
it (the matmul, the bias, the ReLU or the softmax outside the kernel, K not tiled or not last
or marked parallel, a 16-bit accumulator, the bias or the ReLU at the wrong K step, a wrong
index map, a missing zeroing, ...); the course's
own answers are refused; garbage never raises."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_course import checks, hlo, pallas_tools
from tpu_course.checks import NotWritten, _core, ch07
from tpu_course.checks._answers import ch07 as answers

COMPILER = hlo.tpu_compiler_problem() is None
SEED = checks.grading_seed("someone", 7)


# -- Exercise 1: an honest fused layer that is not the course's, and planted variants -------


def honest_kernel(x_ref, w_ref, b_ref, o_ref, acc_ref, *, k_axis=2, mistake=None):
    """Written differently: the accumulator starts at the bias, lax.dot_general, zeros-free,
    a where() for the ReLU. ``mistake`` plants one error."""
    step, last = pl.program_id(k_axis), pl.num_programs(k_axis) - 1
    bias = b_ref[...].astype(jnp.float32)
    start = jnp.zeros(acc_ref.shape, jnp.float32) if mistake in ("no bias", "bias after",
                                                                  "bias every step") else (
        jnp.broadcast_to(bias, acc_ref.shape))
    start = start.astype(acc_ref.dtype)
    if mistake == "never zeroed":
        pass
    elif mistake == "zeroed once":
        first = (pl.program_id(0) == 0) & (pl.program_id(1) == 0) & (step == 0)

        @pl.when(first)
        def _():
            acc_ref[...] = start
    else:
        @pl.when(step == 0)
        def _():
            acc_ref[...] = start

    part = jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (0,)), ((), ())),
                               preferred_element_type=None if mistake == "narrow dot"
                               else jnp.float32).astype(acc_ref.dtype)
    if mistake == "relu per part":
        part = jnp.maximum(part, 0)
    if mistake == "overwrites":
        acc_ref[...] = start + part
    elif mistake == "relu running":
        acc_ref[...] = jnp.maximum(acc_ref[...] + part, 0)
    elif mistake == "bias every step":
        acc_ref[...] = acc_ref[...] + part + bias
    else:
        acc_ref[...] = acc_ref[...] + part

    @pl.when(step == last)
    def _():
        z = acc_ref[...].astype(jnp.float32)
        if mistake == "no relu":
            out = z
        elif mistake == "bias after":
            out = jnp.where(z > 0, z, 0.0) + bias
        else:
            out = jnp.where(z > 0, z, 0.0)
        o_ref[...] = out.astype(o_ref.dtype)


def honest_dense(x, w, b, bm, bk, bn, interpret, *, kernel=honest_kernel, b_map=None,
                 semantics=("parallel", "parallel", "arbitrary"), acc=jnp.float32):
    """N-blocks outer, M-blocks inner, K last (another loop order than the course's)."""
    (m, k), n = x.shape, w.shape[1]
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(n // bn, m // bm, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda j, i, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda j, i, kk: (kk, j)),
                  pl.BlockSpec((1, bn), b_map or (lambda j, i, kk: (0, j)))],
        out_specs=pl.BlockSpec((bm, bn), lambda j, i, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), acc)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics) if semantics else None,
        interpret=interpret)(x, w, b)


def never_zeroed_max(x_ref, w_ref, b_ref, o_ref, acc_ref):
    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = jnp.maximum(acc_ref[...] + b_ref[...], 0).astype(o_ref.dtype)


def planted(mistake, **kw):
    return lambda *a: honest_dense(
        *a, kernel=lambda *r: honest_kernel(*r, mistake=mistake), **kw)


def copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copies(a, bm, bn, interpret):
    m, n = a.shape
    return pl.pallas_call(
        copy_kernel, out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), grid=(m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)), interpret=interpret)(a)


def matmul_only(x, w, bm, bk, bn, interpret):
    """The chapter's K-tiled matmul, written out (not the package's)."""
    (m, k), n = x.shape, w.shape[1]

    def kernel(x_ref, w_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret)(x, w)


def epilogue_outside(x, w, b, bm, bk, bn, interpret):
    return jax.nn.relu(matmul_only(x, w, bm, bk, bn, interpret) + b)


def bias_outside(x, w, b, bm, bk, bn, interpret):
    return matmul_only(x, w, bm, bk, bn, interpret) + b  # and no relu anywhere


def dot_then_copy(x, w, b, bm, bk, bn, interpret):
    return copies(jax.nn.relu(jnp.dot(x, w) + b), bm, bn, interpret)


def whole_k(x, w, b, bm, bk, bn, interpret):
    """The chapter's first matmul with the epilogue: K in one block, bk ignored."""
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


def k_first(x, w, b, bm, bk, bn, interpret):
    (m, k), n = x.shape, w.shape[1]
    return pl.pallas_call(
        lambda *r: honest_kernel(*r, k_axis=0), out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(k // bk, m // bm, n // bn),
        in_specs=[pl.BlockSpec((bm, bk), lambda kk, i, j: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda kk, i, j: (kk, j)),
                  pl.BlockSpec((1, bn), lambda kk, i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda kk, i, j: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)], interpret=interpret)(x, w, b)


def into_output(x, w, b, bm, bk, bn, interpret):
    """Accumulates in the output block: float32 for float32 inputs, bf16 for bf16 ones."""
    (m, k), n = x.shape, w.shape[1]

    def kernel(x_ref, w_ref, b_ref, o_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.dot(x_ref[...], w_ref[...],
                              preferred_element_type=jnp.float32).astype(o_ref.dtype)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = jnp.maximum(o_ref[...] + b_ref[...], 0)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)), interpret=interpret)(x, w, b)


def fixed_blocks(x, w, b, bm, bk, bn, interpret):
    """Ignores bm and bn (types the notebook's 32 and 128): right on the notebook's cases only."""
    return honest_dense(x, w, b, 32, bk, 128, interpret)


def test_registry():
    lab = ch07.LAB
    assert len(lab.exercises) == 5
    assert {"apply", "predict"} <= {e.kind for e in lab.exercises}
    assert [e.needs for e in lab.exercises] == ["cpu", "cpu", "tpu-compiler", "cpu", "tpu-chip"]
    assert [e.names for e in lab.exercises] == [
        ("dense_relu",), ("vmem_footprint",), ("verdicts",), ("attention_scores",),
        ("dense_relu", "fast_blocks")]
    assert [e.hidden is not None for e in lab.exercises] == [True, True, False, True, False]
    for name in ("dense_relu_reference", "dense_relu_kernel", "footprint", "candidate_verdict",
                 "scores_reference"):  # the course's answers are not public names
        assert not hasattr(ch07, name), name


def test_honest_answers_pass_the_grader_also_on_unseen_inputs():
    """Not the course's answers: another grid order, lax.dot_general, the accumulator started
    at the bias, a jit wrapper, jnp.dot with k transposed in the kernel, a footprint summed
    over a list."""
    namespace = {"dense_relu": jax.jit(honest_dense, static_argnums=(3, 4, 5, 6)),
                 "vmem_footprint": honest_footprint, "verdicts": RIGHT,
                 "attention_scores": scores, "fast_blocks": (512, 1024, 1024)}
    results = ch07.LAB.grade(namespace, seed=SEED)
    want = ["passed", "passed", "passed" if COMPILER else "skipped", "passed",
            "passed" if jax.default_backend() == "tpu" else "skipped"]
    assert [r.status for r in results] == want, results
    for i in (0, 1, 3):
        assert "unseen" in results[i].message
    assert ch07.check_attention_scores(scores).passed
    assert ("one Mosaic custom call" in _core._LAST[(7, ch07.EX4)].message) == COMPILER


@pytest.mark.mistake
def test_blocks_typed_in_pass_the_notebook_but_not_the_grader():
    assert ch07.check_dense_relu(fixed_blocks)
    r = ch07.LAB.exercises[0].grade_hidden({"dense_relu": fixed_blocks}, SEED)
    assert not r and "does not show (a [" in r.message and not r.answer


SEMANTICS_K_PARALLEL = ("parallel", "parallel", "parallel")

EX1_MISTAKES = [
    # (what, answer, words in the message, words in the hint)
    ("the chapter's matmul kernel, then relu(+ b) in XLA", epilogue_outside,
     "activation runs outside", "last K step"),
    ("the bias outside and no relu", bias_outside, "bias is added outside", "(1, bn)"),
    ("jnp.dot and a copying pallas_call", dot_then_copy, "matmul runs outside", "inside the"),
    ("no kernel at all", lambda x, w, b, *a: jax.nn.relu(x @ w + b), "no pallas_call",
     "pl.pallas_call"),
    ("K held whole (bk ignored)", whole_k, "no K axis", "K-tiled grid"),
    ("K first in the grid", k_first, "not the last axis", "innermost"),
    ("K marked parallel", lambda *a: honest_dense(*a, semantics=SEMANTICS_K_PARALLEL),
     "K axis 'parallel'", '"arbitrary"'),
    ("a bf16 scratch accumulator", lambda *a: honest_dense(*a, acc=jnp.bfloat16),
     "accumulator (scratch) is bfloat16", "float32"),
    ("accumulating in the bf16 output block", into_output, "adds the K steps' products in "
     "bfloat16", "float32 accumulator"),
    ("jnp.dot without preferred_element_type", planted("narrow dot"), "returns bfloat16",
     "preferred_element_type"),
    ("two kernels", lambda x, w, b, bm, bk, bn, i: copies(
        honest_dense(x, w, b, bm, bk, bn, i), bm, bn, i), "2 pallas_calls", "HBM"),
    ("no relu", planted("no relu"), "no activation", "jnp.maximum"),
    ("no bias", planted("no bias"), "bias is missing", "(1, bn)"),
    ("bias after the relu", planted("bias after"), "after the ReLU", "add the bias first"),
    ("bias at every K step", planted("bias every step"), "every K step", "once"),
    ("relu on each partial product", planted("relu per part"), "each K step's partial",
     "once, after the last K step"),
    ("relu on the running sum", planted("relu running"), "running sum", "once, after"),
    ("bias block at (0, i)", planted(None, b_map=lambda j, i, kk: (0, i)), "numbers are wrong",
     "(0, j)"),
    ("bias block out of bounds", planted(None, b_map=lambda j, i, kk: (0, kk)),
     "outside its array", "index maps"),
    ("accumulator never set (a where() ReLU hides the NaN)", planted("never zeroed"),
     "never wrote", "pl.program_id(2) == 0"),
    ("accumulator set once (M, N parallel: shuffled order)", planted("zeroed once"),
     "never wrote", "pl.program_id(2) == 0"),
    ("accumulator set once", planted("zeroed once", semantics=None),
     "sum of all the blocks before", "zero it"),
    ("accumulator never zeroed, jnp.maximum ReLU", lambda *a: honest_dense(
        *a, kernel=never_zeroed_max), "NaN", "zeroed"),
    ("= instead of +=", planted("overwrites"), "last K block's product", "+="),
    ("untraceable", lambda x, w, b, *a: jnp.asarray(__import__("numpy").asarray(x) @ w),
     "tracing your function", "trace"),
]


@pytest.mark.parametrize("what, answer, message, hint", EX1_MISTAKES,
                         ids=[m[0] for m in EX1_MISTAKES])
@pytest.mark.mistake
def test_dense_relu_mistakes_are_named(what, answer, message, hint):
    r = ch07.check_dense_relu(answer)
    assert r.status == "failed", (what, r)
    assert message in r.message and hint in r.hint, (what, r)


@pytest.mark.parametrize("answer", [
    answers.dense_relu_reference,
    lambda *a: answers.dense_relu_reference(*a),
    lambda *a: honest_dense(*a, kernel=answers.dense_relu_kernel),
    lambda x, w, b, bm, bk, bn, i: jax.nn.relu(pallas_tools.matmul_ktiled(x, w, bm, bk, bn, i) + b),
    lambda x, w, b, *a: answers.dense_relu_xla(x, w, b)])
@pytest.mark.mistake
def test_dense_relu_refuses_the_courses_code(answer):
    r = ch07.check_dense_relu(answer)
    assert not r and "course's own function" in r.message and "write this yourself" in r.hint


@pytest.mark.mistake
def test_dense_relu_garbage():
    assert not ch07.check_dense_relu(lambda *a: "256")
    assert not ch07.check_dense_relu(42)
    assert ch07.check_dense_relu(NotWritten("Exercise 1")).status == "not written"


# -- Exercise 2 ------------------------------------------------------------------------------


def honest_footprint(bm, bk, bn, itemsize):
    buffers = [bm * bk, bk * bn, bm * bn]
    return sum(2 * b * itemsize for b in buffers) + bm * bn * 4


def acc_at(b, size):
    return lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) * s + b * bm * bn * size


EX2_MISTAKES = [
    ("each block once", lambda bm, bk, bn, s: (bm * bk + bk * bn + bm * bn) * s + 4 * bm * bn,
     "once", "double-buffers"),
    ("no accumulator", lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) * s,
     "left out the accumulator", "float32"),
    ("accumulator in the inputs' dtype",
     lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) * s + bm * bn * s,
     "counted in the inputs' dtype", "float32 (4 bytes)"),
    ("accumulator double-buffered",
     lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) * s + 8 * bm * bn,
     "accumulator is counted twice", "single"),
    ("output single-buffered",
     lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn) * s + bm * bn * s + 4 * bm * bn,
     "output block is not double-buffered", "two buffers"),
    ("elements, not bytes", lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) + bm * bn,
     "elements, not bytes", "itemsize"),
    ("bits", lambda bm, bk, bn, s: 8 * honest_footprint(bm, bk, bn, s), "bits", "bytes"),
    ("MiB", lambda bm, bk, bn, s: honest_footprint(bm, bk, bn, s) / 2**20, "MiB", "bytes"),
    ("something else", lambda bm, bk, bn, s: bm * bk * s + 7, "x the model's", "two buffers"),
]


@pytest.mark.parametrize("what, answer, message, hint", EX2_MISTAKES,
                         ids=[m[0] for m in EX2_MISTAKES])
@pytest.mark.mistake
def test_footprint_mistakes_are_named(what, answer, message, hint):
    r = ch07.check_footprint(answer)
    assert not r and message in r.message and hint in r.hint and r.answer, (what, r)
    assert "bytes" in r.answer and str(r.answer) not in r.message


def test_footprint_honest_course_and_garbage():
    assert ch07.check_footprint(honest_footprint)
    assert answers.footprint(1024, 1024, 1024, 2) == 16 * 2**20
    r = ch07.check_footprint(answers.footprint)
    assert not r and "course's own function" in r.message
    r = ch07.check_footprint(lambda *a: answers.footprint(*a))
    assert not r and "course's own function" in r.message
    assert not ch07.check_footprint(lambda *a: None)
    assert "string" in ch07.check_footprint(lambda *a: "4194304").message
    ex = ch07.LAB.exercises[1]
    assert ex.grade_hidden({"vmem_footprint": honest_footprint}, SEED)
    two_bytes = lambda bm, bk, bn, s: honest_footprint(bm, bk, bn, 2 if s == 2 else 4)
    assert ch07.check_footprint(two_bytes)  # right on the notebook's sizes (2 and 4) only
    r = ex.grade_hidden({"vmem_footprint": two_bytes}, SEED)
    assert not r and "1-byte elements" in r.message and not r.answer


def test_footprint_is_a_locked_prediction(capsys):
    ch07.LAB.predict("Exercise 2", honest_footprint)
    assert ch07.LAB.predicted("Exercise 2")
    r = ch07.check_footprint(lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) * s)
    assert r and "recorded before the measurement" in r.message  # the locked one is graded


# -- Exercise 3 ------------------------------------------------------------------------------

RIGHT = {"a": "fits", "b": "misaligned", "c": "fits", "d": "too big", "e": "misaligned",
         "f": "fits", "g": "too big"}


def test_verdicts_against_the_compiler():
    if not COMPILER:
        assert ch07.check_verdicts(RIGHT).status == "skipped"
        return
    assert ch07.check_verdicts(RIGHT)
    assert ch07.check_verdicts({**RIGHT, "d": "Too_Big", "a": "OK"})
    # a misaligned block (bk = 64 is not a multiple of 128) predicted to fit
    r = ch07.check_verdicts({**RIGHT, "b": "fits"})
    assert not r and ": b" in r.message and "128" in r.hint and "scoped" not in r.hint
    # a VMEM overflow predicted to fit: single-buffered it would (11 MiB < 16 MiB)
    r = ch07.check_verdicts({**RIGHT, "g": "fits"})
    assert not r and ": g" in r.message and "double-buffered" in r.hint
    assert "18.00 MiB" in r.answer and "18.00" not in r.message
    # a large but aligned block called misaligned
    r = ch07.check_verdicts({**RIGHT, "f": "misaligned"})
    assert not r and "however large" in r.hint
    assert not ch07.check_verdicts({**RIGHT, "a": "maybe"})
    assert not ch07.check_verdicts(["fits"] * 7)
    r = ch07.check_verdicts({"a": "fits"})
    assert not r and "no verdict" in r.message


# -- Exercise 4 ------------------------------------------------------------------------------


def scores(q, k, bq, interpret, *, scale=None, subtract_max=True, softmax_in_kernel=True,
           transpose_outside=False, grid_bq=None):
    """Written differently from the course's: jnp.dot with k transposed in the kernel."""
    (lq, d), lk = q.shape, k.shape[0]
    bq_grid = grid_bq or bq
    root = math.sqrt(scale or d)

    def kernel(q_ref, k_ref, o_ref):
        kk = k_ref[...] if transpose_outside else k_ref[...].T
        s = jnp.dot(q_ref[...], kk, preferred_element_type=jnp.float32) * (1 / root)
        if not softmax_in_kernel:
            o_ref[...] = s.astype(o_ref.dtype)
            return
        if subtract_max:
            s = s - jnp.max(s, axis=1, keepdims=True)
        e = jnp.exp(s)
        o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)

    k_in = k.T if transpose_outside else k
    k_spec = pl.BlockSpec(k_in.shape, lambda i: (0, 0))
    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype), grid=(lq // bq_grid,),
        in_specs=[pl.BlockSpec((bq_grid, d), lambda i: (i, 0)), k_spec],
        out_specs=pl.BlockSpec((bq_grid, lk), lambda i: (i, 0)), interpret=interpret)(q, k_in)
    return out if softmax_in_kernel else jax.nn.softmax(out, axis=-1)


def nn_softmax_in_kernel(q, k, bq, interpret):
    (lq, d), lk = q.shape, k.shape[0]

    def kernel(q_ref, k_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        o_ref[...] = jax.nn.softmax(s / math.sqrt(d), axis=-1).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype), grid=(lq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)), pl.BlockSpec((lk, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bq, lk), lambda i: (i, 0)), interpret=interpret)(q, k)


def copy_then_softmax(q, k, bq, interpret):
    s = copies(q @ k.T / math.sqrt(q.shape[1]), bq, k.shape[0], interpret)
    return jax.nn.softmax(s, axis=-1)


def test_attention_scores_honest():
    assert ch07.check_attention_scores(nn_softmax_in_kernel, compiled=False)


EX4_MISTAKES = [
    ("a copying kernel and jax.nn.softmax", copy_then_softmax, "matmul runs outside", "inside"),
    ("the softmax after the kernel", lambda *a: scores(*a, softmax_in_kernel=False),
     "softmax runs outside", "VMEM"),
    ("k transposed outside", lambda *a: scores(*a, transpose_outside=True),
     "transposed outside", "dot_general"),
    ("no max subtracted", lambda *a: scores(*a, subtract_max=False),
     "does not subtract each row's max", "overflow"),
    ("not scaled", lambda *a: scores(*a, scale=1), "not scaled", "sqrt(d)"),
    ("scaled by sqrt(64) typed in", lambda *a: scores(*a, scale=64), "fixed number",
     "q.shape[-1]"),
    ("one block for all queries", lambda q, k, bq, i: scores(q, k, bq, i, grid_bq=q.shape[0]),
     "does not step over the queries", "Lq // bq"),
    ("no kernel", lambda q, k, bq, i: jax.nn.softmax(q @ k.T / math.sqrt(q.shape[1])),
     "no pallas_call", "pl.pallas_call"),
    ("two kernels", lambda q, k, bq, i: copies(scores(q, k, bq, i), bq, k.shape[0], i),
     "2 pallas_calls", "HBM"),
]


@pytest.mark.parametrize("what, answer, message, hint", EX4_MISTAKES,
                         ids=[m[0] for m in EX4_MISTAKES])
@pytest.mark.mistake
def test_attention_scores_mistakes_are_named(what, answer, message, hint):
    r = ch07.check_attention_scores(answer, compiled=False)
    assert r.status == "failed", (what, r)
    assert message in r.message and hint in r.hint, (what, r)


@pytest.mark.mistake
def test_attention_scores_course_and_garbage():
    for answer in (answers.attention_scores_reference, answers.scores_reference,
                   lambda q, k, bq, i: answers.scores_reference(q, k)):
        r = ch07.check_attention_scores(answer, compiled=False)
        assert not r and "course's own function" in r.message
    assert not ch07.check_attention_scores(lambda *a: None, compiled=False)
    assert ch07.check_attention_scores(NotWritten("Exercise 4")).status == "not written"


# -- Exercise 5 ------------------------------------------------------------------------------


@pytest.fixture
def reachable(monkeypatch):
    """Exercise 5's checker on this CPU: as on a GPU runtime, where its needs are met."""
    monkeypatch.setattr(_core.Exercise, "unmet", lambda self: None)
    return ch07.check_fast


def test_fast_is_skipped_off_a_tpu():
    if jax.default_backend() == "tpu":
        pytest.skip("graded on a TPU")
    assert ch07.check_fast(honest_dense, (512, 512, 512)).status == "skipped"


@pytest.mark.skipif(jax.default_backend() == "tpu", reason="times on a TPU")
def test_fast_needs_a_pallas_kernel_before_any_timing(reachable):
    assert reachable(honest_dense, (512, 1024, 1024)).status == "skipped"
    r = reachable(lambda x, w, b, *a: jax.nn.relu(jnp.dot(x, w) + b), (512, 512, 512))
    assert not r and "no pallas_call" in r.message
    r = reachable(dot_then_copy, (512, 512, 512))
    assert not r and "outside your kernel" in r.message
    r = reachable(epilogue_outside, (512, 512, 512))
    assert not r and "activation runs outside" in r.message
    r = reachable(lambda *a: honest_dense(*a, semantics=SEMANTICS_K_PARALLEL), (512, 512, 512))
    assert not r and "'parallel'" in r.message
    r = reachable(into_output, (512, 512, 512))
    assert not r and "bfloat16" in r.message
    for course in (answers.dense_relu_reference, lambda x, w, b, *a: jax.nn.relu(
            pallas_tools.matmul_ktiled(x, w, *a) + b)):
        r = reachable(course, (512, 512, 512))
        assert not r and "course's own function" in r.message
    assert "divide" in reachable(honest_dense, (512, 500, 512)).message
    assert "three" in reachable(honest_dense, "512").message
    assert "three" in reachable(honest_dense, (512, 512)).message


def test_fast_grades_the_locked_prediction(reachable, capsys):
    ch07.LAB.predict("Exercise 5", (512, 500, 512))
    assert ch07.LAB.predicted("Exercise 5")
    r = reachable(honest_dense, (512, 1024, 1024))  # changed after the measurement
    assert not r and "divide" in r.message and "recorded before" in r.message


def test_scorecard_of_an_empty_namespace():
    total = ch07.LAB.scorecard({}).total()
    assert total.startswith("Lab 7: 0 of ")


def test_fast_blocks_depend_on_the_chip_by_the_chapters_model():
    """Lab 7 Ex 5's choice, by chapter 7's 3-D traffic model: (512, 1024, 1024) is
    compute-bound on a v5e and HBM-bound on a v6e (ridge 560), where (1024, 512, 2048) is
    compute-bound but needs 22 MiB of VMEM: over a v5e's 16 MiB scoped limit, under a v6e's
    32 MiB (the limits chapter 7 measures: tests/test_pallas_tools.py)."""
    from tpu_course import hardware

    m, k, n = ch07.FAST_PROBLEM
    narrow, wide = (512, 1024, 1024), (1024, 512, 2048)
    for (bm, bk, bn) in (narrow, wide):  # the model against the bytes counted by hand
        moved = (m * k * (n // bn) + k * n * (m // bm) + m * n) * 2
        assert ch07._ktiled_intensity((bm, bk, bn)) == pytest.approx(2 * m * k * n / moved)
    v5e, v6e = (hardware.get(c).critical_intensity() for c in ("v5e", "v6e"))
    assert v5e < ch07._ktiled_intensity(narrow) < v6e < ch07._ktiled_intensity(wide)
    assert 16 * 2**20 < answers.footprint(*wide, 2) <= 32 * 2**20
    assert answers.footprint(*narrow, 2) <= 16 * 2**20

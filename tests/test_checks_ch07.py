"""Lab 7 checkers: the right kernels pass; planted wrong ones (a wrong index map, a missing
accumulator zeroing, a misaligned block, a VMEM overflow) fail with a hint that names the
mistake; garbage never raises."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_course import hlo
from tpu_course.checks import NotWritten, ch07

COMPILER = hlo.tpu_compiler_problem() is None


def ktiled(x, y, bm, bk, bn, interpret, *, kernel=ch07.ktiled_kernel, y_map=None):
    """The reference kernel, with a kernel body or y's index map swapped in for a plant."""
    m, k = x.shape
    n = y.shape[1]
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), y_map or (lambda i, j, kk: (kk, j)))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        interpret=interpret)(x, y)


def never_zeroed(x_ref, y_ref, o_ref, acc_ref):
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def zeroed_once(x_ref, y_ref, o_ref, acc_ref):
    first = (pl.program_id(0) == 0) & (pl.program_id(1) == 0) & (pl.program_id(2) == 0)

    @pl.when(first)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    never_zeroed(x_ref, y_ref, o_ref, acc_ref)


def overwrites(x_ref, y_ref, o_ref, acc_ref):
    acc_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def test_registry():
    lab = ch07.LAB
    assert len(lab.exercises) == 5
    assert {"transfer", "predict"} <= {e.kind for e in lab.exercises}
    assert [e.needs for e in lab.exercises] == ["cpu", "cpu", "tpu-compiler", "cpu", "accelerator"]


def test_matmul_ktiled_right_and_planted_wrong():
    assert ch07.check_matmul_ktiled(ktiled)
    r = ch07.check_matmul_ktiled(lambda *a: ktiled(*a, y_map=lambda i, j, kk: (kk, i)))
    assert not r and "index maps" in r.hint and "wrong" in r.message
    r = ch07.check_matmul_ktiled(lambda *a: ktiled(*a, y_map=lambda i, j, kk: (j, kk)))
    assert not r and "index maps" in r.hint and "outside" in r.message
    r = ch07.check_matmul_ktiled(lambda *a: ktiled(*a, kernel=never_zeroed))
    assert not r and "zero" in r.hint
    r = ch07.check_matmul_ktiled(lambda *a: ktiled(*a, kernel=zeroed_once))
    assert not r and "sum of all the blocks before" in r.message and "zero" in r.hint
    r = ch07.check_matmul_ktiled(lambda *a: ktiled(*a, kernel=overwrites))
    assert not r and "last K block" in r.message
    r = ch07.check_matmul_ktiled(lambda x, y, *a: x @ y)
    assert not r and "pallas_call" in r.message
    assert not ch07.check_matmul_ktiled(lambda *a: "256")
    assert ch07.check_matmul_ktiled(NotWritten("Exercise 1")).status == "not written"


def test_footprint():
    assert ch07.footprint(1024, 1024, 1024, 2) == 16 * 2**20
    assert ch07.check_footprint(ch07.footprint)
    r = ch07.check_footprint(lambda bm, bk, bn, s: (bm * bk + bk * bn + bm * bn) * s + 4 * bm * bn)
    assert not r and "once" in r.message and "double-buffers" in r.hint and r.answer
    r = ch07.check_footprint(lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + bm * bn) * s)
    assert not r and "accumulator" in r.message
    r = ch07.check_footprint(lambda bm, bk, bn, s: 2 * (bm * bk + bk * bn + 2 * bm * bn) * s)
    assert not r
    assert not ch07.check_footprint(lambda *a: None)


RIGHT = {"a": "fits", "b": "misaligned", "c": "fits", "d": "too big", "e": "misaligned",
         "f": "fits", "g": "too big"}


def test_verdicts_against_the_compiler():
    if not COMPILER:
        assert ch07.check_verdicts(RIGHT).status == "skipped"
        return
    assert ch07.check_verdicts(RIGHT)
    # a misaligned block (bk = 64 is not a multiple of 128) predicted to fit
    r = ch07.check_verdicts({**RIGHT, "b": "fits"})
    assert not r and ": b" in r.message and "128" in r.hint
    # a VMEM overflow predicted to fit: single-buffered it would (11 MiB < 16 MiB)
    r = ch07.check_verdicts({**RIGHT, "g": "fits"})
    assert not r and ": g" in r.message and "scoped" in r.hint and "18.00 MiB" in r.answer
    assert not ch07.check_verdicts({**RIGHT, "a": "maybe"})
    assert not ch07.check_verdicts(["fits"] * 7)
    r = ch07.check_verdicts({"a": "fits"})
    assert not r and "no verdict" in r.message


def scores(q, k, bq, interpret, scale=True):
    lq, d = q.shape
    lk = k.shape[0]

    def kernel(q_ref, k_ref, o_ref):
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        if scale:
            s = s / math.sqrt(d)
        e = jnp.exp(s - s.max(axis=-1, keepdims=True))
        o_ref[...] = (e / e.sum(axis=-1, keepdims=True)).astype(o_ref.dtype)

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((lq, lk), q.dtype), grid=(lq // bq,),
        in_specs=[pl.BlockSpec((bq, d), lambda i: (i, 0)), pl.BlockSpec((lk, d), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bq, lk), lambda i: (i, 0)), interpret=interpret)(q, k)


def test_attention_scores():
    r = ch07.check_attention_scores(scores)
    assert r and ("one Mosaic custom call" in r.message) == COMPILER
    r = ch07.check_attention_scores(lambda *a: scores(*a, scale=False))
    assert not r and "sqrt(d)" in r.hint
    r = ch07.check_attention_scores(lambda q, k, bq, i: jax.nn.softmax(q @ k.T / math.sqrt(q.shape[1])))
    assert not r and "pallas_call" in r.message
    assert not ch07.check_attention_scores(lambda *a: None)


def test_fast_is_skipped_off_a_tpu():
    if jax.default_backend() == "tpu":
        pytest.skip("graded on a TPU")
    assert ch07.check_fast(ktiled, (512, 512, 512)).status == "skipped"


def test_scorecard_of_an_empty_namespace():
    total = ch07.LAB.scorecard({}).total()
    assert total.startswith("Lab 7: 0 of ")

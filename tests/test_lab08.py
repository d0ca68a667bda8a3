"""Lab 8's predictions and causal attention (exercises 1, 2, 4, 7): every known mistake is
refused with its hint; honest solutions written unlike the course's pass (grading's hidden
cases and the notebook's check). Exercise 3 (the sharded step, on 8 devices) is tested in
test_lab08_sharded.py, exercises 5 and 6 (the resume and decode loops) in
test_lab08_loops.py, which also holds the test that lab 8's stored visible data are current
(most of their cost is the outputs of exercises 5 and 6, which that file's tests compute)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import assess
from tpu_course import hardware, lm
from tpu_course.checks import ch08, engine

LAB = 8


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB, only=(1, 2, 4, 7)))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


# -- honest answers, written unlike the course's ---------------------------------------------

CFG = ch08.exercise1_config()


def honest_size():
    """Every weight's shape multiplied out (the course adds up per block)."""
    d, f, h = CFG.d_model, CFG.d_ff, CFG.heads
    shapes = [(CFG.vocab, d), (CFG.context, d), (d,), (d, CFG.vocab)]
    shapes += CFG.layers * ([(d, h, d // h)] * 3 + [(h, d // h, d), (d, f), (f, d), (d,), (d,)])
    n = sum(math.prod(s) for s in shapes)
    looked_up = (CFG.vocab + CFG.context) * d
    return n, 6 * (n - looked_up) + 12 * CFG.layers * d * CFG.context


def honest_attention(q, k, v):
    """An additive upper-triangle mask, a hand-written softmax, matmuls in q's dtype."""
    t = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    s = s * q.shape[-1] ** -0.5 + jnp.triu(jnp.full((t, t), -jnp.inf), 1)
    w = jnp.exp(s - s.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", w, v).astype(q.dtype)


def honest_ridge():
    """Bisection on the intensity from the chip's numbers (the course solves for b)."""
    c, chip = ch08.decode_config(), hardware.get(ch08.DECODE_CHIP)
    t, n = ch08.DECODE_POSITION + 1, lm.param_count(c)

    def intensity(b):
        flops = b * (2 * (n - (c.vocab + c.context) * c.d_model) + 4 * c.layers * c.d_model * t)
        return flops / (2 * n + b * 4 * c.layers * c.d_model * t)

    lo, hi = 1.0, 1e6
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if intensity(mid) < chip.peak_bf16_flops_per_s / chip.hbm_bytes_per_s \
            else (lo, mid)
    return hi


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 1", honest_size()),
    ("Exercise 1", (np.int64(honest_size()[0]), float(honest_size()[1]) * 1.015)),
    ("Exercise 2", honest_attention),
    ("Exercise 4", jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    ("Exercise 4", " jax.checkpoint_policies.dots_with_no_batch_dims_saveable"),
    ("Exercise 7", honest_ridge()),
    ("Exercise 7", math.ceil(honest_ridge())),
], ids=lambda v: v if isinstance(v, str) else "")
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


# -- shortcuts and answers that are not the known mistakes ------------------------------------


@pytest.mark.parametrize(("answer", "words"), [
    ((str(honest_size()[0]), honest_size()[1]), ("string", "quotes")),
    ((None, honest_size()[1]), ("one number",)),
    (([honest_size()[0]], honest_size()[1]), ("one number",)),
    ((honest_size()[0], honest_size()[1] * 1.03), ("1.03x", "lookups")),
])
def test_size_prediction_refuses_what_is_not_the_count(answer, words):
    assess.failed(assess.graded(LAB, "Exercise 1", answer), *words)


@pytest.mark.parametrize(("choice", "words"), [
    ("none", ("over the budget", "saves less")),
    ("dots_saveable", ("over the budget", "batched", "saves less")),
    (jax.checkpoint_policies.checkpoint_dots, ("over the budget", "saves less")),
    ("everything_saveable", ("over the budget", "saves less")),
    ("nothing_saveable", ("recomputes less", "weight matmuls")),
    ("dots", ("not one of the policies", "dots_saveable")),
    (3, ("name a policy",)),
])
def test_remat_choices_are_measured(choice, words):
    assess.failed(assess.graded(LAB, "Exercise 4", choice), *words)


def test_remat_budget_separates_the_policies():
    temps = {p: ch08.remat_measurement(p)[0] for p in ch08.POLICIES}
    assert temps["dots_with_no_batch_dims_saveable"] < 0.97 * ch08.REMAT_BUDGET_BYTES, temps
    assert temps["dots_saveable"] > 1.03 * ch08.REMAT_BUDGET_BYTES, temps
    assert temps["nothing_saveable"] < temps["dots_with_no_batch_dims_saveable"] < temps["none"]


def test_a_prediction_edited_after_the_measurement_is_not_graded():
    try:
        ch08.LAB.predict("Exercise 4", "dots_with_no_batch_dims_saveable")
        assert ch08.LAB.predicted("Exercise 4")
        result = ch08.check_remat_policy("nothing_saveable")
        assert result.passed and "recorded before the measurement" in result.message, result
    finally:
        engine._PREDICTIONS.clear()


def _raises(*_):
    raise TypeError("something inside went wrong")


@pytest.mark.parametrize(("title", "answer", "words"), [
    ("Exercise 2", None, ("raised TypeError", "(batch, length, heads, head_dim)")),
    ("Exercise 2", _raises, ("raised TypeError", "something inside")),
    ("Exercise 2", lambda q, k, v: q[:, :-1], ("shape", "the shape of q")),
    ("Exercise 2", lambda q, k, v: v, ("query position 1", "scores q . k")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_written_exercises_refuse_what_is_not_an_answer(title, answer, words):
    assess.failed(assess.graded(LAB, title, answer), *words)


@pytest.mark.parametrize(("value", "words"), [
    (str(round(honest_ridge())), ("string",)),
    (None, ("one number",)),
    (honest_ridge() * 1.2, ("1.20x",)),
    (math.inf, ("finite",)),
])
def test_ridge_refuses_what_is_not_the_roofline(value, words):
    assess.failed(assess.graded(LAB, "Exercise 7", value), *words)

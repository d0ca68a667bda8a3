"""Lab 8's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check).

Exercise 2 runs on 8 simulated CPU devices, so its answers run in one subprocess; its
mistakes are rules on the probe's data, also fed here as data."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import grading
from tests import assess
from tpu_course import hardware, lm
from tpu_course.checks import ch08, engine

LAB = 8


@pytest.fixture(autouse=True, scope="module")
def _remembered_expectations():
    """The keys' outputs are the same for every test: compute each exercise's once."""
    plain = grading.expected
    memo = {}

    def expected(exercise, key, cases, **kw):
        k = (exercise.title, repr([(c.label, c.args) for c in cases]), repr(kw))
        if k not in memo:
            memo[k] = plain(exercise, key, cases, **kw)
        return memo[k]

    grading.expected = expected
    yield
    grading.expected = plain


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []


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


def honest_decode(weights, x, cache, pos):
    """A one-hot write, an additive mask, heads flattened, float32 inside."""
    keys, values = cache
    b, t, h, k = keys.shape
    d = x.shape[-1]
    q = (x @ weights["wq"].reshape(d, -1)).reshape(b, h, k)
    here = (jnp.arange(t) == pos)[None, :, None, None]
    keys = jnp.where(here, (x @ weights["wk"].reshape(d, -1)).reshape(b, 1, h, k), keys)
    values = jnp.where(here, (x @ weights["wv"].reshape(d, -1)).reshape(b, 1, h, k), values)
    s = jnp.einsum("bhk,bthk->bht", q.astype(jnp.float32), keys.astype(jnp.float32)) / k ** 0.5
    p = jax.nn.softmax(s + jnp.where(jnp.arange(t) > pos, -1e30, 0.0), -1)
    o = jnp.einsum("bht,bthk->bhk", p, values.astype(jnp.float32)).reshape(b, h * k)
    return (o @ weights["wo"].reshape(h * k, -1).astype(jnp.float32)).astype(x.dtype), (keys, values)


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
    ("Exercise 3", jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
    ("Exercise 3", " jax.checkpoint_policies.dots_with_no_batch_dims_saveable"),
    ("Exercise 4", honest_decode),
    ("Exercise 5", honest_ridge()),
    ("Exercise 5", math.ceil(honest_ridge())),
], ids=lambda v: v if isinstance(v, str) else "")
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


# -- shortcuts and answers that are not the known mistakes ------------------------------------


def failed(title, answer, *words, learner="someone"):
    result = assess.graded(LAB, title, answer, learner)
    assert result.status == "failed", result
    text = f"{result.message} / {result.hint}"
    assert all(w in text for w in words), result
    assert "Traceback" not in text and "site-packages" not in text, result
    return result


@pytest.mark.parametrize(("answer", "words"), [
    ((str(honest_size()[0]), honest_size()[1]), ("string", "quotes")),
    ((None, honest_size()[1]), ("one number",)),
    (([honest_size()[0]], honest_size()[1]), ("one number",)),
    ((honest_size()[0], honest_size()[1] * 1.03), ("1.03x", "lookups")),
])
def test_size_prediction_refuses_what_is_not_the_count(answer, words):
    failed("Exercise 1", answer, *words)


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
    failed("Exercise 3", choice, *words)


def test_remat_budget_separates_the_policies():
    temps = {p: ch08.remat_measurement(p)[0] for p in ch08.POLICIES}
    assert temps["dots_with_no_batch_dims_saveable"] < 0.97 * ch08.REMAT_BUDGET_BYTES, temps
    assert temps["dots_saveable"] > 1.03 * ch08.REMAT_BUDGET_BYTES, temps
    assert temps["nothing_saveable"] < temps["dots_with_no_batch_dims_saveable"] < temps["none"]


def test_a_prediction_edited_after_the_measurement_is_not_graded():
    try:
        ch08.LAB.predict("Exercise 3", "dots_with_no_batch_dims_saveable")
        assert ch08.LAB.predicted("Exercise 3")
        result = ch08.check_remat_policy("nothing_saveable")
        assert result.passed and "recorded before the measurement" in result.message, result
    finally:
        engine._PREDICTIONS.clear()


def _pos_as_int(weights, x, cache, pos):
    keys, values = cache
    return honest_decode(weights, x, (keys[:, : int(pos) + 1], values), pos)


class _Counts:
    """Counts its calls from the notebook's first position instead of reading pos."""

    def __init__(self):
        self.calls = 0

    def __call__(self, weights, x, cache, pos):
        self.calls += 1
        return honest_decode(weights, x, cache, 8 + self.calls)


def _raises(kind):
    def decode_step(weights, x, cache, pos):
        raise kind("something inside went wrong")
    return decode_step


@pytest.mark.parametrize(("step", "words"), [
    (_pos_as_int, ("traced under jit", "dynamic_update_slice")),
    (_Counts(), ("differs",)),
    (_raises(TypeError), ("raised TypeError", "something inside", "a tuple (keys, values)")),
    (_raises(jax.errors.JaxRuntimeError), (f"raised {jax.errors.JaxRuntimeError.__name__}", "something inside")),
    (lambda w, x, c, p: x, ("(out, (keys, values))",)),
    (lambda w, x, c, p: (x[:, :3], c), ("shape",)),
    (None, ("raised TypeError",)),
])
def test_decode_shortcuts_fail_with_a_hint(step, words):
    failed("Exercise 4", step, *words)


def test_a_step_that_recomputes_attention_is_named():
    ex = ch08.LAB.find(4)
    case = ex.cases[0]
    want = ch08.decode_truth(**case.args)
    got = {**want, "flops": 1e9}
    result = engine.judge(ex, [case], [got], [want], [[(m, engine.NO_OUTPUT) for m in ex.rules]])
    assert "recomputes attention" in result.message and "no length x length" in result.hint


def test_decode_float32_out_of_bf16_is_refused():
    def upcast(weights, x, cache, pos):
        out, (keys, values) = honest_decode(weights, x, cache, pos)
        return out.astype(jnp.float32), (keys, values)

    failed("Exercise 4", upcast, "bfloat16 came in", "float32")


@pytest.mark.parametrize(("value", "words"), [
    (str(round(honest_ridge())), ("string",)),
    (None, ("one number",)),
    (honest_ridge() * 1.2, ("1.20x",)),
    (math.inf, ("finite",)),
])
def test_ridge_refuses_what_is_not_the_roofline(value, words):
    failed("Exercise 5", value, *words)


# -- Exercise 2: its rules on data, its probe on 8 devices ------------------------------------

GOOD = {"embed": (("data",), ()), "wq": (("data",), ("model",), ()),
        "wk": (("data",), ("model",), ()), "wv": (("data",), ("model",), ()),
        "wo": (("model",), (), ("data",))}


def _data(losses, params=(), moments=(), collectives=("all-gather", "all-reduce")):
    axes = {**GOOD, **dict(params)}
    axes |= {f"{n} {m}": a for n, a in list(axes.items()) for m in ("mu", "nu")} | dict(moments)
    return {"axes": axes, "collectives": list(collectives), "losses": losses}


@pytest.mark.parametrize(("changes", "words"), [
    ({}, ()),
    ({"moments": {"wq mu": ((), (), ())}}, ("first moment of wq is replicated", "tree_map_params")),
    ({"params": {"embed": ((), ("data",))}}, ("feature axis", "rows")),
    ({"params": {"wk": (("data",), (), ("model",))}, "collectives": ["all-to-all"]},
     ("wk splits the head_dim", "same axis")),
    ({"params": {n: (("data",), (), ()) for n in ("wq", "wk", "wv")}},
     ("heads of wq are not split", "axis 1 of wq")),
    ({"params": {"wq": ((), ("model",), ())}}, ("not FSDP", "'data' too")),
    ({"losses": (9.0, 9.0)}, ("differ from one device's", "shardings only")),
])
def test_attention_rules_name_the_problem(changes, words):
    ex = ch08.LAB.find(2)
    case = ex.cases[0]
    want = (5.5, 5.4)
    got = _data(changes.pop("losses", want), **changes)
    mistakes = [[(m, engine.NO_OUTPUT) for m in ex.rules]]
    result = engine.judge(ex, [case], [got], [want], mistakes)
    assert result.passed == (not words), result
    assert all(w in f"{result.message} / {result.hint}" for w in words), result


SCRIPT = r'''
import json, jax, optax
from jax.sharding import NamedSharding, PartitionSpec as P
from tests import assess
from tpu_course.checks import ch08

LAYOUT = {"embed": P(("data",), None), "wq": P("data", "model"), "wk": P("data", "model"),
          "wv": P("data", "model"), "wo": P("model", None, "data")}

def honest(state, mesh, layout=LAYOUT):
    """Params by name, the optimizer's part with optax.tree_map_params."""
    shard = {k: NamedSharding(mesh, layout[k]) for k in state[0]}
    opt = optax.tree_map_params(optax.adamw(1e-2), lambda _, s: s, state[1], shard,
                                transform_non_params=lambda _: NamedSharding(mesh, P()),
                                is_leaf=lambda x: isinstance(x, NamedSharding))
    return shard, opt

def layout(**changes):
    return lambda state, mesh: honest(state, mesh, {**LAYOUT, **changes})

out = {"honest": assess.graded(8, "Exercise 2", honest)}
for name, answer in {
        "kv_head_dim": layout(wk=P("data", None, "model"), wv=P("data", None, "model")),
        "indivisible": layout(wq=P(None, ("data", "model"))),
        "params_only": lambda state, mesh: honest(state, mesh)[0],
        "raises": lambda state, mesh: state.nope}.items():
    out[name] = ch08.check_attention_shardings(answer)
print(json.dumps({k: [r.status, r.message, r.hint] for k, r in out.items()}))
'''


def test_attention_shardings_on_eight_devices(subprocess_runner):
    r = subprocess_runner(SCRIPT, devices=8, timeout_s=300)
    assert r["honest"][0] == "passed" and "not shown" in r["honest"][1], r["honest"]
    for name, words in {"kv_head_dim": ("all-to-all", "wk, wv split the head_dim"),
                        "indivisible": ("do not divide", "of size 4", "'model' alone"),
                        "params_only": ("only the parameters' shardings", "opt_state"),
                        "raises": ("raised AttributeError", "NamedSharding per leaf")}.items():
        status, message, hint = r[name]
        assert status == "failed" and all(w in f"{message} / {hint}" for w in words), (name, r[name])

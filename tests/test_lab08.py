"""Lab 8's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check).

Exercise 3 runs on 8 simulated CPU devices, so its answers run in one subprocess; its
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

    def expected(exercise, key, cases, wants=True):
        """Case by case, so that the visible cases' outputs serve every set they are in."""
        per_case = []
        for case in cases:
            k = (exercise.title, case.label, repr(case.args), wants)
            if k not in memo:
                memo[k] = plain(exercise, key, [case], wants=wants)
            per_case.append(memo[k])
        return ([w for ws, _ in per_case for w in ws], [m for _, ms in per_case for m in ms])

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


def honest_attention(q, k, v):
    """An additive upper-triangle mask, a hand-written softmax, matmuls in q's dtype."""
    t = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    s = s * q.shape[-1] ** -0.5 + jnp.triu(jnp.full((t, t), -jnp.inf), 1)
    w = jnp.exp(s - s.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", w, v).astype(q.dtype)


def honest_train(directory, steps, problem):
    """Params and optimizer state as two items of one checkpoint, saved after every step."""
    import orbax.checkpoint as ocp

    from tpu_course import textdata

    params, opt_state = problem.init()
    with ocp.CheckpointManager(directory) as manager:
        done = manager.latest_step()
        if done is not None:
            saved = manager.restore(done, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(params), opt=ocp.args.StandardRestore(opt_state)))
            params, opt_state = saved.params, saved.opt
        while (done or 0) < steps:
            done = done or 0
            batch = textdata.batch_at(problem.corpus, done, problem.batch, problem.length,
                                      problem.seed)
            params, opt_state, _ = problem.step(params, opt_state, *batch)
            done += 1
            manager.save(done, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), opt=ocp.args.StandardSave(opt_state)))
        manager.wait_until_finished()
    return params


def honest_generate(model, prompt, steps, key, temperature=0.0, top_k=None):
    """Top-k by sorting, the temperature before the mask, the whole loop in one list."""
    logits, cache = model.decode(prompt, lm.init_cache(model.config, prompt.shape[0]))
    tokens = []
    while len(tokens) < steps:
        last = logits[:, -1].astype(jnp.float32)
        if temperature > 0:
            last = last / temperature
            if top_k is not None:
                floor = jnp.sort(last, axis=-1)[:, -top_k, None]
                last = jnp.where(last < floor, -jnp.inf, last)
            token = jax.random.categorical(jax.random.fold_in(key, len(tokens)), last)
        else:
            token = last.argmax(-1)
        tokens.append(token)
        if len(tokens) < steps:
            logits, cache = model.decode(token.reshape(-1, 1).astype(jnp.int32), cache)
    return jnp.stack(tokens, axis=-1)


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
    ("Exercise 5", honest_train),
    ("Exercise 6", honest_generate),
    ("Exercise 7", honest_ridge()),
    ("Exercise 7", math.ceil(honest_ridge())),
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
    failed("Exercise 4", choice, *words)


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
    ("Exercise 5", lambda directory, steps, problem: None, ("not the parameters", "params")),
    ("Exercise 5", _raises, ("raised TypeError", "latest step")),
    ("Exercise 6", lambda model, prompt, steps, *_: jnp.zeros((prompt.shape[0], steps + 1)),
     ("shape", "one column per new byte")),
    ("Exercise 6", lambda model, prompt, steps, *_: jnp.zeros(
        (prompt.shape[0], prompt.shape[1] + steps), jnp.int32), ("new bytes only",)),
    ("Exercise 6", _raises, ("raised TypeError", "prefill")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_written_exercises_refuse_what_is_not_an_answer(title, answer, words):
    failed(title, answer, *words)


@pytest.mark.parametrize(("value", "words"), [
    (str(round(honest_ridge())), ("string",)),
    (None, ("one number",)),
    (honest_ridge() * 1.2, ("1.20x",)),
    (math.inf, ("finite",)),
])
def test_ridge_refuses_what_is_not_the_roofline(value, words):
    failed("Exercise 7", value, *words)


# -- Exercise 3: its rules on data, its probe on 8 devices ------------------------------------

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
    ex = ch08.LAB.find(3)
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

out = {"honest": assess.graded(8, "Exercise 3", honest)}
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

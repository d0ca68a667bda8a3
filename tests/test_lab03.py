"""Lab 3's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check); shortcuts that
are no known mistake fail with a useful hint."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import grading
from tests import assess
from tpu_course import parity
from tpu_course.checks import ch03, engine

LAB = 3
LR = ch03.LR



@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


# -- honest answers, written unlike the course's ----------------------------------------------


def clip_cond(w, g, max_norm):
    """lax.cond on the norm, the norm from vdot (the course's: jnp.minimum)."""
    norm = jnp.sqrt(jnp.vdot(g, g))
    g = jax.lax.cond(norm > max_norm, lambda g: g * (max_norm / norm), lambda g: g, g)
    return w - LR * g


def clip_optax(w, g, max_norm):
    """optax's own global-norm clip as a transformation."""
    clipped, _ = optax.clip_by_global_norm(max_norm).update(g, optax.EmptyState())
    return w - LR * clipped


def decay_exp2(w, g, lr, step):
    """exp2 of the halvings, jitted by a call rather than a decorator."""
    return w - g * (lr * jnp.exp2(-jnp.floor_divide(step, ch03.HALVING).astype(jnp.float32)))


def norms_loop(params, X, Y):
    """A Python loop of a jitted jax.grad, each gradient raveled (the course's: vmap)."""
    out, grad = [], jax.jit(jax.grad(ch03.mlp_loss))
    for i in range(X.shape[0]):
        flat, _ = ravel_pytree(grad(params, X[i], Y[i]))
        out.append(np.linalg.norm(np.asarray(flat)))
    return np.array(out)


@jax.jit
def norms_vmap_of_norm(params, X, Y):
    """vmap of a function that returns one example's norm (optax's tree norm)."""
    return jax.vmap(lambda x, y: optax.tree.norm(jax.grad(ch03.mlp_loss)(params, x, y)))(X, Y)


def convert_einsum(sd):
    return jax.tree.map(jnp.asarray, {
        "conv": {"kernel": np.einsum("oihw->hwio", sd["conv.weight"]), "bias": sd["conv.bias"]},
        "fc1": {"kernel": np.swapaxes(sd["fc1.weight"], 0, 1), "bias": sd["fc1.bias"]},
        "fc2": {"kernel": np.swapaxes(sd["fc2.weight"], 0, 1), "bias": sd["fc2.bias"]}})


@jax.jit
def forward_nchw_inside(params, x):
    """The conv in NCHW/OIHW, the flatten as an einsum over (C, H, W)."""
    xc = jnp.transpose(x, (0, 3, 1, 2))
    k = jnp.transpose(params["conv"]["kernel"], (3, 2, 0, 1))
    c = jax.lax.conv_general_dilated(xc, k, (1, 1), ((1, 1), (1, 1)),
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    c = c + params["conv"]["bias"][None, :, None, None]
    f1 = jnp.einsum("nchw,chwo->no", jax.nn.relu(c),
                    params["fc1"]["kernel"].reshape(c.shape[1:] + (-1,))) + params["fc1"]["bias"]
    f2 = jnp.einsum("nh,ho->no", jax.nn.relu(f1), params["fc2"]["kernel"]) + params["fc2"]["bias"]
    return {"conv": jnp.transpose(c, (0, 2, 3, 1)), "fc1": f1, "fc2": f2}


@jax.jit
def loss_by_hand(params, x, y):
    logits = forward_nchw_inside(params, x)["fc2"]
    picked = jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
    return jnp.mean(jax.scipy.special.logsumexp(logits, axis=1) - picked)


CHAINED = optax.chain(optax.scale(-LR))


def step_chained(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_by_hand)(params, x, y)
    updates, opt_state = CHAINED.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss


HONEST_PORT = (convert_einsum, forward_nchw_inside, loss_by_hand, step_chained, CHAINED)


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 1", clip_cond),
    ("Exercise 1", clip_optax),
    ("Exercise 2", np.int64(5)),
    ("Exercise 3", jax.jit(decay_exp2)),
    ("Exercise 4", norms_loop),
    ("Exercise 4", norms_vmap_of_norm),
    ("Exercise 5", HONEST_PORT),
], ids=lambda v: v if isinstance(v, str) else "")
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []


def test_the_keys_port_matches_pytorch():
    """Exercise 5's reference (it makes the hidden cases' expected arrays) matches the
    stored PyTorch run, and the visible case is that run's input."""
    ex, key = ch03.check_port.exercise, grading.keys(LAB)["Exercise 5"]
    (got,) = ex.run(grading.as_answer(ex, key.reference))
    assert parity.compare(ch03.reference(live=False).expected, got).passed


# -- shortcuts that are no known mistake ---------------------------------------------------------


def expect_fail(result, *words):
    text = f"{result.message} | {result.hint}"
    assert result.status == "failed", result
    assert result.hint and "Traceback" not in text, result
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


def test_a_hard_coded_visible_answer_fails_on_hidden_inputs():
    stored = {tuple(np.shape(w)[1:]): w for w in (
        engine.loads(engine.dumps(want)) for want in ch03.check_jit_fix.exercise.run(
            {"clipped_update": clip_cond}))}

    def replay(w, g, max_norm):  # the stored update of the gradient whose norm ratio is closest
        if w.shape not in stored:
            return w
        ratio = jnp.sqrt(jnp.sum(g * g)) / max_norm
        k = jnp.argmin(jnp.abs(ratio - jnp.asarray(ch03.CLIP_RATIOS)))
        return jnp.asarray(stored[w.shape])[k]

    assert ch03.check_jit_fix(replay).passed
    expect_fail(assess.graded(LAB, "Exercise 1", replay), "does not show")


def test_a_port_for_one_batch_size_fails_on_hidden_inputs():
    def forward(params, x):
        out = forward_nchw_inside(params, x)
        return out | {"fc1": out["fc1"].reshape(8, -1)}

    answer = (convert_einsum, forward, loss_by_hand, step_chained, CHAINED)
    assert ch03.check_port(*answer).passed
    expect_fail(assess.graded(LAB, "Exercise 5", answer), "does not show",
                "fc1")


def test_norms_that_remember_the_first_batch_fail():
    memo = []

    def remembered(params, X, Y):
        memo.append(memo[0] if memo else norms_loop(params, X, Y))
        return memo[-1]

    expect_fail(assess.graded(LAB, "Exercise 4", remembered), "does not show")


def test_a_static_version_that_compiled_every_call_before_still_fails():
    lr_static = jax.jit(lambda w, g, lr, step: w - lr * 0.5 ** (step // 100) * g,
                        static_argnames="lr")
    w = jnp.zeros(4)
    for lr, step in zip(ch03.LRS, ch03.STEPS):
        lr_static(w, w, lr, step)
    expect_fail(ch03.check_recompile_fix(lr_static), "lr is still static")


@pytest.mark.parametrize(("value", "words"), [
    ("5", ("string", "remove the quotes")), (None, ("should be one number",)),
    (2.5, ("cannot be a count", "whole number")), (0, ("cannot be a count",)),
    (6, ("too high", "cache key"))])
def test_predictions_that_are_no_count(value, words):
    expect_fail(ch03.check_compile_prediction(value), *words)


@pytest.mark.parametrize(("answer", "words"), [
    (None, ("raised",)), (lambda w, g, m: jnp.zeros(3), ("shape",)),
    (lambda w, g, m: (w - LR * g).astype(jnp.bfloat16), ("differs",)),
    (lambda w, g, m: 1 / 0, ("ZeroDivisionError",))])
def test_answers_of_the_wrong_kind_fail_with_a_hint(answer, words):
    expect_fail(ch03.check_jit_fix(answer), *words)


@pytest.mark.parametrize(("title", "answer", "words"), [
    ("Exercise 1", "python_if", ("TracerBoolConversionError", "no Python `if`")),
    ("Exercise 1", lambda w, g, m: w - LR * g / jnp.linalg.norm(g) * jnp.minimum(
        jnp.linalg.norm(g), m), ("a zero gradient has norm 0",)),
    ("Exercise 3", lambda w, g, lr, step: w - lr * 0.5 ** (step // 100) * g,
     ("not a jitted function", "jax.jit")),
    ("Exercise 4", lambda p, X, Y: norms_vmap_of_norm(p, X, Y)[:, None], (ch03.NORMS_HINTS["flat"],)),
    ("Exercise 4", lambda p, X, Y: norms_vmap_of_norm(p, X, Y)[:1], (ch03.NORMS_HINTS["one"],)),
    ("Exercise 4", lambda p, X, Y: jnp.stack([norms_vmap_of_norm(p, X, Y)] * 4, 1),
     (ch03.NORMS_HINTS["leaves"],)),
    ("Exercise 4", lambda p, X, Y: jax.vmap(jax.grad(ch03.mlp_loss), (None, 0, 0))(p, X, Y),
     (ch03.NORMS_HINTS["dict"],)),
    ("Exercise 4", lambda p, X, Y: norms_vmap_of_norm(p, X, Y) * np.nan, ("NaN or inf",))])
def test_mistakes_the_probes_and_rules_name(title, answer, words):
    """Mistakes named without a wrong answer in the keys: their hints come from the probe,
    the comparison or a rule, in grading and in the notebook."""
    if answer == "python_if":
        def answer(w, g, max_norm):
            norm = jnp.sqrt(jnp.sum(g ** 2))
            return w - LR * (g * (max_norm / norm) if norm > max_norm else g)
    expect_fail(assess.graded(LAB, title, answer), *words)
    expect_fail(ch03.LAB.find(title).check(answer), *words)


def test_stubs_are_not_written():
    def stub(*args):
        raise NotImplementedError("Exercise 3: write your code here")

    assert ch03.check_recompile_fix(stub).status == "not written"
    assert ch03.check_per_example_norms(stub).status == "not written"
    assert ch03.LAB.scorecard({}).total() == "Lab 3: 0 of 5 passed"


# -- Exercise 5's porting mistakes, named by the parity diagnosis --------------------------------


def make_step(loss, optimizer, finish=None):
    def train_step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        if finish is not None:
            return finish(params, updates, opt_state, value)
        return optax.apply_updates(params, updates), opt_state, value
    return train_step


def port(convert=convert_einsum, forward=forward_nchw_inside, loss=loss_by_hand,
         optimizer=CHAINED, finish=None):
    return convert, forward, loss, make_step(loss, optimizer, finish), optimizer


def _ce(forward):
    return jax.jit(lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(
        forward(p, x)["fc2"], y).mean())


def _kept(layer):
    """convert_einsum, but ``layer``'s kernel kept in PyTorch's layout."""
    def convert(sd):
        params = convert_einsum(sd)
        params[layer]["kernel"] = jnp.asarray(sd[f"{layer}.weight"])
        return params
    return convert


@jax.jit
def _nhwc_flatten(params, x):
    out = forward_nchw_inside(params, x)
    h = jax.nn.relu(out["conv"]).reshape(x.shape[0], -1)
    return out | {"fc1": h @ params["fc1"]["kernel"] + params["fc1"]["bias"]}


HINTS = ch03.PORT_HINTS
PORT_MISTAKES = {
    "fc2 weight not transposed": (port(_kept("fc2")), HINTS["params"], "transposed"),
    "conv kernel kept OIHW": (port(_kept("conv")), HINTS["params"], "OIHW"),
    "flatten order": (port(forward=_nhwc_flatten, loss=_ce(_nhwc_flatten)), HINTS["flatten"],
                      "channels-last"),
    "missing fc1 bias": (port(forward=lambda p, x: forward_nchw_inside(
        p | {"fc1": p["fc1"] | {"bias": 0 * p["fc1"]["bias"]}}, x)), HINTS["forward"], "bias"),
    "sum, not mean": (port(loss=lambda p, x, y: loss_by_hand(p, x, y) * x.shape[0]),
                      HINTS["loss"], "sum where the reference takes a mean"),
    "updates not applied": (port(finish=lambda p, u, s, v: (p, s, v)), HINTS["apply"],
                            "unchanged"),
    "updates returned": (port(finish=lambda p, u, s, v: (u, s, v)), HINTS["apply"],
                         "returns the updates"),
    "updates subtracted": (port(finish=lambda p, u, s, v: (jax.tree.map(jnp.subtract, p, u), s, v)),
                           HINTS["sign"], "along the gradient"),
    "lr 0.01": (port(optimizer=optax.sgd(0.01)), HINTS["sgd"], "0.1 times as far"),
    "a sign-based step": (port(optimizer=optax.chain(optax.scale_by_sign(), optax.scale(-LR))),
                          HINTS["sgd"], "Adam (or sign-based)"),
    "wrong return order": (port(finish=lambda p, u, s, v: (v, optax.apply_updates(p, u), s)),
                           None, "(loss, params, opt_state), not (params, opt_state, loss)"),
    "forward raises": (port(forward=lambda p, x: x @ p["fc1"]["kernel"]), None, "forward raised"),
    "missing layer": (port(forward=lambda p, x: {"fc2": forward_nchw_inside(p, x)["fc2"]}),
                      HINTS["missing"], "missing"),
}


@pytest.mark.parametrize("name", list(PORT_MISTAKES))
def test_port_mistakes_are_named(name):
    answer, hint, word = PORT_MISTAKES[name]
    result = ch03.check_port(*answer)
    expect_fail(result, word)
    if hint is not None:
        assert result.hint == hint, result

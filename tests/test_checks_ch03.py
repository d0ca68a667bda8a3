"""Lab 3 checkers accept the solution and name each plausible wrong answer."""

from __future__ import annotations

import numpy as np
import pytest

from tpu_course import parity
from tpu_course.checks import ch03

jax = pytest.importorskip("jax")
jnp = jax.numpy
optax = pytest.importorskip("optax")
lax = jax.lax

LR = 0.1


# ------------------------------------------------------------------ Exercise 1: jit fix

def clipped_good(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    return w - ch03.LR * g * jnp.minimum(1.0, max_norm / norm)


def clipped_python_if(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    if norm > max_norm:
        g = g * (max_norm / norm)
    return w - ch03.LR * g


def clipped_always(w, g, max_norm):
    return w - ch03.LR * g * (max_norm / jnp.sqrt(jnp.sum(g ** 2)))


def clipped_cond(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    g = lax.cond(norm > max_norm, lambda g: g * (max_norm / norm), lambda g: g, g)
    return w - ch03.LR * g


def test_jit_fix_accepts_where_and_cond():
    assert ch03.check_jit_fix(clipped_good)
    assert ch03.check_jit_fix(clipped_cond)


def test_jit_fix_names_the_python_if():
    r = ch03.check_jit_fix(clipped_python_if)
    assert not r and "tracer" in r.message and "jnp.where" in r.message


def test_jit_fix_rejects_clipping_always():
    r = ch03.check_jit_fix(clipped_always)
    assert not r and "exceeds max_norm" in r.hint and "expected" not in r.message


# ------------------------------------------------------------ Exercise 2: prediction


def test_compile_quiz_counts_with_jax_and_grades_the_prediction():
    added = ch03.run_compile_quiz()
    assert added[0] == 1 and added[1] == 0 and added[-1] == 0  # a new value is cached
    want = sum(added)
    assert ch03.check_compile_prediction(want)
    r = ch03.check_compile_prediction(len(ch03.COMPILE_QUIZ))  # "every call compiles"
    assert not r and "VALUE" in r.hint and r.answer
    r = ch03.check_compile_prediction(1)  # "jit compiles once"
    assert not r and "shape AND dtype" in r.hint and str(want) not in r.message
    assert not ch03.check_compile_prediction(str(want))
    assert not ch03.check_compile_prediction(None)


# -------------------------------------------------------- Exercise 3: the planted cause


def test_recompile_fix_accepts_a_traced_schedule():
    import functools

    import jax

    @jax.jit
    def good(w, g, lr, step):
        return w - lr * 0.5 ** (step // ch03.HALVING) * g
    assert ch03.check_recompile_fix(good)

    @functools.partial(jax.jit, static_argnames=("lr", "step"))
    def planted(w, g, lr, step):
        return w - lr * 0.5 ** (step // ch03.HALVING) * g
    r = ch03.check_recompile_fix(planted)
    assert not r and "compiled versions" in r.message and "static" in r.hint

    @jax.jit
    def no_decay(w, g, lr, step):
        return w - lr * g
    r = ch03.check_recompile_fix(no_decay)
    assert not r and "differs" in r.message

    def not_jitted(w, g, lr, step):
        return w - lr * 0.5 ** (step // ch03.HALVING) * g
    r = ch03.check_recompile_fix(not_jitted)
    assert not r and "not a jitted" in r.message

    def stub(w, g, lr, step):
        raise NotImplementedError("Exercise 3: write your code here")
    assert ch03.check_recompile_fix(stub).status == "not written"


# ------------------------------------------------------ Exercise 4: per-example norms


def norms_good(params, X, Y):
    import jax
    import jax.numpy as jnp

    grads = jax.vmap(jax.grad(ch03.mlp_loss), in_axes=(None, 0, 0))(params, X, Y)
    return jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1)
                        for g in jax.tree.leaves(grads)))


def test_per_example_norms_accepts_vmap_of_grad():
    assert ch03.check_per_example_norms(norms_good)


def test_per_example_norms_names_mistakes():
    import jax
    import jax.numpy as jnp

    def batch_norm(params, X, Y):
        g = jax.grad(lambda p: jax.vmap(ch03.mlp_loss, (None, 0, 0))(p, X, Y).mean())(params)
        return jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree.leaves(g)))
    r = ch03.check_per_example_norms(batch_norm)
    assert not r and "one number for the whole batch" in r.hint

    r = ch03.check_per_example_norms(lambda p, X, Y: norms_good(p, X, Y) ** 2)
    assert not r and "squared" in r.message

    def weights_only(params, X, Y):
        grads = jax.vmap(jax.grad(ch03.mlp_loss), in_axes=(None, 0, 0))(params, X, Y)
        return jnp.sqrt(sum(jnp.sum(grads[k].reshape(len(X), -1) ** 2, axis=1)
                            for k in ("w1", "w2")))
    r = ch03.check_per_example_norms(weights_only)
    assert not r and "missing" in r.message

    r = ch03.check_per_example_norms(
        lambda p, X, Y: jax.vmap(jax.grad(ch03.mlp_loss), in_axes=(None, 0, 0))(p, X, Y))
    assert not r and "dict" in r.message
    assert not ch03.check_per_example_norms(lambda p, X, Y: "1.0")


def test_scorecard_of_an_empty_namespace():
    assert ch03.LAB.scorecard({}).total() == "Lab 3: 0 of 5 passed"


def convert_good(sd):
    return {
        "conv": {"kernel": jnp.asarray(sd["conv.weight"].transpose(2, 3, 1, 0)),
                 "bias": jnp.asarray(sd["conv.bias"])},
        "fc1": {"kernel": jnp.asarray(sd["fc1.weight"].T), "bias": jnp.asarray(sd["fc1.bias"])},
        "fc2": {"kernel": jnp.asarray(sd["fc2.weight"].T), "bias": jnp.asarray(sd["fc2.bias"])},
    }


def make_forward(flatten_nchw=True, fc1_bias=True):
    def forward(params, x):
        c = lax.conv_general_dilated(x, params["conv"]["kernel"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        c = c + params["conv"]["bias"]
        h = jax.nn.relu(c)
        if flatten_nchw:
            h = h.transpose(0, 3, 1, 2)
        h = h.reshape(h.shape[0], -1)
        f1 = h @ params["fc1"]["kernel"] + (params["fc1"]["bias"] if fc1_bias else 0.0)
        f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
        return {"conv": c, "fc1": f1, "fc2": f2}
    return forward


def make_loss(forward, reduction="mean"):
    def loss_fn(params, x, y):
        losses = optax.softmax_cross_entropy_with_integer_labels(forward(params, x)["fc2"], y)
        return losses.mean() if reduction == "mean" else losses.sum()
    return loss_fn


def make_step(loss_fn, optimizer):
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return train_step


def port(convert=convert_good, forward=None, reduction="mean", optimizer=None):
    forward = forward or make_forward()
    optimizer = optimizer or optax.sgd(LR)
    loss = make_loss(forward, reduction)
    return ch03.check_port(convert, forward, loss, make_step(loss, optimizer), optimizer,
                           live=False)


def test_port_accepts_the_solution():
    r = port()
    assert r, r.message
    assert "22 arrays match PyTorch" in r.message


def test_port_names_a_transposed_weight():
    def convert(sd):
        p = convert_good(sd)
        p["fc2"]["kernel"] = jnp.asarray(sd["fc2.weight"])  # forgot .T
        return p
    r = port(convert)
    assert not r
    assert "layer 'fc2'" in r.message and "transposed" in r.message


def test_port_names_a_pytorch_layout_conv_kernel():
    def convert(sd):
        p = convert_good(sd)
        p["conv"]["kernel"] = jnp.asarray(sd["conv.weight"])
        return p
    r = port(convert)
    assert not r and "layer 'conv'" in r.message and "OIHW" in r.message


def test_port_names_a_missing_bias():
    r = port(forward=make_forward(fc1_bias=False))
    assert not r and "layer 'fc1'" in r.message and "missing or extra bias" in r.message


def test_port_names_nchw_vs_nhwc_flatten_order():
    r = port(forward=make_forward(flatten_nchw=False))
    assert not r and "layer 'fc1'" in r.message
    assert "flatten order" in r.message and "NCHW" in r.message


def test_port_names_sum_instead_of_mean():
    r = port(reduction="sum")
    assert not r and "(loss)" in r.message
    assert "sum where the reference takes a mean over 8" in r.message


def test_port_names_a_wrong_learning_rate():
    r = port(optimizer=optax.sgd(0.01))
    assert not r and "(step/" in r.message and "lr = 0.1" in r.message


def test_port_catches_adam_where_pytorch_used_sgd():
    r = port(optimizer=optax.adam(LR))
    assert not r and "(step/" in r.message


def test_port_reports_a_crash_as_a_failure():
    def convert(sd):
        p = convert_good(sd)
        p["fc1"]["kernel"] = jnp.asarray(sd["fc1.weight"])
        return p
    r = port(convert, forward=lambda p, x: {"fc2": x @ p["fc1"]["kernel"]})
    assert not r and "transposed" in r.message  # caught at the params, before the crash

    def boom(params, x):
        raise ValueError("dot_general requires contracting dimensions to have the same shape")
    r = port(forward=boom)
    assert not r and "raised ValueError" in r.message


def test_port_live_against_torch():
    pytest.importorskip("torch")
    forward = make_forward()
    optimizer = optax.sgd(LR)
    loss = make_loss(forward)
    r = ch03.check_port(convert_good, forward, loss, make_step(loss, optimizer), optimizer,
                        live=True)
    assert r, r.message
    assert ch03.reference().source.startswith("live: torch")


# ------------------------------------------------------------ the lab's reference


def test_live_torch_matches_stored_reference():
    pytest.importorskip("torch")
    live = ch03.reference(live=True)
    assert live.source.startswith("live: torch")
    report = parity.compare(parity.load_reference(ch03.LAB_CONFIG["name"]).expected, live.expected)
    assert report.passed, str(report)


def test_reference_without_torch_says_so(monkeypatch):
    monkeypatch.setattr(parity, "torch_available", lambda: False)
    r = ch03.reference()
    assert r.source.startswith("stored:")
    assert r.meta["lr"] == ch03.LAB_CONFIG["lr"] and r.meta["name"] == ch03.LAB_CONFIG["name"]

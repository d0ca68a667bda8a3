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
    assert not r and "exceeds max_norm" in r.message


# ---------------------------------------------------------- Exercise 2: recompilation

def bucketed_good(fn, x, buckets=ch03.BUCKETS):
    n = x.shape[0]
    size = next(b for b in buckets if b >= n)
    out = fn(jnp.pad(x, ((0, size - n), (0, 0))))
    return out[:n]


def bucketed_none(fn, x, buckets=ch03.BUCKETS):
    return fn(x)


def bucketed_no_slice(fn, x, buckets=ch03.BUCKETS):
    n = x.shape[0]
    size = next(b for b in buckets if b >= n)
    return fn(jnp.pad(x, ((0, size - n), (0, 0))))


def bucketed_pad_front(fn, x, buckets=ch03.BUCKETS):
    n = x.shape[0]
    size = next(b for b in buckets if b >= n)
    return fn(jnp.pad(x, ((size - n, 0), (0, 0))))[:n]


def test_bucketing_accepts_padding_and_counts_from_jax():
    r = ch03.check_bucketing(bucketed_good)
    assert r, r.message
    assert "3 compilations" in r.message


def test_bucketing_reports_the_real_compile_count():
    r = ch03.check_bucketing(bucketed_none)
    n_shapes = len(set(ch03.RAGGED_SIZES))
    assert not r and f"compiled {n_shapes} times" in r.message


def test_bucketing_rejects_unsliced_and_misplaced_padding():
    assert "slice" in ch03.check_bucketing(bucketed_no_slice).message
    r = ch03.check_bucketing(bucketed_pad_front)
    assert not r and "wrong values" in r.message


# ------------------------------------------------------ Exercise 3: per-example grads

def example_loss(w, x, y):
    return 0.5 * (x @ w - y) ** 2


def peg_good(w, X, Y):
    return jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(w, X, Y)


def peg_batch(w, X, Y):
    return jax.grad(lambda w: jnp.sum(jax.vmap(example_loss, (None, 0, 0))(w, X, Y)))(w)


def test_per_example_grads():
    assert ch03.check_per_example_grads(peg_good)
    r = ch03.check_per_example_grads(peg_batch)
    assert not r and "in_axes=(None, 0, 0)" in r.message
    r = ch03.check_per_example_grads(lambda w, X, Y: 2 * peg_good(w, X, Y))
    assert not r and "wrong values" in r.message


# --------------------------------------------------------------- Exercise 4: the port

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
    assert parity.reference().source.startswith("live: torch")

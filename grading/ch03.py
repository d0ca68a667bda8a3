"""Lab 3's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grading import Key
from tpu_course.checks import ch03
from tpu_course.checks.engine import Case, Mistake
from tpu_course.checks.ch03 import HALVING, LR


def _odd(rng, lo=2, hi=8):
    """Two different sizes: a non-square shape."""
    a, b = rng.choice(np.arange(lo, hi), 2, replace=False)
    return int(a), int(b)


# -- Exercise 1 ----------------------------------------------------------------------------


def make_clip(norm=lambda g: jnp.sqrt(jnp.sum(g * g)), scale=None, lr=LR):
    def clipped_update(w, g, max_norm):
        n = norm(g)
        s = jnp.where(n > max_norm, max_norm / jnp.where(n > 0, n, 1.0), 1.0) if scale is None \
            else scale(n, max_norm)
        return w - lr * g * s

    return clipped_update


def _python_if(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    if norm > max_norm:
        g = g * (max_norm / norm)
    return w - LR * g


def _ex1_hidden(rng):
    seeds = rng.integers(1 << 20, size=2)
    return [ch03.clip_case(_odd(rng), float(rng.choice([0.5, 3.0, 5.0])), int(seeds[0])),
            ch03.clip_case((1,), float(rng.choice([0.25, 10.0])), int(seeds[1]))]


EX1 = Key(
    reference=make_clip(),
    hidden=_ex1_hidden,
    mistakes=[
        Mistake(ch03.TRACED_HINT, _python_if),
        Mistake("you clipped each element to [-max_norm, max_norm] (clipping by value); clip "
                "the gradient's global norm: scale = min(1, max_norm / ||g||)",
                lambda w, g, m: w - LR * jnp.clip(g, -m, m)),
        Mistake("you rescale the gradient even when its norm is below max_norm: clip only "
                "when the norm exceeds it, scale = min(1, max_norm / norm)",
                make_clip(scale=lambda n, m: m / jnp.where(n > 0, n, 1.0))),
        Mistake(f"the clipped gradient is right, but the step is not multiplied by LR ({LR})",
                make_clip(lr=1.0)),
        Mistake("||g|| is the norm over EVERY element of g (the global norm), not one norm "
                "per row or column",
                make_clip(norm=lambda g: jnp.sqrt(jnp.sum(g * g, axis=-1, keepdims=True)))),
        Mistake(ch03.check_jit_fix.exercise.rules[0].hint,
                lambda w, g, m: w - LR * g / jnp.linalg.norm(g) * jnp.minimum(jnp.linalg.norm(g), m)),
    ])


# -- Exercise 2 ----------------------------------------------------------------------------

EX2 = Key(mistakes=[
    Mistake("a traced argument's VALUE is not part of the cache key: 2.0 and 3.0 share one "
            "version", len(ch03.COMPILE_QUIZ)),
    Mistake("the cache key is every argument's shape AND dtype: a new shape or dtype "
            "compiles again", 1),
    Mistake("a Python int where a float was is another weak type (a weakly typed int32, "
            "not float32): f(x, 2) compiles again", 4),
    Mistake("a new dtype compiles again, like a new shape: int32 ones are not float32 ones, "
            "and a Python int is not a Python float", 3),
])


# -- Exercise 3 ----------------------------------------------------------------------------


def _decay(w, g, lr, step):
    return w - lr * 0.5 ** (step // HALVING) * g


def _ex3_hidden(rng):
    n, size = int(rng.integers(5, 9)), int(rng.integers(1, 12))
    steps = sorted(int(s) for s in rng.choice(5000, n, replace=False))
    lrs = [float(v) for v in rng.choice([0.5, 0.2, 0.1, 0.03, 0.01, 0.004], n)]
    lrs[0] = lrs[1]  # the first change is the step's, a later one the rate's
    lrs[2] = 0.7
    return [ch03.decay_case(f"{n} other steps up to {steps[-1]}, {len(set(lrs))} other "
                            f"learning rates, w of {size} element(s)", lrs, steps, size,
                            int(rng.integers(1 << 16)))]


EX3 = Key(
    reference=jax.jit(lambda w, g, lr, step: w - g * (lr / 2.0 ** jnp.floor_divide(step, HALVING))),
    hidden=_ex3_hidden,
    mistakes=[
        Mistake("lr is still static: every new learning rate compiles again; pass it as an "
                "ordinary (traced) argument, like step", jax.jit(_decay, static_argnames="lr")),
        Mistake("step is still static: every new step compiles again; pass it as an ordinary "
                "(traced) argument, like lr", jax.jit(_decay, static_argnums=3)),
        Mistake("lr and step are both in static_argnames, part of the cache key: every new "
                "value compiles again; pass them as ordinary (traced) arguments",
                jax.jit(_decay, static_argnames=("lr", "step"))),
        Mistake(f"the rate does not decay: multiply lr by 0.5 ** (step // {HALVING})",
                jax.jit(lambda w, g, lr, step: w - lr * g)),
        Mistake(f"your rate decays smoothly (step / {HALVING}); it halves every {HALVING} "
                f"steps: integer division, step // {HALVING}, works on a traced step too",
                jax.jit(lambda w, g, lr, step: w - lr * 0.5 ** (step / HALVING) * g)),
        Mistake(ch03.NOT_JITTED_HINT, _decay),
    ])


# -- Exercise 4 ----------------------------------------------------------------------------


def per_example_grads(params, X, Y):
    """Each example's gradient of ``ch03.mlp_loss``, by hand in float64 (leading axis n)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
    h = np.tanh(X @ p["w1"] + p["b1"])
    e = h @ p["w2"] + p["b2"] - Y                   # d loss / d output
    dz = (e @ p["w2"].T) * (1.0 - h ** 2)           # d loss / d pre-activation
    return {"w1": X[:, :, None] * dz[:, None, :], "b1": dz,
            "w2": h[:, :, None] * e[:, None, :], "b2": e}


def make_norms(leaves=("w1", "b1", "w2", "b2"), batch=None, per_leaf=False, power=0.5,
               divide=False):
    def per_example_grad_norms(params, X, Y):
        grads = per_example_grads(params, X, Y)
        if batch:  # one gradient for the whole batch, repeated
            grads = {k: np.repeat(getattr(v, batch)(axis=0, keepdims=True), len(X), 0)
                     for k, v in grads.items()}
        sq = {k: np.sum(v.reshape(len(X), -1) ** 2, axis=1) for k, v in grads.items()}
        if per_leaf:
            return sum(np.sqrt(sq[k]) for k in leaves)
        return sum(sq[k] for k in leaves) ** power / (len(X) if divide else 1)

    return per_example_grad_norms


def _ex4_hidden(rng):
    d_in, d_hidden, d_out = (int(v) for v in rng.choice(np.arange(2, 10), 3, replace=False))
    n = int(rng.integers(7, 13))
    return [Case("a batch of one example", {"n": 1, "seed": int(rng.integers(1 << 16))}),
            Case(f"a batch of {n} examples with {d_in} inputs, {d_hidden} hidden units and "
                 f"{d_out} outputs", {"n": n, "d_in": d_in, "d_hidden": d_hidden,
                                      "d_out": d_out, "seed": int(rng.integers(1 << 16))})]


_PER_EXAMPLE = ("take the gradient of ONE example's loss and vmap it over the examples: "
                "jax.vmap(jax.grad(mlp_loss), in_axes=(None, 0, 0)), then reduce each "
                "example's gradient to its own norm")
EX4 = Key(
    reference=make_norms(),
    hidden=_ex4_hidden,
    mistakes=[
        Mistake("all the norms are the norm of the batch's mean gradient: one norm for the "
                "whole batch, repeated; " + _PER_EXAMPLE, make_norms(batch="mean")),
        Mistake("all the norms are the norm of the batch's summed gradient: one norm for the "
                "whole batch, repeated; " + _PER_EXAMPLE, make_norms(batch="sum")),
        Mistake("your norms are n times too small: take the gradient of one example's loss, "
                "not of the batch mean", make_norms(divide=True)),
        Mistake("those are squared norms: take the square root of the sum of squares",
                make_norms(power=1)),
        Mistake("you added the norms of the four parameter arrays: the global norm is the "
                "square root of the sum of ALL squares", make_norms(per_leaf=True)),
        Mistake("your norms leave out the biases: sum the squares over EVERY leaf (w1, b1, "
                "w2, b2), e.g. with jax.tree.leaves", make_norms(leaves=("w1", "w2"))),
        Mistake("your norms leave out the first layer: sum the squares over EVERY leaf (w1, "
                "b1, w2, b2), e.g. with jax.tree.leaves", make_norms(leaves=("w2", "b2"))),
        Mistake(ch03.NORMS_HINTS["one"], lambda p, X, Y: make_norms(batch="mean")(p, X, Y)[0]),
        Mistake(ch03.NORMS_HINTS["leaves"], lambda p, X, Y: np.stack(
            [np.sqrt(np.sum(v.reshape(len(X), -1) ** 2, 1))
             for v in per_example_grads(p, X, Y).values()], 1)),
        Mistake(ch03.NORMS_HINTS["flat"], lambda p, X, Y: make_norms()(p, X, Y)[:, None]),
        Mistake(ch03.NORMS_HINTS["dict"], per_example_grads),
    ])


# -- Exercise 5 ----------------------------------------------------------------------------


def convert_params(sd):
    """PyTorch layout -> JAX layout: Linear (out, in) -> (in, out); Conv OIHW -> HWIO."""
    return {"conv": {"kernel": jnp.asarray(sd["conv.weight"].transpose(2, 3, 1, 0)),
                     "bias": jnp.asarray(sd["conv.bias"])},
            **{f: {"kernel": jnp.asarray(sd[f"{f}.weight"].T), "bias": jnp.asarray(sd[f"{f}.bias"])}
               for f in ("fc1", "fc2")}}


@jax.jit
def forward(params, x):
    c = jax.lax.conv_general_dilated(x, params["conv"]["kernel"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    c = c + params["conv"]["bias"]
    h = jax.nn.relu(c).transpose(0, 3, 1, 2)
    f1 = h.reshape(h.shape[0], -1) @ params["fc1"]["kernel"] + params["fc1"]["bias"]
    return {"conv": c, "fc1": f1,
            "fc2": jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]}


@jax.jit
def loss_fn(params, x, y):
    logp = jax.nn.log_softmax(forward(params, x)["fc2"])
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


SGD = optax.sgd(ch03.LAB_CONFIG["lr"])


def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = SGD.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def _ex5_hidden(rng):
    batch = int(rng.choice([1, 3, 5, 6, 7, 9, 11, 12]))
    return [ch03.port_case(int(rng.integers(1, 1 << 16)), batch,
                           f"other weights and images, a batch of {batch}")]


EX5 = Key(reference={"convert_params": convert_params, "forward": forward, "loss_fn": loss_fn,
                     "train_step": train_step, "optimizer": SGD},
          hidden=_ex5_hidden)

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 4": EX4,
        "Exercise 5": EX5}

"""Lab 3's keys (see :mod:`grading`). Mistakes that a probe or a rule names already (a Python
`if` under jit, an unjitted update, norms of the wrong shape, NaN) are tested in tests/."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grading import Key
from tpu_course import parity
from tpu_course.checks import ch03
from tpu_course.checks.ch03 import HALVING, LR
from tpu_course.checks.engine import Case, Mistake

def make_clip(norm=lambda g: jnp.sqrt(jnp.sum(g * g)), scale=None, lr=LR):
    def clipped_update(w, g, m):
        n = norm(g)
        return w - lr * g * (scale(n, m) if scale else jnp.where(n > m, m / jnp.where(n > 0, n, 1), 1))
    return clipped_update

def _ex1_hidden(rng):  # a non-square matrix and a one-element vector
    seeds, shape = rng.integers(1 << 20, size=2), rng.choice(np.arange(2, 8), 2, replace=False)
    return [ch03.clip_case(tuple(map(int, shape)), float(rng.choice([0.5, 3.0, 5.0])), int(seeds[0])),
            ch03.clip_case((1,), float(rng.choice([0.25, 10.0])), int(seeds[1]))]

EX1 = Key(reference=make_clip(), hidden=_ex1_hidden, mistakes=[
    Mistake("you clipped each element to [-max_norm, max_norm] (clipping by value); clip the "
            "gradient's global norm", lambda w, g, m: w - LR * jnp.clip(g, -m, m)),
    Mistake("you rescale the gradient even when its norm is below max_norm: clip only when "
            "the norm exceeds it", make_clip(scale=lambda n, m: m / jnp.where(n > 0, n, 1))),
    Mistake(f"the clipped gradient is right, but the step is not multiplied by LR ({LR})",
            make_clip(lr=1.0)),
    Mistake("||g|| is the norm over EVERY element of g (the global norm), not one norm per "
            "row or column", make_clip(norm=lambda g: jnp.sqrt(jnp.sum(g * g, -1, keepdims=True))))])

EX2 = Key(mistakes=[Mistake(hint, count) for hint, count in (
    ("a traced argument's VALUE is not part of the cache key: 2.0 and 3.0 share one version",
     len(ch03.COMPILE_QUIZ)),
    ("the cache key is every argument's shape AND dtype: a new shape or dtype compiles again", 1),
    ("a Python int where a float was is another weak type (a weakly typed int32, not "
     "float32): f(x, 2) compiles again", 4),
    ("a new dtype compiles again, like a new shape: int32 ones are not float32 ones, and a "
     "Python int is not a Python float", 3))])

def _decay(w, g, lr, step):
    return w - lr * 0.5 ** (step // HALVING) * g

def _ex3_hidden(rng):  # the first change is the step's, a later one the rate's
    n, size = int(rng.integers(5, 9)), int(rng.integers(1, 12))
    steps = sorted(int(s) for s in rng.choice(5000, n, replace=False))
    lrs = [float(v) for v in rng.choice([0.5, 0.2, 0.1, 0.03, 0.01, 0.004], n)]
    lrs[0], lrs[2] = lrs[1], 0.7
    return [Case(f"{n} other steps up to {steps[-1]}, {len(set(lrs))} other learning rates, w "
                 f"of {size} element(s)", {"lrs": tuple(lrs), "steps": tuple(steps),
                                           "size": size, "seed": int(rng.integers(1 << 16))})]

EX3 = Key(
    reference=jax.jit(lambda w, g, lr, step: w - g * (lr / 2.0 ** jnp.floor_divide(step, HALVING))),
    hidden=_ex3_hidden,
    mistakes=[*(Mistake(f"{s} {'are' if 'and' in s else 'is'} still static, part of the cache "
                        f"key: every new value compiles again; leave {s} out of static_argnames",
                        jax.jit(_decay, static_argnames=s.split(" and ")))
                for s in ("lr", "step", "lr and step")),
              Mistake(f"the rate does not decay: multiply lr by 0.5 ** (step // {HALVING})",
                      jax.jit(lambda w, g, lr, step: w - lr * g)),
              Mistake(f"your rate decays smoothly (step / {HALVING}); it halves every {HALVING} "
                      f"steps: integer division, step // {HALVING}, works on a traced step too",
                      jax.jit(lambda w, g, lr, step: w - lr * 0.5 ** (step / HALVING) * g))])

def norms(reduce, batch=None):
    """Norms from the (n, 4) table of each example's squared gradient per leaf (by hand, in
    float64); ``batch``: the batch's mean or sum gradient for every example."""
    def per_example_grad_norms(params, X, Y):
        p = {k: np.asarray(v, np.float64) for k, v in params.items()}
        X, Y = np.asarray(X, np.float64), np.asarray(Y, np.float64)
        h = np.tanh(X @ p["w1"] + p["b1"])
        e = h @ p["w2"] + p["b2"] - Y  # d loss / d output
        dz = (e @ p["w2"].T) * (1.0 - h ** 2)  # d loss / d pre-activation
        grads = [X[:, :, None] * dz[:, None, :], dz, h[:, :, None] * e[:, None, :], e]
        if batch:
            grads = [np.repeat(getattr(v, batch)(0, keepdims=True), len(X), 0) for v in grads]
        return reduce(np.stack([np.sum(v.reshape(len(X), -1) ** 2, 1) for v in grads], 1))
    return per_example_grad_norms

def _ex4_hidden(rng):
    d_in, d_hidden, d_out = (int(v) for v in rng.choice(np.arange(2, 10), 3, replace=False))
    n, seeds = int(rng.integers(7, 13)), [int(s) for s in rng.integers(1 << 16, size=2)]
    return [Case("a batch of one example", {"n": 1, "seed": seeds[0]}),
            Case(f"a batch of {n} examples with {d_in} inputs, {d_hidden} hidden units and "
                 f"{d_out} outputs", {"n": n, "d_in": d_in, "d_hidden": d_hidden,
                                      "d_out": d_out, "seed": seeds[1]})]

_GLOBAL = lambda sq: np.sqrt(sq.sum(1))
EX4 = Key(reference=norms(_GLOBAL), hidden=_ex4_hidden, mistakes=[
    *(Mistake(f"all the norms are the norm of the batch's {b} gradient, repeated: vmap the "
              "gradient of ONE example's loss over the examples (in_axes=(None, 0, 0)) and "
              "reduce each example's gradient to its own norm", norms(_GLOBAL, b))
      for b in ("mean", "sum")),
    Mistake("your norms are n times too small: take the gradient of one example's loss, not "
            "of the batch mean", norms(lambda sq: _GLOBAL(sq) / len(sq))),
    Mistake("those are squared norms: take the square root of the sum of squares",
            norms(lambda sq: sq.sum(1))),
    Mistake("you added the norms of the four parameter arrays: the global norm is the square "
            "root of the sum of ALL squares", norms(lambda sq: np.sqrt(sq).sum(1))),
    *(Mistake(f"your norms leave out {what}: sum the squares over EVERY leaf (w1, b1, w2, b2), "
              "e.g. with jax.tree.leaves", norms(lambda sq, i=i: _GLOBAL(sq[:, i])))
      for what, i in (("the biases", [0, 2]), ("the first layer", [2, 3])))])

@jax.jit
def forward(p, x):
    c = jax.lax.conv_general_dilated(x, p["conv"]["kernel"], (1, 1), "SAME", dimension_numbers=(
        "NHWC", "HWIO", "NHWC")) + p["conv"]["bias"]
    f1 = jax.nn.relu(c).transpose(0, 3, 1, 2).reshape(len(x), -1) @ p["fc1"]["kernel"]
    f1 = f1 + p["fc1"]["bias"]
    return {"conv": c, "fc1": f1, "fc2": jax.nn.relu(f1) @ p["fc2"]["kernel"] + p["fc2"]["bias"]}

@jax.jit
def loss_fn(params, x, y):
    logp = jax.nn.log_softmax(forward(params, x)["fc2"])
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = SGD.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

def _ex5_hidden(rng):
    batch = int(rng.choice([1, 3, 5, 6, 7, 9, 11, 12]))
    return [Case(f"other weights and images, a batch of {batch}",
                 {"seed": int(rng.integers(1, 1 << 16)), "batch": batch})]

SGD = optax.sgd(LR)
EX5 = Key(reference={"convert_params": lambda sd: {
    "conv": parity.conv2d_to_jax(sd["conv.weight"], sd["conv.bias"]),
    **{f: parity.linear_to_jax(sd[f"{f}.weight"], sd[f"{f}.bias"]) for f in ("fc1", "fc2")}},
    "forward": forward, "loss_fn": loss_fn, "train_step": train_step, "optimizer": SGD},
    hidden=_ex5_hidden)
KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 4": EX4,
        "Exercise 5": EX5}

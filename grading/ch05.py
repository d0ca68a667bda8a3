"""Lab 5's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from grading import Key
from tpu_course import models
from tpu_course.checks.ch05 import _step_case
from tpu_course.checks.engine import Case, Mistake
from tpu_course.train import Batch

# -- Exercise 1: wrong models, two dense layers with zero kernels (no random op to compile) --

class WrongModel(nnx.Module):
    def __init__(self, kind, *, rngs):
        hidden, self.kind = 128 if kind == "over budget" else 16, kind  # 128: 100,480 weights
        self.hidden = nnx.Linear(784, hidden, kernel_init=nnx.initializers.zeros, rngs=rngs)
        self.out = nnx.Linear(hidden, 8 if kind == "8 classes" else 10,
                              kernel_init=nnx.initializers.zeros, rngs=rngs)
        if kind == "batch norm":
            self.bn = nnx.BatchNorm(16, rngs=rngs)

    def __call__(self, x):
        y = self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))
        return nnx.softmax(y) if self.kind == "softmax" else y / 0.0 if self.kind == "NaN" else y

EX1 = Key(
    hidden=lambda rng: [Case(f"a batch of {n} images", {"sizes": (n,)})
                        for n in [int(rng.choice([2, 3, 5, 7, 13, 32, 100]))]],
    mistakes=[Mistake(hint, functools.partial(WrongModel, kind)) for kind, hint in {
        "over budget": "shrink where the parameters are: a Linear after flattening has (height "
                       "x width x channels) x width weights; pool once more before it, use "
                       "fewer channels in the last convolution, or make it narrower",
        "batch norm": "leave out BatchNorm and Dropout here (their state is not nnx.Param); a "
                      "plain CNN reaches the target",
        "softmax": "end with the 10-wide nnx.Linear and return its raw logits: optax's "
                   "cross-entropy takes logits and does the softmax itself",
        "NaN": "look for a division or a log in __call__",
        "8 classes": "Fashion-MNIST has 10 classes: the last layer is 10 wide"}.items()])

# -- Exercise 3: the reference step and each mistake, one compiled function (a code each) ----

EX3_MISTAKES = {
    "unweighted": "the loss counts the padding examples (weight 0) too: multiply each "
                  "cross-entropy by batch.weights, divide by their sum",
    "sum": "the loss is a sum over the batch: divide by the sum of the weights",
    "batch mean": "the loss divides by the batch size, padding included: divide by "
                  "jnp.sum(batch.weights)",
    "raw pixels": "the images went in as 0..255 pixels: feed models.prepare_images(...) as it "
                  "is (floats in [0, 1])",
    "loss after update": "the returned loss is the updated model's: return the loss of the "
                         "forward pass the gradient came from",
    "no update": "the parameters did not change: call optimizer.update(model, grads) in the step",
    "twice": "the step updates twice: call optimizer.update exactly once",
    "unweighted accuracy": "the accuracy counts the padding: sum(w * hits) / sum(w)",
    "no clip": "nothing was clipped: multiply every gradient by min(1, max_norm / norm) before "
               "optimizer.update",
    "per array": "each array was clipped on its own norm: the norm is global, over every "
                 "parameter array together (optax.tree.norm)",
    "by value": "that clips each element to [-max_norm, max_norm] (by value): scale the whole "
                "gradient by min(1, max_norm / norm)",
    "always rescale": "the gradient was scaled up to max_norm although its norm was below it: "
                      "the factor is min(1, max_norm / norm)",
    "squared norm": "the scale divides by the squared norm: norm = sqrt(sum of squares)",
    "norm after clip": "grad_norm is the norm after clipping: return the norm measured before"}
KINDS = ("", *EX3_MISTAKES)

@nnx.jit
def _step(model, optimizer, batch, max_norm, code):  # SGD: a zero gradient updates nothing
    k = {kind: code == i for i, kind in enumerate(KINDS)}
    w = jnp.where(k["unweighted"], 1.0, batch.weights)

    def loss_fn(m):
        logits = m(models.prepare_images(batch.images) * jnp.where(k["raw pixels"], 255.0, 1.0))
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        return jnp.sum(w * ce) / jnp.select([k["sum"], k["batch mean"]], [1.0, len(ce)],
                                            jnp.sum(w)), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    factor = jnp.select([k["no clip"], k["always rescale"], k["squared norm"]],
                        [1.0, max_norm / norm, jnp.minimum(1.0, max_norm / norm ** 2)],
                        jnp.minimum(1.0, max_norm / norm))
    clipped = jax.tree.map(lambda g: jnp.select(
        [k["per array"], k["by value"]],
        [g * jnp.minimum(1.0, max_norm / jnp.linalg.norm(g)), jnp.clip(g, -max_norm, max_norm)],
        g * factor), grads)
    optimizer.update(model, jax.tree.map(lambda g: jnp.where(k["no update"], 0.0, g), clipped))
    optimizer.update(model, jax.tree.map(lambda g: jnp.where(k["twice"], g, 0.0), clipped))
    aw = jnp.where(k["unweighted accuracy"], 1.0, batch.weights)
    return {"loss": jnp.where(k["loss after update"], loss_fn(model)[0], loss),
            "accuracy": jnp.sum(aw * (jnp.argmax(logits, -1) == batch.labels)) / jnp.sum(aw),
            "grad_norm": jnp.where(k["norm after clip"], jnp.minimum(norm, max_norm), norm)}

def make_step(kind=""):
    """``train_step`` as a learner writes it: the reference, or with the mistake ``kind``."""
    def train_step(model, optimizer, batch, max_norm):
        return _step(model, optimizer, batch, max_norm, jnp.int32(KINDS.index(kind)))
    train_step.lower = _step.lower  # compiled, as the exercise asks
    return train_step

def _ex3_hidden(rng):
    lr = float(rng.choice([0.03, 0.05, 0.2, 0.3]))
    norms = ((rng.uniform(0.01, 0.2), "the clip active"), (rng.uniform(20, 100), "no clip needed"))
    return [_step_case(int(rng.integers(1, 40)), int(rng.integers(10, 10_000)), lr, float(m),
                       what) for m, what in norms]

EX3 = Key(
    reference=make_step(),
    hidden=_ex3_hidden,
    mistakes=[Mistake(hint, make_step(kind)) for kind, hint in EX3_MISTAKES.items()])

# -- Exercise 4: slow_batches a whole batch at a time, or with one mistake ------------------

def make_pipeline(kind=""):
    def fast_batches(images, labels, batch_size, seed=0, epoch=0):
        rng = np.random.default_rng([seed + (kind == "other shuffle"), epoch])
        order = rng.permutation(len(images))
        for s in range(len(images) // batch_size + (kind == "partial batch")):
            idx = order[s * batch_size:(s + 1) * batch_size]
            x = images[idx]
            flip = (rng.random(64 if kind == "draws 64" else len(idx))[:len(idx)] < 0.5)
            mirrored = x[:, ::-1, :] if kind == "upside down" else x[:, :, ::-1]
            x = {"no flips": x, "all flipped": mirrored, "opposite": np.where(
                flip[:, None, None], x, mirrored)}.get(kind, np.where(flip[:, None, None],
                                                                      mirrored, x))
            yield Batch(x.astype(np.float32) / 255 if kind == "floats" else x,
                        labels[idx].astype(np.int32), np.ones(len(idx), np.float32))
    return fast_batches

def _ex4_hidden(rng):
    n, bs = int(rng.integers(200, 500)), int(rng.choice([16, 32, 50, 100]))
    runs = tuple((int(rng.integers(1, 1000)), int(rng.integers(0, 10))) for _ in range(2))
    return [Case(f"{n} images in batches of {bs}, (seed, epoch) runs {runs}",
                 {"n": n, "data_seed": int(rng.integers(1 << 20)), "batch_size": bs, "runs": runs})]

EX4 = Key(hidden=_ex4_hidden, mistakes=[Mistake(hint, make_pipeline(kind)) for kind, hint in {
    "other shuffle": "shuffle with the same generator: rng = np.random.default_rng([seed, "
                     "epoch]); order = rng.permutation(len(images)), before any flip is drawn",
    "no flips": "no image is mirrored: the random flips are missing",
    "all flipped": "every image is mirrored, not a random half",
    "opposite": "the flips are the opposite ones: mirror the images whose draw is below 0.5",
    "upside down": "the flipped images are upside down: mirror left-right (the last axis, "
                   "[:, :, ::-1])",
    "floats": "images stay uint8 (the chip converts them), labels int32, weights float32",
    "partial batch": "stop at the last full batch, as slow_batches does"}.items()])

KEYS = {"Exercise 1": EX1, "Exercise 3": EX3, "Exercise 4": EX4}

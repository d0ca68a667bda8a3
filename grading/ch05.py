"""Lab 5's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

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

# -- Exercise 1 ------------------------------------------------------------------------------


class Small(nnx.Module):
    """Two dense layers: the base of exercise 1's wrong models (zeros: a random layer of
    each new shape costs the tests a compile, and the mistakes show without it)."""

    def __init__(self, *, rngs, hidden=16, classes=10):
        zeros = nnx.initializers.zeros
        self.hidden = nnx.Linear(784, hidden, kernel_init=zeros, rngs=rngs)
        self.out = nnx.Linear(hidden, classes, kernel_init=zeros, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))


class OverBudget(Small):
    def __init__(self, *, rngs):
        super().__init__(rngs=rngs, hidden=128)  # 100,480 in the first layer


class Probabilities(Small):
    def __call__(self, x):
        return nnx.softmax(super().__call__(x))


class WithBatchNorm(Small):
    def __init__(self, *, rngs):
        super().__init__(rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)


class NaNs(Small):
    def __call__(self, x):
        return super().__call__(x) / 0.0


class EightClasses(Small):
    def __init__(self, *, rngs):
        super().__init__(rngs=rngs, classes=8)


EX1 = Key(
    hidden=lambda rng: [Case(f"a batch of {n} images", {"sizes": (n,)})
                        for n in [int(rng.choice([2, 3, 5, 7, 13, 32, 100]))]],
    mistakes=[
        Mistake("shrink where the parameters are: a Linear after flattening has (height x "
                "width x channels) x width weights; pool once more before it, use fewer "
                "channels in the last convolution, or make it narrower", OverBudget),
        Mistake("leave out BatchNorm and Dropout here (their state is not nnx.Param); a plain "
                "CNN reaches the target", WithBatchNorm),
        Mistake("end with the 10-wide nnx.Linear and return its raw logits: optax's "
                "cross-entropy takes logits and does the softmax itself", Probabilities),
        Mistake("look for a division or a log in __call__", NaNs),
        Mistake("Fashion-MNIST has 10 classes: the last layer is 10 wide", EightClasses),
    ])


# -- Exercise 3 ------------------------------------------------------------------------------


#: Each mistake of exercise 3 as a code: one compiled function computes them all (a
#: compile per mistake would cost the tests a second each).
KINDS = ("", "unweighted", "sum", "batch mean", "raw pixels", "loss after update", "no update",
         "twice", "unweighted accuracy", "no clip", "per array", "by value", "always rescale",
         "squared norm", "norm after clip")


@nnx.jit
def _step(model, optimizer, batch, max_norm, code):
    """The reference step (code 0), or the one with the mistake ``KINDS[code]`` (SGD only:
    a zero gradient leaves the parameters where they are)."""
    k = {kind: code == i for i, kind in enumerate(KINDS)}
    w = jnp.where(k["unweighted"], 1.0, batch.weights)

    def loss_fn(m):
        logits = m(models.prepare_images(batch.images) * jnp.where(k["raw pixels"], 255.0, 1.0))
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        total = jnp.select([k["sum"], k["batch mean"]], [1.0, len(ce)], jnp.sum(w))
        return jnp.sum(w * ce) / total, logits

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
    loss = jnp.where(k["loss after update"], loss_fn(model)[0], loss)
    aw = jnp.where(k["unweighted accuracy"], 1.0, batch.weights)
    hits = jnp.argmax(logits, -1) == batch.labels
    return {"loss": loss, "accuracy": jnp.sum(aw * hits) / jnp.sum(aw),
            "grad_norm": jnp.where(k["norm after clip"], jnp.minimum(norm, max_norm), norm)}


def make_step(kind: str = ""):
    """``train_step`` as a learner writes it: the reference, or with the mistake ``kind``."""

    def train_step(model, optimizer, batch, max_norm):
        return _step(model, optimizer, batch, max_norm, jnp.int32(KINDS.index(kind)))

    train_step.lower = _step.lower  # compiled, as the exercise asks
    return train_step


def _ex3_hidden(rng):
    lr = float(rng.choice([0.03, 0.05, 0.2, 0.3]))
    return [_step_case(int(rng.integers(1, 40)), int(rng.integers(10, 10_000)), lr,
                       float(max_norm), what) for max_norm, what in (
        (rng.uniform(0.01, 0.2), "the clip active"), (rng.uniform(20, 100), "no clip needed"))]


EX3 = Key(
    reference=make_step(),
    hidden=_ex3_hidden,
    mistakes=[
        Mistake("the loss counts the padding examples (weight 0) too: multiply each "
                "cross-entropy by batch.weights, divide by their sum", make_step("unweighted")),
        Mistake("the loss is a sum over the batch: divide by the sum of the weights",
                make_step("sum")),
        Mistake("the loss divides by the batch size, padding included: divide by "
                "jnp.sum(batch.weights)", make_step("batch mean")),
        Mistake("the images went in as 0..255 pixels: feed models.prepare_images(...) as it "
                "is (floats in [0, 1])", make_step("raw pixels")),
        Mistake("the returned loss is the updated model's: return the loss of the forward "
                "pass the gradient came from", make_step("loss after update")),
        Mistake("the parameters did not change: call optimizer.update(model, grads) in the "
                "step", make_step("no update")),
        Mistake("the step updates twice: call optimizer.update exactly once",
                make_step("twice")),
        Mistake("the accuracy counts the padding: sum(w * hits) / sum(w)",
                make_step("unweighted accuracy")),
        Mistake("nothing was clipped: multiply every gradient by min(1, max_norm / norm) "
                "before optimizer.update", make_step("no clip")),
        Mistake("each array was clipped on its own norm: the norm is global, over every "
                "parameter array together (optax.tree.norm)", make_step("per array")),
        Mistake("that clips each element to [-max_norm, max_norm] (by value): scale the "
                "whole gradient by min(1, max_norm / norm)", make_step("by value")),
        Mistake("the gradient was scaled up to max_norm although its norm was below it: the "
                "factor is min(1, max_norm / norm)", make_step("always rescale")),
        Mistake("the scale divides by the squared norm: norm = sqrt(sum of squares)",
                make_step("squared norm")),
        Mistake("grad_norm is the norm after clipping: return the norm measured before",
                make_step("norm after clip")),
    ])


# -- Exercise 4 ------------------------------------------------------------------------------


def make_pipeline(kind: str = ""):
    """The batches of slow_batches a whole batch at a time, or with the mistake ``kind``."""

    def fast_batches(images, labels, batch_size, seed=0, epoch=0):
        rng = np.random.default_rng([seed + (kind == "other shuffle"), epoch])
        order = rng.permutation(len(images))
        for s in range(len(images) // batch_size + (kind == "partial batch")):
            idx = order[s * batch_size:(s + 1) * batch_size]
            x = images[idx]
            u = rng.random(64 if kind == "draws 64" else len(idx))[:len(idx)]
            flip = (u < 0.5)[:, None, None]
            mirrored = x[:, ::-1, :] if kind == "upside down" else x[:, :, ::-1]
            x = {"no flips": x, "all flipped": mirrored,
                 "opposite": np.where(flip, x, mirrored)}.get(kind, np.where(flip, mirrored, x))
            if kind == "floats":
                x = x.astype(np.float32) / 255
            yield Batch(x, labels[idx].astype(np.int32), np.ones(len(idx), np.float32))

    return fast_batches


def _ex4_hidden(rng):
    n, bs = int(rng.integers(200, 500)), int(rng.choice([16, 32, 50, 100]))
    runs = tuple((int(rng.integers(1, 1000)), int(rng.integers(0, 10))) for _ in range(2))
    return [Case(f"{n} images in batches of {bs}, (seed, epoch) runs {runs}",
                 {"n": n, "data_seed": int(rng.integers(1 << 20)), "batch_size": bs,
                  "runs": runs})]


EX4 = Key(
    hidden=_ex4_hidden,
    mistakes=[
        Mistake("shuffle with the same generator: rng = np.random.default_rng([seed, "
                "epoch]); order = rng.permutation(len(images)), before any flip is drawn",
                make_pipeline("other shuffle")),
        Mistake("no image is mirrored: the random flips are missing", make_pipeline("no flips")),
        Mistake("every image is mirrored, not a random half", make_pipeline("all flipped")),
        Mistake("the flips are the opposite ones: mirror the images whose draw is below 0.5",
                make_pipeline("opposite")),
        Mistake("the flipped images are upside down: mirror left-right (the last axis, "
                "[:, :, ::-1])", make_pipeline("upside down")),
        Mistake("images stay uint8 (the chip converts them), labels int32, weights float32",
                make_pipeline("floats")),
        Mistake("stop at the last full batch, as slow_batches does",
                make_pipeline("partial batch")),
    ])

KEYS = {"Exercise 1": EX1, "Exercise 3": EX3, "Exercise 4": EX4}

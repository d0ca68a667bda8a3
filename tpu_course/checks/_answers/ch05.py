"""The course's own answers to lab 5 (private: only :mod:`tpu_course.checks.ch05` uses them).

The checkers compare a learner's step and pipeline with these, and refuse an answer that
is, or calls, one of them (``refuse_course_code``): the learner writes their own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tpu_course.train import Batch


def train_step(model: Any, optimizer: Any, batch: Any, max_norm: Any) -> dict:
    """Exercise 3: one weighted step in the NNX style whose gradient is clipped to a global
    norm of at most ``max_norm`` before the update (not jitted here: the caller jits)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tpu_course import models

    w = jnp.asarray(batch.weights, jnp.float32)

    def loss_fn(m):
        logits = m(models.prepare_images(batch.images))
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
        return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    norm = optax.tree.norm(grads)
    scale = jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-30))
    optimizer.update(model, jax.tree.map(lambda g: g * scale, grads))
    hits = (jnp.argmax(logits, -1) == batch.labels).astype(jnp.float32)
    return {"loss": loss, "accuracy": jnp.sum(w * hits) / jnp.maximum(jnp.sum(w), 1.0),
            "grad_norm": norm}


def flip_plan(n: int, batch_size: int, seed: int = 0, epoch: int = 0
              ) -> tuple[np.ndarray, np.ndarray]:
    """Exercise 4's plan: the example indices ``(steps, batch_size)`` and the flip draws
    (uniform in [0, 1), same shape) that ``ch05.slow_batches`` makes, as arrays."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    steps = n // batch_size
    idx = order[:steps * batch_size].reshape(steps, batch_size)
    return idx, rng.random(steps * batch_size).reshape(steps, batch_size)


def fast_batches(images: Any, labels: Any, batch_size: int, seed: int = 0, epoch: int = 0):
    """Exercise 4: the batches of ``ch05.slow_batches``, a whole batch at a time."""
    idx, draws = flip_plan(len(images), batch_size, seed, epoch)
    for i, u in zip(idx, draws):
        x = images[i]
        x = np.where((u < 0.5)[:, None, None], x[:, :, ::-1], x)
        yield Batch(x, np.asarray(labels[i], np.int32), np.ones(batch_size, np.float32))

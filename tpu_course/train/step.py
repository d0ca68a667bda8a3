"""The train-step API: one batch, the training state, the pure step (chapters 5 and 6).

The model is split once into a static ``graphdef`` and a pytree of parameters;
everything that changes during training lives in one pytree, :class:`TrainState`
``(step, params, opt_state)``, and a step is a *pure function*::

    model = models.CNN(rngs=nnx.Rngs(0))
    tx = optax.adam(1e-3)
    graphdef, state = init_state(model, tx)           # TrainState of device arrays
    step = make_train_step(graphdef, tx)              # pure: (state, batch) -> (state, metrics)
    step = jax.jit(step, donate_argnums=0)            # donate: update params in place
    state, metrics = step(state, Batch(images, labels, weights))
    model = to_model(graphdef, state)                 # back to an nnx.Module

``batch`` is a :class:`Batch` of uint8 images ``(B, 28, 28)``, int32 labels ``(B,)``
and float32 weights ``(B,)`` (1 for a real example, 0 for padding). ``metrics`` is a
dict of scalars ``{'loss', 'accuracy'}`` (weighted means over the batch). Because the
step is pure and its inputs are pytrees, ``jax.jit(step, in_shardings=...,
out_shardings=..., donate_argnums=0)`` shards it over a mesh unchanged (chapter 6).
:func:`make_eval_step` is the matching evaluation: ``(params, batch) -> sums``.

**Mixed precision**: ``compute_dtype=jnp.bfloat16`` casts the float32 parameters and
the images to bf16 inside the loss (the matrix units' native input type), computes the
loss in float32, and the gradients flow back to the float32 parameters through the
cast, so the optimizer updates float32 master weights.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from tpu_course import errors, models

# --------------------------------------------------------------------------- state


class Batch(NamedTuple):
    """One batch: uint8 images ``(B, 28, 28)``, int32 labels ``(B,)``, float32 weights
    ``(B,)``.

    ``weights`` is 1 for a real example and 0 for padding: losses and accuracies are
    weighted means, so a padded batch gives exactly the numbers of its real examples.
    """

    images: Any
    labels: Any
    weights: Any


class TrainState(NamedTuple):
    """Everything a training step changes, as one pytree: step count, params, optimizer
    state."""

    step: Any  # int32 scalar
    params: Any  # nnx.State of float32 nnx.Param arrays
    opt_state: Any  # the optax state for ``params``


def init_state(model: nnx.Module, tx: optax.GradientTransformation) -> tuple[Any, TrainState]:
    """Split ``model`` into its static ``graphdef`` and a fresh :class:`TrainState`.

    The models here hold ``nnx.Param`` variables only; a model with other state (batch
    statistics, RNG counters) would need that state threaded through the step too, so it
    is refused with an error rather than silently frozen.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise errors.CourseValueError(
            f"{type(model).__name__} holds non-parameter state ({rest}); this train step "
            "updates nnx.Param variables only. Use a model without BatchNorm/Dropout state "
            "(tpu_course.models.CNN or MLP)."
        )
    return graphdef, TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))


def to_model(graphdef: Any, state_or_params: Any) -> nnx.Module:
    """The ``nnx.Module`` with the parameters of a :class:`TrainState` (or of a params tree)."""
    params = state_or_params.params if isinstance(state_or_params, TrainState) else state_or_params
    return nnx.merge(graphdef, params)


# --------------------------------------------------------------------------- the step


def loss_fn(params, graphdef, batch, compute_dtype=None):
    """Weighted mean cross-entropy of a batch, and the float32 logits:
    ``(loss, logits)``.

    ``loss = sum_i w_i * CE(logits_i, y_i) / max(sum_i w_i, 1)``: padding examples
    (weight 0) count for nothing. ``compute_dtype=jnp.bfloat16`` runs the forward pass
    on bf16 copies of the float32 parameters (mixed precision); the loss is float32.
    """
    if compute_dtype is not None:  # bf16 copies; gradients flow back to float32 params
        params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    model = nnx.merge(graphdef, params)  # the structure and these parameters: a Module
    # uint8 -> floats in [0, 1]
    images = models.prepare_images(batch.images, compute_dtype or jnp.float32)
    logits = model(images).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    w = jnp.asarray(batch.weights, jnp.float32)
    return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0), logits


def make_train_step(model_or_graphdef, tx, *, compute_dtype=None):
    """The pure train step ``(state, batch) -> (new_state, {'loss', 'accuracy'})``.

    Not jitted: ``jax.jit(step, donate_argnums=0)`` compiles it (chapter 5), and the
    same function with shardings runs over many chips (chapter 6).
    ``model_or_graphdef`` is an ``nnx.Module`` (only its structure is used) or the
    ``graphdef`` from :func:`init_state`; ``tx`` is the optax optimizer whose state is
    ``state.opt_state``.
    """
    graphdef = model_or_graphdef
    if isinstance(graphdef, nnx.Module):
        graphdef = nnx.split(graphdef, nnx.Param, ...)[0]

    def train_step(state, batch):
        # d(loss)/d(params); the logits ride along
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (loss, logits), grads = grad_fn(state.params, graphdef, batch, compute_dtype)
        # Adam's maths
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)  # params + updates
        w = jnp.asarray(batch.weights, jnp.float32)
        hits = (jnp.argmax(logits, axis=-1) == batch.labels).astype(jnp.float32)
        accuracy = jnp.sum(w * hits) / jnp.maximum(jnp.sum(w), 1.0)
        metrics = {"loss": loss, "accuracy": accuracy}
        return TrainState(state.step + 1, params, opt_state), metrics

    return train_step


def make_eval_step(model_or_graphdef, *, compute_dtype=None):
    """The pure eval step ``(params, batch) -> {'correct', 'loss_sum', 'count'}``
    (sums).

    Sums rather than means, so that batches of different fill add up exactly:
    accuracy = sum(correct) / sum(count) over the whole test set.
    """
    graphdef = model_or_graphdef
    if isinstance(graphdef, nnx.Module):
        graphdef = nnx.split(graphdef, nnx.Param, ...)[0]

    def eval_step(params, batch):
        loss, logits = loss_fn(params, graphdef, batch, compute_dtype)
        w = jnp.asarray(batch.weights, jnp.float32)
        hits = (jnp.argmax(logits, axis=-1) == batch.labels).astype(jnp.float32)
        return {"correct": jnp.sum(w * hits), "loss_sum": loss * jnp.sum(w),
                "count": jnp.sum(w)}

    return eval_step


"""Training the chapter-5 models: input pipelines, a jitted train step, ``fit``.

What is here, and why
---------------------
* **The train-step API** (also what chapter 6 shards). The model is split once into a
  static ``graphdef`` and a pytree of parameters; everything that changes during
  training lives in one pytree, :class:`TrainState` ``(step, params, opt_state)``, and a
  step is a *pure function*::

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

* **Two input pipelines** (``TrainConfig.pipeline``):

  - ``'prefetch'``, the one the chapter teaches: shuffled numpy batches on the host
    (:func:`batches`), each sent to the device ``depth`` batches ahead of the step that
    needs it (:func:`prefetch_to_device`), so the transfer of batch i+1 overlaps step i.
    One launch of the jitted step per batch.
  - ``'device'``, the fast path: the whole training set lives in device memory (10,000
    MNIST images are 7.8 MB as uint8, 60,000 are 47 MB), the epoch's permutation is drawn
    on the device, and one jitted call runs every step of the epoch with ``lax.scan``
    (:func:`make_device_epoch`): one launch per epoch instead of one per step, and no
    host in the loop.

  The last partial batch of an epoch is handled without a recompilation by
  ``TrainConfig.last_batch``: ``'drop'`` (default for training: the leftover
  ``N mod B`` examples of this epoch's permutation are skipped; a fresh permutation next
  epoch picks others) or ``'pad'`` (padded to a full batch with zero-weight examples, so
  every example is used exactly once per epoch). Evaluation always pads, so the test
  accuracy counts all 10,000 test images (in one scan on the device pipeline, one launch
  per batch on the prefetch pipeline).

* **Mixed precision**: ``compute_dtype='bfloat16'`` casts the float32 parameters and the
  images to bf16 inside the loss (the matrix units' native input type), computes the
  loss in float32, and the gradients flow back to the float32 parameters through the
  cast, so the optimizer updates float32 master weights.

* **fit(config) -> History**: time is split honestly. ``compile_time_s`` is the
  ahead-of-time compilation (``jit(...).lower(...).compile()``) of every function the
  run uses, timed apart; ``train_time_s`` is the time in training steps only, measured
  from an epoch's first launch to ``block_until_ready`` of its last result (no
  compilation, no evaluation); ``images_per_s = images trained / train_time_s``.
  :func:`time_to_accuracy` reads the first epoch at which the test accuracy reached a
  target, and reports training time to it, with and without compilation.

* **Checkpoints**: :func:`save_checkpoint` / :func:`restore_checkpoint` write a
  :class:`TrainState` as an ``.npz`` of its leaves keyed by their pytree paths (plain
  numpy, the same on every JAX and Flax version), and ``fit(..., checkpoint_dir=...,
  resume=True)`` continues a run from its last saved epoch, bit for bit.

Run it: ``python -m tpu_course.train`` trains the default config (``--quick`` for the
CPU preset) and prints the history.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tpu_course import errors, models, runtime

# --------------------------------------------------------------------------- state


class Batch(NamedTuple):
    """One batch: uint8 images ``(B, 28, 28)``, int32 labels ``(B,)``, float32 weights ``(B,)``.

    ``weights`` is 1 for a real example and 0 for padding: losses and accuracies are
    weighted means, so a padded batch gives exactly the numbers of its real examples.
    """

    images: Any
    labels: Any
    weights: Any


class TrainState(NamedTuple):
    """Everything a training step changes, as one pytree: step count, params, optimizer state."""

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
    """Weighted mean cross-entropy of a batch, and the float32 logits: ``(loss, logits)``.

    ``loss = sum_i w_i * CE(logits_i, y_i) / max(sum_i w_i, 1)``: padding examples
    (weight 0) count for nothing. ``compute_dtype=jnp.bfloat16`` runs the forward pass
    on bf16 copies of the float32 parameters (mixed precision); the loss is float32.
    """
    if compute_dtype is not None:  # bf16 copies; gradients flow back to the float32 params
        params = jax.tree.map(lambda p: p.astype(compute_dtype), params)
    model = nnx.merge(graphdef, params)  # the structure and these parameters: a Module again
    images = models.prepare_images(batch.images, compute_dtype or jnp.float32)  # uint8 -> [0, 1]
    logits = model(images).astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
    w = jnp.asarray(batch.weights, jnp.float32)
    return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0), logits


def make_train_step(model_or_graphdef, tx, *, compute_dtype=None):
    """The pure train step ``(state, batch) -> (new_state, {'loss', 'accuracy'})``.

    Not jitted: ``jax.jit(step, donate_argnums=0)`` compiles it (chapter 5), and the same
    function with shardings runs over many chips (chapter 6). ``model_or_graphdef`` is an
    ``nnx.Module`` (only its structure is used) or the ``graphdef`` from :func:`init_state`;
    ``tx`` is the optax optimizer whose state is ``state.opt_state``.
    """
    graphdef = model_or_graphdef
    if isinstance(graphdef, nnx.Module):
        graphdef = nnx.split(graphdef, nnx.Param, ...)[0]

    def train_step(state, batch):
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)  # d(loss)/d(params); logits ride along
        (loss, logits), grads = grad_fn(state.params, graphdef, batch, compute_dtype)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)  # Adam's maths
        params = optax.apply_updates(state.params, updates)  # params + updates
        w = jnp.asarray(batch.weights, jnp.float32)
        hits = (jnp.argmax(logits, axis=-1) == batch.labels).astype(jnp.float32)
        accuracy = jnp.sum(w * hits) / jnp.maximum(jnp.sum(w), 1.0)
        return TrainState(state.step + 1, params, opt_state), {"loss": loss, "accuracy": accuracy}

    return train_step


def make_eval_step(model_or_graphdef, *, compute_dtype=None):
    """The pure eval step ``(params, batch) -> {'correct', 'loss_sum', 'count'}`` (sums).

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
        return {"correct": jnp.sum(w * hits), "loss_sum": loss * jnp.sum(w), "count": jnp.sum(w)}

    return eval_step


# --------------------------------------------------------------------------- host pipeline


def epoch_indices(n: int, batch_size: int, *, seed: int = 0, epoch: int = 0,
                  shuffle: bool = True, last_batch: str = "drop") -> tuple[np.ndarray, np.ndarray]:
    """Example indices ``(steps, batch_size)`` and weights for one epoch, from numpy.

    The permutation is ``np.random.default_rng([seed, epoch]).permutation(n)``: the same
    for the same (seed, epoch), whatever ran before, which is what makes a resumed run
    see the same batches as an uninterrupted one. ``last_batch='drop'`` gives
    ``n // batch_size`` full batches; ``'pad'`` gives ``ceil(n / batch_size)`` batches,
    the last one filled with index 0 at weight 0.
    """
    if batch_size < 1 or n < 1:
        raise errors.CourseValueError(f"need n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    if last_batch == "drop":
        steps = n // batch_size
        if steps == 0:
            raise errors.CourseValueError(f"batch_size={batch_size} is larger than the {n} examples: with "
                                          "last_batch='drop' there is no full batch; use a smaller batch "
                                          "or last_batch='pad'")
        idx = order[: steps * batch_size]
        weights = np.ones(idx.shape, np.float32)
    elif last_batch == "pad":
        steps = -(-n // batch_size)
        idx = np.zeros(steps * batch_size, np.int64)
        idx[:n] = order
        weights = np.zeros(idx.shape, np.float32)
        weights[:n] = 1.0
    else:
        raise errors.CourseValueError(f"last_batch must be 'drop' or 'pad', got {last_batch!r}")
    return idx.reshape(steps, batch_size), weights.reshape(steps, batch_size)


def batches(images: np.ndarray, labels: np.ndarray, batch_size: int, *, seed: int = 0,
            epoch: int = 0, shuffle: bool = True, last_batch: str = "drop") -> Iterator[Batch]:
    """One epoch of shuffled host (numpy) batches; every batch has the same shape.

    See :func:`epoch_indices` for the order and the handling of the last partial batch.
    """
    if len(images) != len(labels):
        raise errors.CourseValueError(f"{len(images)} images but {len(labels)} labels")
    idx, weights = epoch_indices(len(images), batch_size, seed=seed, epoch=epoch,
                                 shuffle=shuffle, last_batch=last_batch)
    for i, w in zip(idx, weights):
        yield Batch(images[i], labels[i].astype(np.int32), w)


def prefetch_to_device(iterator, depth=2, device=None):
    """Yield the items of ``iterator`` as device arrays, ``depth`` transfers ahead.

    ``jax.device_put`` is asynchronous: it starts the copy and returns at once. Keeping
    a queue of ``depth`` items already put means that while the step for batch i runs
    (also asynchronous), the copies of batches i+1 ... i+depth are in flight, so the chip
    does not wait for the host. ``depth=0`` turns prefetching off (put, then yield).

    ``device`` is anything ``jax.device_put`` accepts (a device, a sharding); None is
    the default device.
    """
    if depth < 0:
        raise ValueError(f"prefetch depth must be >= 0, got {depth}")
    queue = collections.deque()  # first in, first out: batches already on their way
    for item in iterator:
        queue.append(jax.device_put(item, device))  # starts the copy, returns at once
        if len(queue) > depth:
            yield queue.popleft()  # the oldest: its copy has had `depth` steps to finish
    while queue:  # the source is empty: hand out what is still queued
        yield queue.popleft()


# --------------------------------------------------------------------------- device pipeline


def device_epoch_indices(key: jax.Array, n: int, batch_size: int,
                         last_batch: str = "drop") -> tuple[jax.Array, jax.Array]:
    """The on-device twin of :func:`epoch_indices`: indices and weights from a JAX key."""
    order = jax.random.permutation(key, n)
    if last_batch == "drop":
        steps = n // batch_size
        if steps == 0:
            raise errors.CourseValueError(f"batch_size={batch_size} > {n} examples with last_batch='drop'")
        idx = order[: steps * batch_size]
        weights = jnp.ones(idx.shape, jnp.float32)
    elif last_batch == "pad":
        steps = -(-n // batch_size)
        pad = steps * batch_size - n
        idx = jnp.concatenate([order, jnp.zeros(pad, order.dtype)])
        weights = jnp.concatenate([jnp.ones(n, jnp.float32), jnp.zeros(pad, jnp.float32)])
    else:
        raise errors.CourseValueError(f"last_batch must be 'drop' or 'pad', got {last_batch!r}")
    return idx.reshape(steps, batch_size), weights.reshape(steps, batch_size)


def make_device_epoch(train_step: Callable, n: int, batch_size: int,
                      last_batch: str = "drop") -> Callable:
    """One whole epoch as one function, for data already in device memory.

    Returns ``epoch(state, images, labels, key) -> (state, metrics)`` where ``metrics``
    holds per-step arrays ``{'loss': (steps,), 'accuracy': (steps,)}``. The permutation
    is drawn on the device from ``key`` and ``lax.scan`` runs ``train_step`` over the
    batches, gathering each batch from the device-resident arrays: jitted, that is one
    launch per epoch. Pass the data as arguments (not closed over), so it is not baked
    into the program as a constant.
    """

    def epoch(state: TrainState, images: jax.Array, labels: jax.Array,
              key: jax.Array) -> tuple[TrainState, dict]:
        idx, weights = device_epoch_indices(key, n, batch_size, last_batch)

        def body(carry: TrainState, xs: tuple[jax.Array, jax.Array]):
            i, w = xs
            return train_step(carry, Batch(images[i], labels[i], w))

        return jax.lax.scan(body, state, (idx, weights))

    return epoch


def make_device_evaluate(eval_step: Callable, n: int, batch_size: int) -> Callable:
    """The whole test set in one call: ``evaluate(params, images, labels) -> sums``.

    The ``n`` examples are padded to a multiple of ``batch_size`` with zero-weight
    examples, so nothing is truncated and every batch has one shape.
    """
    steps = -(-n // batch_size)
    pad = steps * batch_size - n

    def evaluate(params: Any, images: jax.Array, labels: jax.Array) -> dict:
        imgs = jnp.concatenate([images, jnp.zeros((pad, *images.shape[1:]), images.dtype)])
        labs = jnp.concatenate([labels, jnp.zeros((pad,), labels.dtype)])
        w = jnp.concatenate([jnp.ones(n, jnp.float32), jnp.zeros(pad, jnp.float32)])
        xs = (imgs.reshape(steps, batch_size, *images.shape[1:]),
              labs.reshape(steps, batch_size), w.reshape(steps, batch_size))

        def body(acc: dict, x: tuple) -> tuple[dict, None]:
            out = eval_step(params, Batch(*x))
            return jax.tree.map(jnp.add, acc, out), None

        zero = {"correct": jnp.float32(0), "loss_sum": jnp.float32(0), "count": jnp.float32(0)}
        return jax.lax.scan(body, zero, xs)[0]

    return evaluate


@dataclasses.dataclass(frozen=True)
class StepTiming:
    """Timed training steps: how many, seconds per step, images per second."""

    steps: int
    seconds_per_step: float
    images_per_s: float

    def __str__(self) -> str:
        return (f"{self.steps} steps: {self.seconds_per_step * 1e3:.2f} ms/step, "
                f"{self.images_per_s:,.0f} images/s")


def time_steps(run_step: Callable, state: TrainState, batch_iter: Iterable[Batch], *,
               warmup: int = 2) -> tuple[TrainState, StepTiming]:
    """Run ``run_step`` over ``batch_iter`` threading the state; time all but ``warmup`` steps.

    The clock starts after ``warmup`` steps have finished (so compilation is excluded)
    and stops when the last state is ready (``jax.block_until_ready``). The state is
    threaded through, so this also times a step that donates its input state, which a
    harness calling ``fn(*args)`` again and again cannot.
    """
    it = iter(batch_iter)
    for _ in range(warmup):
        state, _ = run_step(state, next(it))
    jax.block_until_ready(state)
    t = time.perf_counter()
    steps = images = 0
    for batch in it:
        state, _ = run_step(state, batch)
        steps += 1
        images += len(batch.labels)
    jax.block_until_ready(state)
    elapsed = time.perf_counter() - t
    if steps == 0:
        raise errors.CourseValueError(f"batch_iter gave no batches after the {warmup} warm-up steps")
    return state, StepTiming(steps, elapsed / steps, images / elapsed)


# --------------------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True, repr=False)
class Evaluation:
    """Test-set results: accuracy and mean loss over all ``count`` examples, predictions."""

    accuracy: float
    loss: float
    count: int
    predictions: np.ndarray

    def __repr__(self) -> str:
        return f"Evaluation(accuracy={self.accuracy:.4f}, loss={self.loss:.4f}, count={self.count})"


def evaluate(model: nnx.Module, images: np.ndarray, labels: np.ndarray,
             batch_size: int = 1000) -> Evaluation:
    """Accuracy, loss and predicted classes of ``model`` on every one of ``images``.

    Batched with a padded last batch (one compiled shape), so all examples count.
    """
    graphdef, params = nnx.split(model, nnx.Param, ...)[:2]

    @jax.jit
    def logits_of(p: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, p)(models.prepare_images(x))

    n = len(images)
    idx, w = epoch_indices(n, min(batch_size, n), shuffle=False, last_batch="pad")
    all_logits = np.concatenate([np.asarray(logits_of(params, images[i])) for i in idx])[:n]
    preds = all_logits.argmax(-1)
    labels = np.asarray(labels)
    z = all_logits - all_logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    loss = float(-logp[np.arange(n), labels].mean())
    return Evaluation(float((preds == labels).mean()), loss, n, preds)


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray,
                     num_classes: int = models.NUM_CLASSES) -> np.ndarray:
    """``C[i, j]`` = number of examples of true class i predicted as class j.

    >>> confusion_matrix(np.array([0, 1, 1]), np.array([0, 1, 0]), 2).tolist()
    [[1, 0], [1, 1]]
    """
    cm = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(cm, (np.asarray(labels), np.asarray(predictions)), 1)
    return cm


# --------------------------------------------------------------------------- config, history


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What to train and how. Defaults are for a real chip; :meth:`quick` for a 2-core CPU.

    Attributes:
        dataset: 'mnist' or 'fashion_mnist' (same code path for both).
        model: 'cnn' or 'mlp' (:mod:`tpu_course.models`).
        features: the CNN's two convolution widths (ignored by the MLP).
        hidden: the CNN's dense hidden width (ignored by the MLP).
        epochs: passes over the training set.
        batch_size: examples per step.
        learning_rate: Adam's peak learning rate (a cosine decay to 0 over the run
            follows a warm-up of ``warmup_steps``).
        warmup_steps: linear warm-up steps from 0 to the peak learning rate.
        seed: seeds the model initialisation and every epoch's shuffle.
        pipeline: 'device' (on-device epochs with lax.scan) or 'prefetch' (host batches,
            prefetched to the device, one step launch per batch).
        prefetch: batches in flight ahead of the step ('prefetch' pipeline; 0 = off).
        last_batch: 'drop' or 'pad' the last partial training batch (see module doc).
        compute_dtype: 'float32' or 'bfloat16' (bf16 compute, float32 parameters).
        donate: donate the state buffers to the jitted step.
        eval_batch_size: examples per evaluation batch (the test set is padded to it).
        log_every: record the mean training loss and accuracy every this many steps.
        max_train_examples: train on the first this many examples only (None: all).
        stop_at_accuracy: stop after the first epoch whose test accuracy reaches it (a
            fraction in [0, 1]; 0 stops after the first epoch).
        progress: show a tqdm progress bar.
    """

    dataset: str = "mnist"
    model: str = "cnn"
    features: tuple[int, int] = (16, 32)
    hidden: int = 128
    epochs: int = 5
    batch_size: int = 64
    learning_rate: float = 5e-3
    warmup_steps: int = 10
    seed: int = 0
    pipeline: str = "device"
    prefetch: int = 2
    last_batch: str = "drop"
    compute_dtype: str = "float32"
    donate: bool = True
    eval_batch_size: int = 2000
    log_every: int = 20
    max_train_examples: int | None = None
    stop_at_accuracy: float | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        """Check every field, so that nonsense is refused here and not trained on."""
        where = "TrainConfig"
        choices = {"dataset": ("mnist", "fashion_mnist"), "model": tuple(models.MODELS),
                   "pipeline": ("device", "prefetch"), "last_batch": ("drop", "pad"),
                   "compute_dtype": ("float32", "bfloat16")}
        for field, allowed in choices.items():
            errors.check_choice(field, getattr(self, field), allowed, where=where)
        for field in ("hidden", "epochs", "batch_size", "eval_batch_size", "log_every"):
            errors.check_int(field, getattr(self, field), low=1, where=where)
        for field in ("warmup_steps", "seed", "prefetch"):
            errors.check_int(field, getattr(self, field), low=0, where=where)
        models._widths(where, "features", self.features, count=2)
        # Adam's step is about lr per update: above 1 it only ever diverges on this model.
        errors.check_number("learning_rate", self.learning_rate, low=0, high=1, low_open=True,
                            where=where)
        if self.max_train_examples is not None:
            errors.check_int("max_train_examples", self.max_train_examples, low=1, where=where)
        if self.stop_at_accuracy is not None:
            # 0 is allowed: it stops after the first epoch (a way to interrupt a run).
            errors.check_number("stop_at_accuracy", self.stop_at_accuracy, low=0, high=1,
                                where=where)
        for field in ("donate", "progress"):
            if not isinstance(getattr(self, field), bool):
                raise errors.CourseTypeError(f"{where}.{field}={getattr(self, field)!r}: "
                                             "expected True or False.")

    @classmethod
    def quick(cls, **overrides: Any) -> "TrainConfig":
        """The preset for a 2-core CPU (CI): the same model and data, 3 epochs, fp32.

        It uses the host-fed ``'prefetch'`` pipeline: XLA's CPU backend runs a
        ``lax.scan`` of convolutions several times slower than the same step launched
        once per batch (measured here: about 120 vs 900 images/s on 2 busy cores), while
        on a TPU or GPU the on-device epoch is the fast path.
        """
        base = dict(epochs=3, eval_batch_size=1000, pipeline="prefetch")
        base.update(overrides)
        return cls(**base)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """One epoch: mean training loss/accuracy, test loss/accuracy, cumulative times (s)."""

    epoch: int
    train_loss: float
    train_accuracy: float
    test_loss: float
    test_accuracy: float
    train_time_s: float  # cumulative training-step time to the end of this epoch
    wall_time_s: float  # since fit() began: data, compilation, training and evaluation


@dataclasses.dataclass(frozen=True, repr=False)
class History:
    """What ``fit`` measured. Times in seconds; ``train_time_s`` excludes compilation.

    ``steps`` holds ``(step, mean loss, mean accuracy)`` of every ``log_every`` training
    steps. ``state`` and ``graphdef`` are the trained result (``model`` rebuilds the
    ``nnx.Module``).
    """

    config: TrainConfig
    train_set: str
    device: str
    epochs: tuple[EpochRecord, ...]
    steps: tuple[tuple[int, float, float], ...]
    compile_time_s: float
    train_time_s: float
    eval_time_s: float
    images_trained: int
    wall_time_s: float
    state: Any = dataclasses.field(default=None, compare=False)
    graphdef: Any = dataclasses.field(default=None, compare=False)

    @property
    def test_accuracy(self) -> list[float]:
        """Test accuracy after each epoch."""
        return [e.test_accuracy for e in self.epochs]

    @property
    def train_loss(self) -> list[float]:
        """Mean training loss of each epoch."""
        return [e.train_loss for e in self.epochs]

    @property
    def images_per_s(self) -> float:
        """Training throughput: images trained / training time (compilation excluded)."""
        return self.images_trained / self.train_time_s if self.train_time_s > 0 else float("nan")

    @property
    def model(self) -> nnx.Module:
        """The trained model."""
        return to_model(self.graphdef, self.state)

    def summary(self) -> str:
        """A few lines: data, device, final accuracy, times, throughput."""
        last = self.epochs[-1] if self.epochs else None
        acc = f"{last.test_accuracy:.2%}" if last else "n/a"
        return (f"{self.config.model.upper()} on {self.train_set}, {len(self.epochs)} epoch(s), "
                f"{self.config.pipeline} pipeline, {self.config.compute_dtype}, on {self.device}\n"
                f"test accuracy {acc}; compile {self.compile_time_s:.2f} s, training "
                f"{self.train_time_s:.2f} s, evaluation {self.eval_time_s:.2f} s, wall "
                f"{self.wall_time_s:.2f} s; {self.images_per_s:,.0f} images/s")

    def __repr__(self) -> str:
        return f"History({self.summary()})"

    def table(self) -> str:
        """Per-epoch table (deterministic columns first, times last)."""
        rows = ["epoch  train loss  train acc  test loss  test acc  train s  wall s"]
        for e in self.epochs:
            rows.append(f"{e.epoch:5d}  {e.train_loss:10.4f}  {e.train_accuracy:9.4f}  "
                        f"{e.test_loss:9.4f}  {e.test_accuracy:8.4f}  {e.train_time_s:7.2f}  "
                        f"{e.wall_time_s:6.2f}")
        return "\n".join(rows)

    def plot(self, ax: Any = None) -> Any:
        """Training loss every ``log_every`` steps and test accuracy per epoch (matplotlib)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(1, 2, figsize=(10, 3.2))
        s = np.array(self.steps) if self.steps else np.zeros((0, 3))
        ax[0].plot(s[:, 0], s[:, 1], label="training loss")
        ax[0].set(xlabel="step", ylabel="loss", yscale="log", title="training loss")
        spe = max(1, self.images_trained // max(1, len(self.epochs)) // self.config.batch_size)
        ax[1].plot([e.epoch * spe for e in self.epochs], self.test_accuracy, "o-",
                   label="test accuracy")
        ax[1].plot(s[:, 0], s[:, 2], alpha=0.5, label="training accuracy (batch mean)")
        ax[1].set(xlabel="step", ylabel="accuracy", title="accuracy", ylim=(0.8, 1.0))
        ax[1].legend(loc="lower right")
        return ax


@dataclasses.dataclass(frozen=True)
class TimeToAccuracy:
    """When a run first reached ``target`` test accuracy (checked after every epoch).

    ``train_time_s`` is training-step time only; ``with_compile_s`` adds compilation;
    ``wall_time_s`` is from the start of ``fit`` (data, compile, train, eval). All None
    when the target was never reached.
    """

    target: float
    reached: bool
    epoch: int | None
    accuracy: float | None
    train_time_s: float | None
    with_compile_s: float | None
    wall_time_s: float | None
    device: str

    def __str__(self) -> str:
        if not self.reached:
            return f"{self.target:.1%} not reached on {self.device}"
        return (f"{self.target:.1%} reached after epoch {self.epoch} ({self.accuracy:.2%}): "
                f"{self.train_time_s:.3f} s of training, {self.with_compile_s:.3f} s with "
                f"compilation, {self.wall_time_s:.3f} s wall, on {self.device}")


def time_to_accuracy(history: History, target: float = 0.976) -> TimeToAccuracy:
    """The first epoch whose test accuracy is >= ``target``, and the time it took."""
    for e in history.epochs:
        if e.test_accuracy >= target:
            return TimeToAccuracy(target, True, e.epoch, e.test_accuracy, e.train_time_s,
                                  e.train_time_s + history.compile_time_s, e.wall_time_s,
                                  history.device)
    return TimeToAccuracy(target, False, None, None, None, None, None, history.device)


# --------------------------------------------------------------------------- reference runs

#: Committed ``make bench`` results shipped inside the package, so that a notebook shows
#: them on any runtime (Colab included), not only in a clone of the repository.
REFERENCE_DIR = pathlib.Path(__file__).resolve().parent / "reference"


def accelerator_reference(name: str = "mnist-h200") -> dict:
    """A committed benchmark result: ``bench/results/<name>.json`` as ``make bench`` wrote it.

    Measured, not sourced: each holds the device, the date and the jax version of the run
    that produced it, and its rows (see ``bench/bench_mnist.py``). Chapter 5 shows the
    H200's rows beside its own CPU measurements. A test keeps the copy in
    ``tpu_course/reference/`` equal to the one in ``bench/results/``.

    >>> ref = accelerator_reference()
    >>> ref["device"], sorted({r["train_set"].split(":")[0] for r in ref["rows"]})
    ('h200', ['fashion_mnist', 'mnist'])
    """
    path = REFERENCE_DIR / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in REFERENCE_DIR.glob("*.json"))
        raise ValueError(f"no committed result {name!r}; the package ships {known}")
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- checkpoints


def _leaf_paths(tree: Any) -> tuple[list[str], list[Any], Any]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(p) for p, _ in flat], [x for _, x in flat], treedef


def save_checkpoint(path: str | os.PathLike, state: TrainState,
                    metadata: dict | None = None) -> pathlib.Path:
    """Write ``state`` (every leaf, keyed by its pytree path) to ``path`` (.npz).

    ``metadata`` (JSON-able) is stored beside the arrays. The file is written to a
    temporary name and renamed, so an interrupted save never leaves a broken checkpoint.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys, leaves, _ = _leaf_paths(state)
    arrays = {f"{i:05d}": np.asarray(jax.device_get(x)) for i, x in enumerate(leaves)}
    arrays["__keys__"] = np.array(keys)
    arrays["__metadata__"] = np.array(json.dumps(metadata or {}))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return path


def restore_checkpoint(path: str | os.PathLike, like: TrainState) -> tuple[TrainState, dict]:
    """Read a checkpoint written by :func:`save_checkpoint` into the structure of ``like``.

    Returns ``(state, metadata)``. ``like`` gives the tree structure, shapes, dtypes and
    placement (e.g. a fresh ``init_state``); a mismatch raises ``ValueError`` naming the
    first differing leaf.
    """
    keys, leaves, treedef = _leaf_paths(like)
    with np.load(pathlib.Path(path), allow_pickle=False) as f:
        saved_keys = [str(k) for k in f["__keys__"]]
        if saved_keys != keys:
            diff = next((f"{a} vs {b}" for a, b in zip(saved_keys, keys) if a != b),
                        f"{len(saved_keys)} leaves vs {len(keys)}")
            raise errors.CourseValueError(f"checkpoint {path} does not match this model/optimizer: {diff}. "
                                          "Restore into the state of the same model and optimizer.")
        out = []
        for i, ref in enumerate(leaves):
            arr = f[f"{i:05d}"]
            if arr.shape != np.shape(ref) or arr.dtype != np.asarray(ref).dtype:
                raise errors.CourseValueError(f"checkpoint leaf {keys[i]} has {arr.shape} {arr.dtype}, "
                                              f"expected {np.shape(ref)} {np.asarray(ref).dtype}")
            sharding = getattr(ref, "sharding", None)
            out.append(jax.device_put(arr, sharding) if sharding is not None else jnp.asarray(arr))
        metadata = json.loads(str(f["__metadata__"]))
    return jax.tree_util.tree_unflatten(treedef, out), metadata


# --------------------------------------------------------------------------- fit


def make_optimizer(config: TrainConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    """Adam with a linear warm-up to ``learning_rate`` and a cosine decay to 0 over the run."""
    total = max(config.epochs * steps_per_epoch, config.warmup_steps + 1)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, min(config.warmup_steps, total - 1), total)
    return optax.adam(schedule)


def _load(config: TrainConfig) -> Any:
    from tpu_course import data

    return data.load_mnist() if config.dataset == "mnist" else data.load_fashion_mnist()


def _device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform.upper()} {d.device_kind}"


def _timed_compile(fn: Callable, *args: Any, donate: tuple[int, ...] = ()) -> tuple[Any, float]:
    t = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=donate).lower(*args).compile()
    return compiled, time.perf_counter() - t


def fit(config: TrainConfig = TrainConfig(), *, data: Any = None,
        checkpoint_dir: str | os.PathLike | None = None, resume: bool = False) -> History:
    """Train ``config.model`` on ``config.dataset``; evaluate on the full test set each epoch.

    Args:
        config: what to train and how (:class:`TrainConfig`).
        data: a dataset with ``train_images``, ``train_labels``, ``test_images``,
            ``test_labels`` and ``train_set`` (default: ``tpu_course.data``'s loader).
        checkpoint_dir: save the state after every epoch to ``<dir>/state.npz``.
        resume: continue from the checkpoint in ``checkpoint_dir`` when there is one (the
            next epochs see exactly the batches an uninterrupted run would).

    Returns:
        a :class:`History`.
    """
    t_start = time.perf_counter()
    ds = data if data is not None else _load(config)
    train_x, train_y = np.asarray(ds.train_images), np.asarray(ds.train_labels, np.int32)
    if config.max_train_examples is not None:
        train_x, train_y = train_x[: config.max_train_examples], train_y[: config.max_train_examples]
    test_x, test_y = np.asarray(ds.test_images), np.asarray(ds.test_labels, np.int32)
    n, bs = len(train_x), config.batch_size
    steps_per_epoch = n // bs if config.last_batch == "drop" else -(-n // bs)
    if steps_per_epoch == 0:
        raise errors.CourseValueError(f"batch_size={bs} exceeds the {n} training examples; lower it")

    kwargs = {"features": tuple(config.features), "hidden": config.hidden} if config.model == "cnn" else {}
    model = models.create(config.model, seed=config.seed, **kwargs)
    tx = make_optimizer(config, steps_per_epoch)
    graphdef, state = init_state(model, tx)
    dtype = jnp.bfloat16 if config.compute_dtype == "bfloat16" else None
    step = make_train_step(graphdef, tx, compute_dtype=dtype)
    eval_bs = min(config.eval_batch_size, len(test_x))
    evaluate_fn = make_device_evaluate(make_eval_step(graphdef, compute_dtype=dtype),
                                       len(test_x), eval_bs)
    donate = (0,) if config.donate and runtime.donation_is_safe() else ()

    ckpt = pathlib.Path(checkpoint_dir) / "state.npz" if checkpoint_dir is not None else None
    done: list[EpochRecord] = []
    logged: list[tuple[int, float, float]] = []
    start_epoch = 0
    if resume and ckpt is not None and ckpt.exists():
        state, meta = restore_checkpoint(ckpt, state)
        start_epoch = int(meta["epoch"])
        done = [EpochRecord(**r) for r in meta["epochs"]]
        logged = [tuple(s) for s in meta["steps"]]

    test_x_d, test_y_d = jax.device_put(test_x), jax.device_put(test_y)
    if config.pipeline == "device":
        train_x_d, train_y_d = jax.device_put(train_x), jax.device_put(train_y)
        epoch_fn = make_device_epoch(step, n, bs, config.last_batch)
        key0 = jax.random.key(config.seed)
        run_epoch, c1 = _timed_compile(epoch_fn, state, train_x_d, train_y_d, key0, donate=donate)
    else:
        probe = next(batches(train_x, train_y, bs, last_batch=config.last_batch))
        run_step, c1 = _timed_compile(step, state, jax.device_put(probe), donate=donate)
    if config.pipeline == "device":
        run_eval, c2 = _timed_compile(evaluate_fn, state.params, test_x_d, test_y_d)
    else:  # one launch per batch here too (XLA:CPU runs a scan of convolutions slowly)
        eval_idx, eval_w = epoch_indices(len(test_x), eval_bs, shuffle=False, last_batch="pad")
        eval_batches = [jax.device_put(Batch(test_x[i], test_y[i], w)) for i, w in zip(eval_idx, eval_w)]
        eval_step, c2 = _timed_compile(make_eval_step(graphdef, compute_dtype=dtype),
                                       state.params, eval_batches[0])

        def run_eval(params: Any, *_: Any) -> dict:
            parts = [eval_step(params, b) for b in eval_batches]
            return jax.tree.map(lambda *xs: sum(xs), *parts)
    compile_time = c1 + c2

    train_time = done[-1].train_time_s if done else 0.0
    eval_time = 0.0
    images = 0
    prior_wall = done[-1].wall_time_s if done else 0.0
    from tqdm.auto import tqdm

    bar = tqdm(total=config.epochs * steps_per_epoch, initial=start_epoch * steps_per_epoch,
               disable=not config.progress, desc=f"{config.model} on {config.dataset}",
               unit="step")
    for epoch in range(start_epoch, config.epochs):
        t0 = time.perf_counter()
        if config.pipeline == "device":
            key = jax.random.fold_in(jax.random.key(config.seed), epoch)
            state, metrics = run_epoch(state, train_x_d, train_y_d, key)
            jax.block_until_ready(state)
            bar.update(steps_per_epoch)
        else:
            per_step = []
            host = batches(train_x, train_y, bs, seed=config.seed, epoch=epoch,
                           last_batch=config.last_batch)
            for i, batch in enumerate(prefetch_to_device(host, config.prefetch)):
                state, m = run_step(state, batch)
                per_step.append(m)
                if (i + 1) % config.log_every == 0:
                    bar.update(config.log_every)
            jax.block_until_ready(state)
            bar.update(steps_per_epoch % config.log_every)
            metrics = {k: jnp.stack([m[k] for m in per_step]) for k in ("loss", "accuracy")}
        train_time += time.perf_counter() - t0
        images += n if config.last_batch == "pad" else steps_per_epoch * bs

        t1 = time.perf_counter()
        sums = jax.device_get(run_eval(state.params, test_x_d, test_y_d))
        eval_time += time.perf_counter() - t1
        losses = np.asarray(metrics["loss"], np.float64)
        accs = np.asarray(metrics["accuracy"], np.float64)
        for j in range(0, steps_per_epoch - config.log_every + 1, config.log_every):
            logged.append((epoch * steps_per_epoch + j + config.log_every,
                           float(losses[j:j + config.log_every].mean()),
                           float(accs[j:j + config.log_every].mean())))
        record = EpochRecord(
            epoch=epoch + 1, train_loss=float(losses.mean()), train_accuracy=float(accs.mean()),
            test_loss=float(sums["loss_sum"] / sums["count"]),
            test_accuracy=float(sums["correct"] / sums["count"]),
            train_time_s=train_time, wall_time_s=prior_wall + time.perf_counter() - t_start)
        done.append(record)
        bar.set_postfix(loss=f"{record.train_loss:.4f}", test_acc=f"{record.test_accuracy:.4f}")
        if ckpt is not None:
            save_checkpoint(ckpt, state, {"epoch": epoch + 1,
                                          "epochs": [dataclasses.asdict(r) for r in done],
                                          "steps": logged,
                                          "config": dataclasses.asdict(config)})
        if config.stop_at_accuracy is not None and record.test_accuracy >= config.stop_at_accuracy:
            break
    bar.close()
    train_set = f"{getattr(ds, 'name', config.dataset)}: {getattr(ds, 'train_set', f'{n} images')}"
    if n < len(ds.train_images):
        train_set += f", first {n:,} used"
    return History(config=config, train_set=train_set, device=_device_name(),
                   epochs=tuple(done), steps=tuple(logged), compile_time_s=compile_time,
                   train_time_s=train_time, eval_time_s=eval_time, images_trained=images,
                   wall_time_s=time.perf_counter() - t_start, state=state, graphdef=graphdef)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tpu_course.train", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 2-core CPU preset")
    parser.add_argument("--dataset", default=None, choices=("mnist", "fashion_mnist"))
    parser.add_argument("--pipeline", default=None, choices=("device", "prefetch"))
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    config = TrainConfig.quick() if args.quick else TrainConfig()
    changes = {k: v for k, v in (("dataset", args.dataset), ("pipeline", args.pipeline),
                                 ("epochs", args.epochs)) if v is not None}
    if args.bf16:
        changes["compute_dtype"] = "bfloat16"
    history = fit(config.replace(**changes))
    print(history.summary())
    print(history.table())
    print(time_to_accuracy(history, 0.976))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

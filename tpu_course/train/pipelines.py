"""Input pipelines: how batches reach the train step (chapter 5).

Two pipelines, one interface (:class:`Pipeline`), chosen by ``TrainConfig.pipeline``:

* ``'prefetch'`` (:class:`HostPipeline`), the one the chapter teaches: shuffled numpy
  batches on the host (:func:`batches`), each sent to the device ``depth`` batches ahead
  of the step that needs it (:func:`prefetch_to_device`), so the transfer of batch i+1
  overlaps step i. One launch of the jitted step per batch.
* ``'device'`` (:class:`DevicePipeline`), the fast path: the whole training set lives in
  device memory (10,000 MNIST images are 7.8 MB as uint8, 60,000 are 47 MB), the
  epoch's permutation is drawn on the device, and one jitted call runs every step of the
  epoch with ``lax.scan`` (:func:`make_device_epoch`): one launch per epoch instead of
  one per step, and no host in the loop.

The last partial batch of an epoch is handled without a recompilation by
``last_batch``: ``'drop'`` (the leftover ``N mod B`` examples of this epoch's
permutation are skipped; a fresh permutation next epoch picks others) or ``'pad'``
(padded to a full batch with zero-weight examples, so every example is used exactly
once per epoch). Evaluation always pads, so the test accuracy counts every test image
(in one scan on the device pipeline, one launch per batch on the host pipeline).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from tpu_course import errors
from tpu_course.train.step import Batch, TrainState

# --------------------------------------------------------------------------- host pipeline


def lay_out(order, batch_size, last_batch, xp):
    """Cut a permutation ``order`` of n examples into ``(steps, batch_size)`` indices
    and weights: one rule for the host (``xp=numpy``) and the device (``xp=jax.numpy``).

    ``'drop'``: the ``n // batch_size`` full batches; the leftover ``n % batch_size``
    examples of this permutation are skipped (the next epoch's permutation picks
    others). ``'pad'``: ``ceil(n / batch_size)`` batches, the last one filled up with
    example 0 at weight 0, so every example counts exactly once. Either way every batch
    has one shape, so the jitted step never recompiles.
    """
    n = order.shape[0]
    if last_batch == "drop":
        steps = n // batch_size
        if steps == 0:
            raise ValueError(f"batch_size={batch_size} is larger than the {n} "
                             "examples: with last_batch='drop' there is no full batch; "
                             "use a smaller batch or last_batch='pad'")
        idx = order[: steps * batch_size]
        weights = xp.ones(idx.shape, xp.float32)
    elif last_batch == "pad":
        steps = -(-n // batch_size)  # ceil(n / batch_size)
        pad = steps * batch_size - n
        idx = xp.concatenate([order, xp.zeros(pad, order.dtype)])
        weights = xp.concatenate([xp.ones(n, xp.float32), xp.zeros(pad, xp.float32)])
    else:
        raise ValueError(f"last_batch must be 'drop' or 'pad', got {last_batch!r}")
    return idx.reshape(steps, batch_size), weights.reshape(steps, batch_size)


def epoch_indices(n, batch_size, *, seed=0, epoch=0, shuffle=True, last_batch="drop"):
    """Example indices ``(steps, batch_size)`` and weights for one epoch, from numpy.

    The permutation is ``np.random.default_rng([seed, epoch]).permutation(n)``: the same
    for the same (seed, epoch), whatever ran before, which is what makes a resumed run
    see the same batches as an uninterrupted one. ``last_batch`` as in ``lay_out``.
    """
    if batch_size < 1 or n < 1:
        raise ValueError(f"need n >= 1 and batch_size >= 1, got n={n}, "
                         f"batch_size={batch_size}")
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(n)
    else:
        order = np.arange(n)
    return lay_out(order, batch_size, last_batch, np)


def batches(images, labels, batch_size, *, seed=0, epoch=0, shuffle=True,
            last_batch="drop"):
    """One epoch of shuffled host (numpy) batches; every batch has the same shape.

    Only the indices are shuffled; ``images[i]`` then gathers one batch, still uint8
    (the chip converts it). See ``epoch_indices`` for the order and the last partial
    batch.
    """
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    idx, weights = epoch_indices(len(images), batch_size, seed=seed, epoch=epoch,
                                 shuffle=shuffle, last_batch=last_batch)
    for i, w in zip(idx, weights):
        yield Batch(images[i], labels[i].astype(np.int32), w)


def prefetch_to_device(iterator, depth=2, device=None):
    """Yield the items of ``iterator`` as device arrays, ``depth`` transfers ahead.

    ``jax.device_put`` is asynchronous: it starts the copy and returns at once. Keeping
    a queue of ``depth`` items already put means that while the step for batch i runs
    (also asynchronous), the copies of batches i+1 ... i+depth are in flight, so the
    chip does not wait for the host. ``depth=0`` turns prefetching off (put, then
    yield).

    ``device`` is anything ``jax.device_put`` accepts (a device, a sharding); None is
    the default device.
    """
    if depth < 0:
        raise ValueError(f"prefetch depth must be >= 0, got {depth}")
    queue = collections.deque()  # first in, first out: batches already on their way
    for item in iterator:
        queue.append(jax.device_put(item, device))  # starts the copy, returns at once
        if len(queue) > depth:
            yield queue.popleft()  # the oldest: its copy had `depth` steps to finish
    while queue:  # the source is empty: hand out what is still queued
        yield queue.popleft()


# --------------------------------------------------------------------------- device pipeline


def device_epoch_indices(key, n, batch_size, last_batch="drop"):
    """The on-device twin of ``epoch_indices``: the permutation drawn from a JAX key."""
    return lay_out(jax.random.permutation(key, n), batch_size, last_batch, jnp)


def make_device_epoch(train_step, n, batch_size, last_batch="drop"):
    """One whole epoch as one function, for data already in device memory.

    Returns ``epoch(state, images, labels, key) -> (state, metrics)`` where ``metrics``
    holds per-step arrays ``{'loss': (steps,), 'accuracy': (steps,)}``. The permutation
    is drawn on the device from ``key`` and ``lax.scan`` runs ``train_step`` over the
    batches, gathering each batch from the device-resident arrays: jitted, that is one
    launch per epoch. Pass the data as arguments (not closed over), so it is not baked
    into the program as a constant.
    """

    def epoch(state, images, labels, key):
        # (steps, B) each
        idx, weights = device_epoch_indices(key, n, batch_size, last_batch)

        def body(state, xs):  # one step: scan feeds it row k of idx and weights
            i, w = xs
            # the gather is on the device
            return train_step(state, Batch(images[i], labels[i], w))

        # the metrics stacked: (steps,) each
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



# --------------------------------------------------------------------------- the two pipelines


class Placement(NamedTuple):
    """Where a sharded run keeps things: the :class:`TrainState`, each :class:`Batch`, and
    the scalar metrics (``jax.sharding`` objects; see ``tpu_course.parallel``)."""

    state: Any
    batch: Any
    scalars: Any


class Pipeline(Protocol):
    """What ``train.fit`` asks of a pipeline (both of this module's pipelines have it)."""

    steps_per_epoch: int  # train steps in one epoch
    images_per_epoch: int  # real (non-padding) examples trained on in one epoch

    def compile(self, train_step: Callable, eval_step: Callable, state: TrainState,
                donate: tuple[int, ...]) -> float:
        """Compile every function the run uses, ahead of time; return the seconds it took."""

    def train_epoch(self, state: TrainState, epoch: int,
                    advance: Callable[[int], Any]) -> tuple[TrainState, dict]:
        """Train one epoch; ``advance(k)`` reports k more steps done. Returns the new state
        (ready: the clock may stop) and per-step ``{'loss', 'accuracy'}`` arrays."""

    def evaluate(self, params: Any) -> dict:
        """Sums ``{'correct', 'loss_sum', 'count'}`` over every test example (host numbers)."""


def steps_per_epoch(n: int, batch_size: int, last_batch: str = "drop") -> int:
    """Train steps in an epoch of ``n`` examples (``last_batch`` as in :func:`epoch_indices`)."""
    return len(epoch_indices(n, batch_size, shuffle=False, last_batch=last_batch)[0])


def _timed_compile(fn: Callable, *args: Any, **jit_kwargs: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    compiled = jax.jit(fn, **jit_kwargs).lower(*args).compile()
    return compiled, time.perf_counter() - t


class _Common:
    """The arguments and the epoch arithmetic both pipelines share."""

    def __init__(self, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], *,
                 batch_size: int, eval_batch_size: int, seed: int = 0, shuffle: bool = True,
                 last_batch: str = "drop", depth: int = 2, placement: Placement | None = None):
        self.train_x, self.train_y = np.asarray(train[0]), np.asarray(train[1], np.int32)
        self.test_x, self.test_y = np.asarray(test[0]), np.asarray(test[1], np.int32)
        self.batch_size, self.seed, self.shuffle, self.last_batch = batch_size, seed, shuffle, last_batch
        self.depth, self.placement = depth, placement
        self.eval_batch_size = min(eval_batch_size, len(self.test_x))
        n = len(self.train_x)
        self.steps_per_epoch = steps_per_epoch(n, batch_size, last_batch)
        self.images_per_epoch = n if last_batch == "pad" else self.steps_per_epoch * batch_size


class HostPipeline(_Common):
    """``'prefetch'``: numpy batches from the host, ``depth`` transfers ahead, one launch per step.

    With a :class:`Placement`, the step is compiled with those shardings and every batch
    is sent to ``placement.batch`` (a sharded run, chapter 6).
    """

    def _host_batches(self, epoch: int) -> Iterator[Batch]:
        return batches(self.train_x, self.train_y, self.batch_size, seed=self.seed, epoch=epoch,
                       shuffle=self.shuffle, last_batch=self.last_batch)

    def compile(self, train_step: Callable, eval_step: Callable, state: TrainState,
                donate: tuple[int, ...]) -> float:
        place = self.placement
        self._batch_device = place.batch if place is not None else None
        shardings = {} if place is None else {"in_shardings": (place.state, place.batch),
                                               "out_shardings": (place.state, place.scalars)}
        probe = jax.device_put(next(self._host_batches(0)), self._batch_device)
        self._step, c1 = _timed_compile(train_step, state, probe, donate_argnums=donate, **shardings)
        # Evaluation: one launch per batch here too (XLA:CPU runs a scan of convolutions slowly).
        idx, w = epoch_indices(len(self.test_x), self.eval_batch_size, shuffle=False, last_batch="pad")
        self._eval_batches = [jax.device_put(Batch(self.test_x[i], self.test_y[i], ww), self._batch_device)
                              for i, ww in zip(idx, w)]
        self._eval, c2 = _timed_compile(eval_step, state.params, self._eval_batches[0])
        return c1 + c2

    def train_epoch(self, state: TrainState, epoch: int,
                    advance: Callable[[int], Any]) -> tuple[TrainState, dict]:
        per_step = []
        for batch in prefetch_to_device(self._host_batches(epoch), self.depth, self._batch_device):
            state, m = self._step(state, batch)
            per_step.append(m)
            advance(1)
        jax.block_until_ready(state)
        return state, {k: jnp.stack([m[k] for m in per_step]) for k in ("loss", "accuracy")}

    def evaluate(self, params: Any) -> dict:
        parts = [self._eval(params, b) for b in self._eval_batches]
        return jax.device_get(jax.tree.map(lambda *xs: sum(xs), *parts))


class DevicePipeline(_Common):
    """``'device'``: the data in device memory, one ``lax.scan`` launch per epoch.

    ``depth`` is not used (nothing is transferred during an epoch). Its permutation is
    drawn on the device, so it always shuffles, and it runs on one device (no placement).
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.placement is not None:
            raise errors.CourseValueError("the 'device' pipeline runs on one device; a sharded run "
                                          "feeds its batches from the host: use pipeline='prefetch'")
        if not self.shuffle:
            raise errors.CourseValueError("the 'device' pipeline always shuffles (on the device); "
                                          "for batches in order use pipeline='prefetch'")
        self._train_d = (jax.device_put(self.train_x), jax.device_put(self.train_y))
        self._test_d = (jax.device_put(self.test_x), jax.device_put(self.test_y))

    def compile(self, train_step: Callable, eval_step: Callable, state: TrainState,
                donate: tuple[int, ...]) -> float:
        epoch_fn = make_device_epoch(train_step, len(self.train_x), self.batch_size, self.last_batch)
        self._epoch, c1 = _timed_compile(epoch_fn, state, *self._train_d, jax.random.key(self.seed),
                                         donate_argnums=donate)
        evaluate_fn = make_device_evaluate(eval_step, len(self.test_x), self.eval_batch_size)
        self._eval, c2 = _timed_compile(evaluate_fn, state.params, *self._test_d)
        return c1 + c2

    def train_epoch(self, state: TrainState, epoch: int,
                    advance: Callable[[int], Any]) -> tuple[TrainState, dict]:
        key = jax.random.fold_in(jax.random.key(self.seed), epoch)
        state, metrics = self._epoch(state, *self._train_d, key)
        jax.block_until_ready(state)
        advance(self.steps_per_epoch)
        return state, metrics

    def evaluate(self, params: Any) -> dict:
        return jax.device_get(self._eval(params, *self._test_d))


#: ``TrainConfig.pipeline`` -> the pipeline class (both take the same arguments).
PIPELINES: dict[str, type] = {"prefetch": HostPipeline, "device": DevicePipeline}

"""Checkers for lab 5: the train step and the prefetching input pipeline.

* :func:`check_train_step` takes the learner's ``make_train_step(graphdef, tx)`` and
  checks, on a small MLP and a fixed batch, that one step gives exactly what
  ``tx.update`` + ``optax.apply_updates`` give (parameters change only through the
  optimizer), that the step count and optimizer state advance, and that the loss goes
  down over a few steps.
* :func:`check_prefetch` takes the learner's ``prefetch_to_device(iterator, depth)`` and
  checks that every item comes out once, in order, as a device array, and that the
  transfers really run ahead: when item i is handed out, items i+1 ... i+depth must
  already have been taken from the source and put on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tpu_course.checks._core import CheckResult, fail, ok

STEP = "Exercise 1 (train step)"
PREFETCH = "Exercise 2 (prefetch to device)"


def _fixed_batch(n: int = 64, seed: int = 0) -> Any:
    from tpu_course import train

    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (10, 28, 28))
    y = rng.integers(0, 10, n).astype(np.int32)
    x = np.clip(templates[y] + rng.normal(0, 60, (n, 28, 28)), 0, 255).astype(np.uint8)
    return train.Batch(x, y, np.ones(n, np.float32))


def _max_diff(a: Any, b: Any) -> float:
    import jax

    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def check_train_step(make_train_step: Callable) -> CheckResult:
    """Check ``make_train_step(graphdef, tx) -> step(state, batch) -> (state, metrics)``."""
    import jax
    import optax
    from flax import nnx

    from tpu_course import models, train

    tx = optax.adam(1e-2)
    graphdef, state = train.init_state(models.MLP(hidden=(32,), rngs=nnx.Rngs(0)), tx)
    batch = _fixed_batch()
    try:
        step = jax.jit(make_train_step(graphdef, tx))
        new, metrics = step(state, batch)
    except NotImplementedError:
        return fail(STEP, "make_train_step still raises NotImplementedError: write the step.")
    except Exception as err:  # noqa: BLE001 - any error is feedback for the learner
        return fail(STEP, f"calling step(state, batch) raised {type(err).__name__}: {err}")
    if not isinstance(new, train.TrainState):
        return fail(STEP, f"the step must return (TrainState, metrics); got a "
                    f"{type(new).__name__} first. Build it with TrainState(step, params, opt_state).")
    if not isinstance(metrics, dict) or "loss" not in metrics:
        return fail(STEP, "the second result must be a dict with at least a 'loss' entry.")

    # The reference: the same maths written once, in the package.
    want, want_metrics = jax.jit(train.make_train_step(graphdef, tx))(state, batch)
    grads = jax.grad(lambda p: train.loss_fn(p, graphdef, batch)[0])(state.params)
    if _max_diff(new.params, state.params) == 0.0:
        return fail(STEP, "the parameters did not change: return the updated params "
                    "(optax.apply_updates(params, updates)), not the old ones.")
    sgd_like = jax.tree.map(lambda p, g: p - 1e-2 * g, state.params, grads)
    if _max_diff(new.params, sgd_like) < 1e-6:
        return fail(STEP, "the parameters moved by -lr * grad: that is plain gradient descent, "
                    "not the optimizer. Use updates, opt_state = tx.update(grads, opt_state, "
                    "params) and apply those updates.")
    if abs(float(metrics["loss"]) - float(want_metrics["loss"])) > 1e-4 * abs(float(want_metrics["loss"])):
        return fail(STEP, f"loss {float(metrics['loss']):.5f}, expected "
                    f"{float(want_metrics['loss']):.5f}: the loss should be the mean softmax "
                    "cross-entropy of the batch (train.loss_fn).")
    diff = _max_diff(new.params, want.params)
    if diff > 1e-5:
        return fail(STEP, f"after one step the parameters differ from tx.update + "
                    f"optax.apply_updates by up to {diff:.2e}: parameters must change only "
                    "through the optimizer's updates (no extra scaling, no second update).")
    if _max_diff(new.opt_state, state.opt_state) == 0.0:
        return fail(STEP, "the optimizer state did not change: return the opt_state that "
                    "tx.update gave back (Adam's moments and count), not the old one.")
    if int(new.step) != int(state.step) + 1:
        return fail(STEP, f"the step counter went from {int(state.step)} to {int(new.step)}; "
                    "it should grow by one.")
    losses = []
    s = state
    for _ in range(15):
        s, m = step(s, batch)
        losses.append(float(m["loss"]))
    if not losses[-1] < 0.7 * losses[0]:
        return fail(STEP, f"on one fixed batch the loss went {losses[0]:.3f} -> "
                    f"{losses[-1]:.3f} in 15 steps; it should fall well below its start.")
    return ok(STEP, f"matches tx.update + apply_updates; loss on a fixed batch "
              f"{losses[0]:.3f} -> {losses[-1]:.3f} in 15 steps")


def check_prefetch(prefetch_to_device: Callable, depth: int = 2, items: int = 8) -> CheckResult:
    """Check ``prefetch_to_device(iterator, depth)``: order, completeness, placement, overlap."""
    import jax

    pulled: list[int] = []

    def source():
        for i in range(items):
            pulled.append(i)
            yield np.full((4,), i, np.int32)

    out: list[int] = []
    ahead: list[int] = []
    try:
        for item in prefetch_to_device(source(), depth):
            if not isinstance(item, jax.Array):
                return fail(PREFETCH, f"item {len(out)} came out as {type(item).__name__}; "
                            "it should already be on the device (jax.device_put it).")
            out.append(int(np.asarray(item)[0]))
            ahead.append(len(pulled) - len(out))
    except NotImplementedError:
        return fail(PREFETCH, "prefetch_to_device still raises NotImplementedError.")
    except Exception as err:  # noqa: BLE001
        return fail(PREFETCH, f"iterating raised {type(err).__name__}: {err}")
    if sorted(out) != list(range(items)):
        missing = sorted(set(range(items)) - set(out))
        repeated = sorted({i for i in out if out.count(i) > 1})
        return fail(PREFETCH, f"expected each of the {items} items once; missing {missing}, "
                    f"repeated {repeated}. Empty the queue at the end, and yield each item once.")
    if out != list(range(items)):
        return fail(PREFETCH, f"items came out in the order {out}; keep the source order "
                    "(a first-in, first-out queue).")
    want = [min(depth, items - i - 1) for i in range(items)]
    if ahead != want:
        if max(ahead) == 0:
            return fail(PREFETCH, "no overlap: each item was taken from the source only when "
                        "it was needed. Put the next `depth` items on the device before "
                        "yielding the current one.")
        return fail(PREFETCH, f"items in flight ahead of each yield were {ahead}, expected "
                    f"{want} for depth={depth}.")
    return ok(PREFETCH, f"all {items} items in order, on the device, {depth} transfers ahead")

"""The lab-5 checkers accept the solution and reject plausible wrong answers."""

from __future__ import annotations

import collections

import jax
import optax
import pytest

from tpu_course import train
from tpu_course.checks import ch05


def test_train_step_checker_accepts_the_package_step():
    result = ch05.check_train_step(train.make_train_step)
    assert result.passed, result.message


def _wrong_step(kind):
    def make(graphdef, tx):
        def step(state, batch):
            (loss, _), grads = jax.value_and_grad(train.loss_fn, has_aux=True)(
                state.params, graphdef, batch)
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            if kind == "no update":
                params = state.params
            elif kind == "bypasses optimizer":
                params = jax.tree.map(lambda p, g: p - 1e-2 * g, state.params, grads)
            elif kind == "extra change":  # weight decay outside the optimizer
                params = jax.tree.map(lambda p: 0.99 * p, params)
            elif kind == "stale opt_state":
                opt_state = state.opt_state
            return train.TrainState(state.step + 1, params, opt_state), {"loss": loss}
        return step
    return make


@pytest.mark.parametrize("kind, phrase", [
    ("no update", "did not change"),
    ("bypasses optimizer", "plain gradient descent"),
    ("extra change", "only through the optimizer"),
    ("stale opt_state", "optimizer state did not change"),
])
def test_train_step_checker_rejects_wrong_steps(kind, phrase):
    result = ch05.check_train_step(_wrong_step(kind))
    assert not result.passed and phrase in result.message, result.message


def test_train_step_checker_reports_an_unwritten_exercise():
    def make(graphdef, tx):
        raise NotImplementedError("Exercise 1: write your code here")
    assert "NotImplementedError" in ch05.check_train_step(make).message


def test_prefetch_checker_accepts_the_package_pipeline():
    result = ch05.check_prefetch(train.prefetch_to_device)
    assert result.passed, result.message


def no_overlap(iterator, depth=2):
    for item in iterator:
        yield jax.device_put(item)


def drops_the_tail(iterator, depth=2):
    queue = collections.deque()
    for item in iterator:
        queue.append(jax.device_put(item))
        if len(queue) > depth:
            yield queue.popleft()


def repeats(iterator, depth=2):
    queue = collections.deque()
    for item in iterator:
        queue.append(jax.device_put(item))
        if len(queue) > depth:
            yield queue[0]
            yield queue.popleft()
    yield from queue


def stays_on_host(iterator, depth=2):
    queue = collections.deque()
    for item in iterator:
        queue.append(item)
        if len(queue) > depth:
            yield queue.popleft()
    yield from queue


def lifo(iterator, depth=2):  # empties its queue from the wrong end at the end
    stack = []
    for item in iterator:
        stack.append(jax.device_put(item))
        if len(stack) > depth:
            yield stack.pop(0)
    yield from reversed(stack)


@pytest.mark.parametrize("fn, phrase", [
    (no_overlap, "no overlap"),
    (drops_the_tail, "missing [6, 7]"),
    (repeats, "repeated"),
    (stays_on_host, "on the device"),
    (lifo, "order"),
])
def test_prefetch_checker_rejects_wrong_pipelines(fn, phrase):
    result = ch05.check_prefetch(fn)
    assert not result.passed and phrase in result.message, result.message

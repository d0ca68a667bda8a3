"""Lab 8's written loops, exercises 5 (resume training from an Orbax checkpoint) and 6 (the
decode loop with a KV cache): every known mistake is refused with its hint, honest solutions
written unlike the course's pass (grading's hidden cases too), and what is not an answer
gets a hint."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import grading
from tests import assess
from tpu_course import lm

LAB = 8


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB, only=(5, 6)))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


def honest_train(directory, steps, problem):
    """Params and optimizer state as two items of one checkpoint, saved after every step."""
    import orbax.checkpoint as ocp

    from tpu_course import textdata

    params, opt_state = problem.init()
    with ocp.CheckpointManager(directory) as manager:
        done = manager.latest_step()
        if done is not None:
            saved = manager.restore(done, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(params), opt=ocp.args.StandardRestore(opt_state)))
            params, opt_state = saved.params, saved.opt
        while (done or 0) < steps:
            done = done or 0
            batch = textdata.batch_at(problem.corpus, done, problem.batch, problem.length,
                                      problem.seed)
            params, opt_state, _ = problem.step(params, opt_state, *batch)
            done += 1
            manager.save(done, args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), opt=ocp.args.StandardSave(opt_state)))
        manager.wait_until_finished()
    return params


@nnx.jit
def _decode_jitted(model, tokens, cache):
    return model.decode(tokens, cache)


def honest_generate(model, prompt, steps, key, temperature=0.0, top_k=None):
    """Top-k by sorting, the temperature before the mask, the whole loop in one list, each
    decode compiled."""
    decode = _decode_jitted
    logits, cache = decode(model, prompt, lm.init_cache(model.config, prompt.shape[0]))
    tokens = []
    while len(tokens) < steps:
        last = logits[:, -1].astype(jnp.float32)
        if temperature > 0:
            last = last / temperature
            if top_k is not None:
                floor = jnp.sort(last, axis=-1)[:, -top_k, None]
                last = jnp.where(last < floor, -jnp.inf, last)
            token = jax.random.categorical(jax.random.fold_in(key, len(tokens)), last)
        else:
            token = last.argmax(-1)
        tokens.append(token)
        if len(tokens) < steps:
            logits, cache = decode(model, token.reshape(-1, 1).astype(jnp.int32), cache)
    return jnp.stack(tokens, axis=-1)


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 5", honest_train), ("Exercise 6", honest_generate)], ids=["5", "6"])
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


def _raises(*_):
    raise TypeError("something inside went wrong")


@pytest.mark.parametrize(("title", "answer", "words"), [
    ("Exercise 5", lambda directory, steps, problem: None, ("not the parameters", "params")),
    ("Exercise 5", _raises, ("raised TypeError", "latest step")),
    ("Exercise 6", lambda model, prompt, steps, *_: jnp.zeros((prompt.shape[0], steps + 1)),
     ("shape", "one column per new byte")),
    ("Exercise 6", lambda model, prompt, steps, *_: jnp.zeros(
        (prompt.shape[0], prompt.shape[1] + steps), jnp.int32), ("new bytes only",)),
    ("Exercise 6", _raises, ("raised TypeError", "prefill")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_what_is_not_an_answer_gets_a_hint(title, answer, words):
    assess.failed(assess.graded(LAB, title, answer), *words)


@pytest.mark.built_on_newest
def test_visible_data_is_current():
    """Lab 8's stored visible data (every exercise's) are what the keys give now: here, last,
    where the costly part (the reference and mistakes of exercises 5 and 6 on the visible
    cases) is already computed by the tests above, once per process."""
    assert grading.stale([LAB]) == []

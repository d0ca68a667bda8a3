"""Lab 5's exercises: every known mistake is refused with its hint; honest solutions written
unlike the course's pass (grading's hidden cases and the notebook's check); shortcuts fail
with a useful hint. Exercise 5 trains on a small learnable set (its Fashion-MNIST case runs
when the lab is built), once for the whole file."""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import grading
from tests import assess
from tpu_course.checks import ch05, engine
from tpu_course.checks.engine import Case, NotWritten
from tpu_course.train import Batch

LAB = 5


@pytest.fixture(autouse=True, scope="module")
def outputs_once():
    """Each reference's and mistake's output on a case, computed once for this file (grading
    computes every mistake's output on every case for each answer it grades)."""
    done, output = {}, grading._output

    def once(exercise, answer, case):
        key = (exercise.title, id(answer), case.label, repr(case.args))
        if key not in done:
            done[key] = output(exercise, answer, case)
        return done[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grading, "_output", once)
        yield


@pytest.mark.parametrize(("ex", "key", "mistake"), assess.mistakes(LAB))
def test_each_mistake_is_named(ex, key, mistake):
    assess.assert_mistake_named(ex, key, mistake)


# -- honest answers, written unlike the course's -------------------------------------------


class Good(nnx.Module):
    """One convolution, reshape-mean pooling, one dense layer (the course's has two of each)."""

    def __init__(self, *, rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.dense = nnx.Linear(14 * 14 * 8, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv1(x))
        n, h, w, c = x.shape
        x = x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))
        return self.dense(x.reshape(x.shape[0], -1))


GOOD_PARAMS = 9 * 8 + 8 + 14 * 14 * 8 * 10 + 10
GOOD_FLOPS = 2 * 3 * 64 * (28 * 28 * 9 * 8 + 14 * 14 * 8 * 10)


@nnx.jit
def honest_step(model, optimizer, batch, max_norm):
    """log_softmax and take_along_axis, nnx.grad then a second forward pass, jnp.average,
    optax's clip_by_global_norm applied by hand."""
    x = batch.images.astype(jnp.float32)[..., None] / 255.0
    w = batch.weights

    def loss_of(m):
        logp = jax.nn.log_softmax(m(x))
        return -jnp.sum(jnp.take_along_axis(logp, batch.labels[:, None], 1)[:, 0] * w) / w.sum()

    loss, logits = loss_of(model), model(x)
    grads = nnx.grad(loss_of)(model)
    clip = optax.clip_by_global_norm(max_norm)
    optimizer.update(model, clip.update(grads, clip.init(grads))[0])
    correct = (logits.argmax(axis=1) == batch.labels).astype(jnp.float32)
    return {"loss": loss, "accuracy": jnp.average(correct, weights=w),
            "grad_norm": optax.tree.norm(grads)}


def honest_batches(images, labels, batch_size, seed=0, epoch=0):
    """All the epoch's draws at once, then np.flip on a boolean mask."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    steps = len(images) // batch_size
    flips = rng.random(steps * batch_size) < 0.5
    for s in range(steps):
        sel = slice(s * batch_size, (s + 1) * batch_size)
        x = images[order[sel]].copy()
        x[flips[sel]] = np.flip(x[flips[sel]], axis=2)
        yield Batch(x, np.int32(labels[order[sel]]), np.ones(batch_size, dtype=np.float32))


@pytest.mark.parametrize(("title", "answer"), [
    ("Exercise 1", Good),
    ("Exercise 2", (Good, GOOD_PARAMS, float(GOOD_FLOPS))),
    ("Exercise 3", honest_step),
    ("Exercise 4", honest_batches),
], ids=["ex1", "ex2", "ex3", "ex4"])
def test_honest_answers_pass(title, answer):
    assess.assert_passes(LAB, title, answer)


# -- Exercise 5 on a small learnable set, trained once ------------------------------------

SMALL = Case("a small learnable set", {"source": "templates", "train": 320, "evaluate": 200})
CONFIG = {"batch_size": 64, "learning_rate": 5e-3, "warmup_steps": 3}
EX5 = ch05.LAB.find("Exercise 5")


def graded5(model=Good, step=honest_step, pipeline=honest_batches, config=CONFIG):
    (got,) = EX5.run({"FashionModel": model, "train_step": step, "fast_batches": pipeline,
                      "fashion_config": config}, [SMALL])
    return got, grading.grade(EX5, grading.Key(), [got], [SMALL])


@functools.lru_cache(maxsize=None)
def trained():
    return graded5()


def test_honest_pieces_reach_the_target_and_the_labels_stay_with_the_checker():
    got, result = trained()
    assert result.passed, result
    assert set(got) == {"before", "after", "losses", "learning_rate", "steps"}
    assert got["after"].shape == (200,) and got["steps"] == 15  # predictions, no labels
    again, _ = graded5(config=dict(CONFIG))  # the scorecard's re-run: no second training
    assert again["losses"] == got["losses"] and ch05._LAST_RUN[1]["losses"] is not None


@pytest.mark.parametrize(("change", "hint"), [
    ({"before": "accuracy"}, "load no trained weights"),
    ({"after": "chance", "learning_rate": 0.1}, "makes Adam diverge"),
    ({"after": "chance"}, "is the step updating the model"),
    ({"after": "low", "learning_rate": 1e-4}, "still falling"),
])
def test_each_training_mistake_is_named(change, hint):
    got, _ = trained()
    want = ch05._data("templates", 320, 200)[3]
    values = {"accuracy": want, "chance": (want + 1) % 10,
              "low": np.where(np.arange(200) < 120, want, (want + 1) % 10)}
    bad = {**got, **{k: values.get(v, v) for k, v in change.items()}}
    result = grading.grade(EX5, grading.Key(), [bad], [SMALL])
    assert result.status == "failed" and hint in result.hint, result


@pytest.mark.parametrize("config", [
    {**CONFIG, "epochs": 30}, [64, 5e-3], {"batch_size": 64}, {**CONFIG, "learning_rate": "5e-3"},
    {**CONFIG, "batch_size": 4}, {**CONFIG, "batch_size": 64.0}, {**CONFIG, "warmup_steps": 1000},
    None])
def test_a_config_the_check_cannot_train_with_is_refused(config):
    _, result = graded5(config=config)
    assert result.status == "failed" and "fashion_config" in result.message + result.hint, result


def test_a_pipeline_that_feeds_other_images_is_caught():
    def test_set_instead(images, labels, batch_size, seed=0, epoch=0):
        yield from honest_batches(images[::-1].copy(), labels[::-1].copy(), batch_size, seed, epoch)

    _, result = graded5(pipeline=test_set_instead)
    assert result.status == "failed" and "Exercise 4" in result.hint, result


def test_unfinished_pieces_are_refused_before_training():
    for answer in ((Good, honest_step.fun if hasattr(honest_step, "fun") else print,
                    honest_batches), (Good, honest_step, "fast")):
        _, result = graded5(*answer)
        assert result.status == "failed" and "Exercises 1, 3 and 4" in result.hint, result
    stub = NotWritten("Exercise 5")
    assert EX5.check(Good, honest_step, honest_batches, stub).status == "not written"


# -- Exercise 2's rules: one measurement, predictions varied --------------------------------


@functools.lru_cache(maxsize=None)
def measured():
    (got,) = ch05.LAB.find("Exercise 2").run(
        {"FashionModel": Good, "predicted_params": 1, "predicted_step_flops": 1})
    return got


@pytest.mark.parametrize(("params", "flops", "hint"), [
    (GOOD_PARAMS - 8 - 10, GOOD_FLOPS, "biases"), (GOOD_PARAMS * 4, GOOD_FLOPS, "bytes"),
    (GOOD_PARAMS * 64, GOOD_FLOPS, "do not grow with the batch"),
    (GOOD_PARAMS + 1000, GOOD_FLOPS, "weights AND biases"),
    (GOOD_PARAMS, GOOD_FLOPS / 64, "per image"), (GOOD_PARAMS, GOOD_FLOPS / 3, "forward pass only"),
    (GOOD_PARAMS, GOOD_FLOPS / 2, "multiply-adds: XLA counts 2"),
    (GOOD_PARAMS, GOOD_FLOPS / 6, "multiply-adds of the forward pass only"),
    (GOOD_PARAMS, GOOD_FLOPS / 192, "one image's forward pass"),
])
def test_each_prediction_mistake_is_named(params, flops, hint):
    ex = ch05.LAB.find("Exercise 2")
    got = {**measured(), "params": float(params), "flops": float(flops)}
    result = grading.grade(ex, grading.Key(), [got], ex.cases)
    assert result.status == "failed" and hint in result.hint, result
    assert f"{GOOD_PARAMS:,}" not in result.message + result.hint


@pytest.mark.parametrize(("params", "flops"), [
    ("14,170", GOOD_FLOPS), (None, GOOD_FLOPS), (GOOD_PARAMS, float("nan")),
    (GOOD_PARAMS, np.ones(3)), (True, GOOD_FLOPS)])
def test_a_prediction_that_is_not_a_number_is_refused(params, flops):
    result = ch05.check_prediction(Good, params, flops)
    assert result.status == "failed" and "predicted_" in result.message and result.hint, result


def test_the_prediction_is_locked_with_its_model_once_the_measurement_shows():
    ch05.LAB.predict("Exercise 2", Good, GOOD_PARAMS, GOOD_FLOPS / 3)
    try:
        assert ch05.LAB.predicted("Exercise 2")
        result = ch05.check_prediction(Good, GOOD_PARAMS, GOOD_FLOPS)  # edited afterwards
        assert "forward pass only" in result.hint and "recorded before" in result.message
    finally:
        engine._PREDICTIONS.clear()


# -- shortcuts that are not wrong answers ------------------------------------------------------


class FixedBatch(Good):
    def __call__(self, x):
        return self.dense(nnx.relu(self.conv1(x))[:, ::2, ::2].reshape(4, -1))


class SmallBatchesOnly(Good):
    def __call__(self, x):  # right only for batches of at most 4
        return self.dense(nnx.relu(self.conv1(x))[:, ::2, ::2].reshape(min(len(x), 4), -1))


class NeedsArgs(Good):
    def __init__(self, width, *, rngs):
        super().__init__(rngs=rngs)


@pytest.mark.parametrize(("answer", "phrase"), [
    (FixedBatch, "x.shape[0]"), (NeedsArgs, "signature"), ("CNN", "class Fashion"),
    (None, "class Fashion"), (lambda *, rngs: 3, "subclass nnx.Module")])
def test_a_model_that_cannot_be_checked_says_why(answer, phrase):
    result = ch05.check_model(answer)
    assert result.status == "failed" and phrase in result.hint, result


def test_hidden_batch_sizes_catch_a_model_right_only_for_the_notebooks_batches():
    assert ch05.check_model(SmallBatchesOnly).passed
    result = assess.graded(LAB, "Exercise 1", SmallBatchesOnly)
    assert result.status == "failed" and "not show" in result.message, result


def make_shortcut(kind):
    """The honest step wrapped in Python (it keeps ``lower``, so it looks compiled)."""
    state = {}

    def step(model, optimizer, batch, max_norm):
        out = honest_step(model, optimizer, batch, max_norm)
        if kind == "tuple":
            return out["loss"], out["accuracy"]
        if kind == "string":
            return {**out, "loss": "low"}
        if kind == "stateful":  # the metrics of its first call, every call
            return state.setdefault("first", out)
        return {**out, "loss": 2.3}  # a hard-coded loss

    step.lower = honest_step.lower
    return step


@pytest.mark.parametrize(("step", "phrase"), [
    (make_shortcut("tuple"), "return {'loss'"), (make_shortcut("string"), "remove the quotes"),
    (make_shortcut("stateful"), "loss = sum(w * CE)"), (make_shortcut("constant"), "loss = sum"),
    (honest_step.fun if hasattr(honest_step, "fun") else print, "@nnx.jit")])
def test_a_step_that_is_not_a_step_says_why(step, phrase):
    result = assess.graded(LAB, "Exercise 3", step)
    assert result.status == "failed" and phrase in result.hint, result


def test_hidden_paddings_catch_a_step_that_hard_codes_the_notebooks():
    def drops_the_last_16(model, optimizer, batch, max_norm):
        keep = np.where(np.arange(64) < 48, batch.weights, 0.0).astype(np.float32)
        return honest_step(model, optimizer, Batch(batch.images, batch.labels, keep), max_norm)

    drops_the_last_16.lower = honest_step.lower

    result = assess.graded(LAB, "Exercise 3", drops_the_last_16)
    assert result.status == "failed", result


def test_hidden_batch_sizes_catch_a_pipeline_hard_coded_for_64():
    from grading.ch05 import make_pipeline

    assert ch05.check_fast_batches(make_pipeline("draws 64")).passed
    result = assess.graded(LAB, "Exercise 4", make_pipeline("draws 64"))
    assert result.status == "failed" and "not show" in result.message, result


def still_slow(images, labels, batch_size, seed=0, epoch=0):
    """Right batches, one pixel at a time: no faster."""
    yield from ch05.slow_batches(images, labels, batch_size, seed, epoch)


def test_a_slow_or_broken_pipeline_says_why():
    result = ch05.check_fast_batches(still_slow)
    assert result.status == "failed" and "whole batches" in result.hint, result

    def broken(images, labels, batch_size, seed=0, epoch=0):
        raise IndexError("oops")
        yield

    result = ch05.check_fast_batches(broken)
    assert result.status == "failed" and "IndexError" in result.message, result
    assert ch05.check_fast_batches("fast").status == "failed"


def test_the_course_pipeline_is_the_slow_one_vectorised():
    images, labels = ch05._images(130, 5)
    for a, b in zip(honest_batches(images, labels, 32, 2, 1),
                    ch05.slow_batches(images, labels, 32, 2, 1), strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.skipif(not pathlib.Path("/usr/share/datasets/fashion-mnist").is_dir()
                    and not __import__("os").environ.get("TPU_COURSE_DATA"),
                    reason="exercise 5's evaluation labels: apt-get install dataset-fashion-mnist")
@pytest.mark.built_on_newest
def test_visible_data_is_current():
    assert grading.stale([LAB]) == []

"""The lab-5 checkers accept the solution, reject plausible wrong answers, and never raise."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tpu_course import models
from tpu_course.checks import NotWritten, ch05
from tpu_course.train import Batch

# -- the solution's answers ---------------------------------------------------------------


class Good(nnx.Module):
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


def make_step(kind="good"):
    @nnx.jit
    def step(model, optimizer, batch):
        w = batch.weights if kind != "unweighted" else jnp.ones_like(batch.weights)

        def loss_fn(m):
            logits = m(models.prepare_images(batch.images))
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
            if kind == "sum":
                return jnp.sum(w * ce), logits
            if kind == "nan":
                return jnp.sum(w * ce) / 0.0 * 0.0, logits
            return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0), logits

        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        if kind != "no update":
            optimizer.update(model, grads)
        if kind == "twice":
            optimizer.update(model, grads)
        hits = jnp.argmax(logits, -1) == batch.labels
        acc_w = batch.weights if kind != "unweighted accuracy" else jnp.ones_like(batch.weights)
        accuracy = jnp.sum(acc_w * hits) / jnp.sum(acc_w)
        if kind == "tuple":
            return loss, accuracy
        return {"loss": loss, "accuracy": accuracy}

    return step


def fast_batches(images, labels, batch_size, seed=0, epoch=0):
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        idx = order[start:start + batch_size]
        x = images[idx]
        flip = rng.random(batch_size) < 0.5
        yield Batch(np.where(flip[:, None, None], x[:, :, ::-1], x),
                    labels[idx].astype(np.int32), np.ones(batch_size, np.float32))


def msg(result):
    return f"{result.status}: {result.message} / {result.hint}"


# -- Exercise 1 ---------------------------------------------------------------------------


def test_model_checker_accepts_a_cnn_and_the_course_models():
    assert ch05.check_model(Good).passed
    assert ch05.check_model(models.CNN).passed, msg(ch05.check_model(models.CNN))


class FixedBatch(Good):
    def __call__(self, x):
        x = nnx.relu(self.conv1(x))[:, ::2, ::2]
        return self.dense(x.reshape(4, -1))  # a hard-coded batch size


class Softmax3(Good):
    def __call__(self, x):
        return super().__call__(x)[:, :3]


class WithBatchNorm(Good):
    def __init__(self, *, rngs):
        super().__init__(rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)


class NeedsArgs(Good):
    def __init__(self, width, *, rngs):
        super().__init__(rngs=rngs)


class NaNModel(Good):
    def __call__(self, x):
        return super().__call__(x) / 0.0


@pytest.mark.parametrize("answer, phrase", [
    (FixedBatch, "raised"),
    (Softmax3, "(N, 10)"),
    (WithBatchNorm, "not nnx.Param"),
    (NeedsArgs, "TypeError"),
    (NaNModel, "NaN"),
    ("CNN", "should be a class"),
    (lambda *, rngs: 3, "not an nnx.Module"),
])
def test_model_checker_rejects_wrong_models(answer, phrase):
    result = ch05.check_model(answer)
    assert not result.passed and phrase in result.message, msg(result)


def test_model_checker_reports_an_unwritten_model():
    class Stub(nnx.Module):
        def __init__(self, *, rngs):
            raise NotImplementedError("Exercise 1: write your code here")
    assert ch05.check_model(Stub).status == "not written"
    assert ch05.check_model(NotWritten("Exercise 1")).status == "not written"


# -- Exercise 2 ---------------------------------------------------------------------------


def test_prediction_checker_accepts_the_arithmetic():
    result = ch05.check_prediction(Good, GOOD_PARAMS, GOOD_FLOPS)
    assert result.passed, msg(result)


@pytest.mark.parametrize("params, flops, phrase", [
    (GOOD_PARAMS - 8 - 10, GOOD_FLOPS, "biases"),  # weights only
    (GOOD_PARAMS * 4, GOOD_FLOPS, "parameter count"),  # bytes, not parameters
    (GOOD_PARAMS, GOOD_FLOPS / 64, "per image"),
    (GOOD_PARAMS, GOOD_FLOPS / 3, "forward pass only"),
    (GOOD_PARAMS, GOOD_FLOPS / 2, "multiply-adds"),
])
def test_prediction_checker_rejects_common_mistakes(params, flops, phrase):
    result = ch05.check_prediction(Good, params, flops)
    assert not result.passed and (phrase in result.message or phrase in result.hint), msg(result)
    assert result.answer  # the expected values only through checks.reveal


@pytest.mark.parametrize("params, flops", [
    ("14,170", GOOD_FLOPS), (None, GOOD_FLOPS), (GOOD_PARAMS, float("nan")),
    (GOOD_PARAMS, np.ones(3)), (True, GOOD_FLOPS),
])
def test_prediction_checker_rejects_garbage_without_raising(params, flops):
    result = ch05.check_prediction(Good, params, flops)
    assert not result.passed and result.status == "failed", msg(result)


def test_prediction_is_not_written_until_assigned(capsys):
    stub = NotWritten("Exercise 2")
    assert ch05.check_prediction(Good, stub, stub).status == "not written"
    ch05.record_prediction(stub, stub)
    assert "no prediction yet" in capsys.readouterr().out


# -- Exercise 3 ---------------------------------------------------------------------------


def test_step_checker_accepts_the_solution():
    result = ch05.check_train_step(make_step())
    assert result.passed, msg(result)


@pytest.mark.parametrize("kind, phrase", [
    ("unweighted", "padding"),
    ("sum", "sum over the batch"),
    ("nan", "NaN"),
    ("no update", "did not change"),
    ("twice", "one optimizer update"),
    ("unweighted accuracy", "accuracy"),
    ("tuple", "returned a tuple"),
])
def test_step_checker_rejects_wrong_steps(kind, phrase):
    result = ch05.check_train_step(make_step(kind))
    assert not result.passed and phrase in result.message, msg(result)


def test_step_checker_wants_a_compiled_step():
    result = ch05.check_train_step(make_step().fun if hasattr(make_step(), "fun") else
                                   (lambda m, o, b: None))
    assert not result.passed and "not compiled" in result.message, msg(result)


def test_step_checker_reports_an_unwritten_step():
    @nnx.jit
    def step(model, optimizer, batch):
        raise NotImplementedError("Exercise 3: write your code here")
    assert ch05.check_train_step(step).status == "not written"


# -- Exercise 4 ---------------------------------------------------------------------------


def test_pipeline_checker_accepts_a_vectorised_pipeline():
    result = ch05.check_fast_batches(fast_batches)
    assert result.passed, msg(result)


def other_shuffle(images, labels, batch_size, seed=0, epoch=0):
    yield from fast_batches(images, labels, batch_size, seed=seed + 1, epoch=epoch)


def no_flips(images, labels, batch_size, seed=0, epoch=0):
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        idx = order[start:start + batch_size]
        yield Batch(images[idx], labels[idx].astype(np.int32), np.ones(batch_size, np.float32))


def floats(images, labels, batch_size, seed=0, epoch=0):
    for b in fast_batches(images, labels, batch_size, seed, epoch):
        yield Batch(b.images.astype(np.float32) / 255, b.labels, b.weights)


def padded_tail(images, labels, batch_size, seed=0, epoch=0):
    yield from fast_batches(images, labels, batch_size, seed, epoch)
    yield Batch(np.zeros((batch_size, 28, 28), np.uint8), np.zeros(batch_size, np.int32),
                np.zeros(batch_size, np.float32))


def still_slow(images, labels, batch_size, seed=0, epoch=0):
    yield from ch05.slow_batches(images, labels, batch_size, seed=seed, epoch=epoch)


@pytest.mark.parametrize("fn, phrase", [
    (other_shuffle, "other examples"),
    (no_flips, "different flips"),
    (floats, "uint8"),
    (padded_tail, "batches"),
    (still_slow, "faster"),
    ("fast", "should be a function"),
])
def test_pipeline_checker_rejects_wrong_pipelines(fn, phrase):
    result = ch05.check_fast_batches(fn)
    assert not result.passed and phrase in result.message, msg(result)


def test_pipeline_checker_survives_a_pipeline_that_raises():
    def broken(images, labels, batch_size, seed=0, epoch=0):
        raise IndexError("oops")
    result = ch05.check_fast_batches(broken)
    assert result.status == "failed" and "IndexError" in result.message


# -- Exercise 5 ---------------------------------------------------------------------------


@pytest.fixture
def fake_fashion(monkeypatch):
    """A tiny test set the checker evaluates instead of Fashion-MNIST's (no data needed)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50, 28, 28)).astype(np.uint8)
    monkeypatch.setitem(ch05._CACHE, "fashion", (images, np.zeros(50, np.int32)))
    return images


class AlwaysZero(nnx.Module):
    def __init__(self, *, rngs):
        self.out = nnx.Linear(784, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(x.reshape(x.shape[0], -1)) * 0 + jnp.eye(10)[0] * 10


def test_accuracy_checker_grades_the_trained_model(fake_fashion):
    model = AlwaysZero(rngs=nnx.Rngs(0))  # class 0 every time: 100 % on the fake labels
    assert ch05.check_accuracy(model, 3).passed
    assert "at most 3" in ch05.check_accuracy(model, 4).message
    assert "should be your trained nnx.Module" in ch05.check_accuracy("model", 3).message
    assert ch05.check_accuracy(model, "3").status == "failed"
    assert ch05.check_accuracy(NotWritten("Exercise 5"), 3).status == "not written"
    untrained = Good(rngs=nnx.Rngs(0))
    result = ch05.check_accuracy(untrained, 3)
    assert (not result.passed) or result.message.startswith("test accuracy 100")


def test_scorecard_counts_every_exercise(fake_fashion):
    card = ch05.LAB.scorecard({"FashionModel": Good})
    assert card.total() == "Lab 5: 1 of 5 passed"
    assert {e.kind for e in ch05.LAB.exercises} >= {"write", "predict", "transfer"}

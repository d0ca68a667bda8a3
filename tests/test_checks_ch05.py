"""The lab-5 checkers accept honest answers that are not the course's, reject each typical
mistake and shortcut with its own hint, refuse the course's own code, check unseen inputs
when grading, and never raise."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tpu_course import checks, models, train
from tpu_course.checks import NotWritten, _core, ch05
from tpu_course.checks._answers import ch05 as answers
from tpu_course.train import Batch


@pytest.fixture(autouse=True)
def fresh_state():
    for store in (_core._PREDICTIONS, _core._LAST, ch05._TRAINED):
        store.clear()
    yield
    for store in (_core._PREDICTIONS, _core._LAST, ch05._TRAINED):
        store.clear()


def msg(result):
    return f"{result.status}: {result.message} / {result.hint}"


def says(result, *phrases):
    """Failed, and each phrase is in the message or the hint."""
    text = f"{result.message} {result.hint}"
    return result.status == "failed" and all(p in text for p in phrases)


# -- honest answers written differently from the course's ---------------------------------


class Good(nnx.Module):
    """One convolution, average pooling, one dense layer (the course's has two of each)."""

    def __init__(self, *, rngs):
        self.conv1 = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.dense = nnx.Linear(14 * 14 * 8, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv1(x))
        n, h, w, c = x.shape
        x = x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))
        return self.dense(x.reshape(x.shape[0], -1))


class Dense(nnx.Module):
    """No convolution at all: flatten, a hidden layer, logits."""

    def __init__(self, *, rngs):
        layers = getattr(nnx, "List", list)  # nnx.List from flax 0.12; a list before
        self.layers = layers([nnx.Linear(784, 64, rngs=rngs), nnx.Linear(64, 10, rngs=rngs)])

    def __call__(self, x):
        h = jax.nn.gelu(self.layers[0](jnp.reshape(x, (len(x), -1))))
        return self.layers[1](h)


GOOD_PARAMS = 9 * 8 + 8 + 14 * 14 * 8 * 10 + 10
GOOD_FLOPS = 2 * 3 * 64 * (28 * 28 * 9 * 8 + 14 * 14 * 8 * 10)


@nnx.jit
def honest_step(model, optimizer, batch, max_norm):
    """log_softmax and take_along_axis instead of optax's CE; nnx.grad then a second
    forward pass for the metrics; jnp.average for the weighted means; optax's own
    clip_by_global_norm transformation applied by hand, and optax.tree.norm."""
    x = batch.images.astype(jnp.float32)[..., None] / 255.0
    w = batch.weights

    def loss_of(m):
        logp = jax.nn.log_softmax(m(x))
        nll = -jnp.take_along_axis(logp, batch.labels[:, None], axis=1)[:, 0]
        return jnp.sum(nll * w) / jnp.sum(w)

    loss = loss_of(model)
    logits = model(x)
    grads = nnx.grad(loss_of)(model)
    clip = optax.clip_by_global_norm(max_norm)
    clipped, _ = clip.update(grads, clip.init(grads))
    optimizer.update(model, clipped)
    correct = (logits.argmax(axis=1) == batch.labels).astype(jnp.float32)
    return {"loss": loss, "accuracy": jnp.average(correct, weights=w),
            "grad_norm": optax.tree.norm(grads)}


class WithinBudget(nnx.Module):
    """Strided convolutions instead of pooling, a narrow dense layer: 52,180 parameters."""

    def __init__(self, *, rngs):
        self.c1 = nnx.Conv(1, 16, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.c2 = nnx.Conv(16, 32, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.d1 = nnx.Linear(7 * 7 * 32, 30, rngs=rngs)
        self.d2 = nnx.Linear(30, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.c2(nnx.relu(self.c1(x))))
        return self.d2(nnx.relu(self.d1(x.reshape(x.shape[0], -1))))


class ChaptersCNN(nnx.Module):
    """Chapter 5's CNN written out: 206,922 parameters, over the budget."""

    def __init__(self, *, rngs):
        self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
        self.dense = nnx.Linear(7 * 7 * 32, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        pool = lambda x: nnx.avg_pool(x, (2, 2), strides=(2, 2))
        x = pool(nnx.relu(self.conv2(pool(nnx.relu(self.conv1(x))))))
        return self.out(nnx.relu(self.dense(x.reshape(x.shape[0], -1))))


def honest_batches(images, labels, batch_size, seed=0, epoch=0):
    """All the epoch's draws at once, then np.flip on a boolean mask."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    steps = len(images) // batch_size
    flips = rng.random(steps * batch_size) < 0.5
    for s in range(steps):
        sel = slice(s * batch_size, (s + 1) * batch_size)
        x = images[order[sel]].copy()
        m = flips[sel]
        x[m] = np.flip(x[m], axis=2)
        yield Batch(x, np.int32(labels[order[sel]]), np.ones(batch_size, dtype=np.float32))


def _clipped(grads, max_norm, kind):
    """The gradient as each clipping mistake leaves it (and right for any other kind)."""
    leaves = jax.tree.leaves(grads)
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
    if kind == "no clip":
        return grads, norm
    if kind == "per array":
        return jax.tree.map(lambda g: g * jnp.minimum(1.0, max_norm / jnp.linalg.norm(g)),
                            grads), norm
    if kind == "by value":
        return jax.tree.map(lambda g: jnp.clip(g, -max_norm, max_norm), grads), norm
    if kind == "always rescale":
        return jax.tree.map(lambda g: g * max_norm / norm, grads), norm
    if kind == "squared norm":
        return jax.tree.map(lambda g: g * jnp.minimum(1.0, max_norm / norm ** 2), grads), norm
    scale = jnp.minimum(1.0, max_norm / norm)
    return jax.tree.map(lambda g: g * scale, grads), norm


def make_step(kind):
    """Plausible wrong steps, one mistake each."""
    @nnx.jit
    def step(model, optimizer, batch, max_norm):
        w = batch.weights if kind != "unweighted" else jnp.ones_like(batch.weights)
        scale = 1.0 if kind == "raw pixels" else 1 / 255

        def loss_fn(m):
            logits = m(batch.images.astype(jnp.float32)[..., None] * scale)
            ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.labels)
            if kind == "sum":
                return jnp.sum(w * ce), logits
            if kind == "nan":
                return jnp.sum(w * ce) / 0.0 * 0.0, logits
            if kind == "batch mean":
                return jnp.mean(w * ce), logits
            if kind == "slices off the padding":
                return jnp.mean(ce[:48]), logits
            return jnp.sum(w * ce) / jnp.maximum(jnp.sum(w), 1.0), logits

        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        grads, norm = _clipped(grads, max_norm, kind)
        if kind == "by hand":
            params = nnx.state(model, nnx.Param)
            nnx.update(model, jax.tree.map(lambda p, g: p - 0.01 * g, params, grads))
        elif kind != "no update":
            optimizer.update(model, grads)
        if kind == "twice":
            optimizer.update(model, grads)
        if kind == "loss after update":
            loss = loss_fn(model)[0]
        hits = jnp.argmax(logits, -1) == batch.labels
        acc_w = batch.weights if kind != "unweighted accuracy" else jnp.ones_like(batch.weights)
        accuracy = jnp.sum(acc_w * hits) / jnp.sum(acc_w)
        if kind == "tuple":
            return loss, accuracy
        if kind == "no grad_norm":
            return {"loss": loss, "accuracy": accuracy}
        if kind == "norm after clipping":
            norm = jnp.minimum(norm, max_norm)
        return {"loss": loss, "accuracy": accuracy, "grad_norm": norm}

    return step


# -- Exercise 1 ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", [Good, Dense, WithinBudget])
def test_model_checker_accepts_honest_models(model):
    result = ch05.check_model(model)
    assert result.passed, msg(result)
    assert ch05.check_model(model, batch_sizes=(7, 100)).passed


class FixedBatch(Good):
    def __call__(self, x):
        x = nnx.relu(self.conv1(x))[:, ::2, ::2]
        return self.dense(x.reshape(4, -1))  # a hard-coded batch size


class SmallBatchesOnly(Good):
    def __call__(self, x):  # flattens with a batch size that is right only up to 4
        x = nnx.relu(self.conv1(x))[:, ::2, ::2]
        return self.dense(x.reshape(min(x.shape[0], 4), -1))


class Softmax3(Good):
    def __call__(self, x):
        return super().__call__(x)[:, :3]


class Probabilities(Good):
    def __call__(self, x):
        return nnx.softmax(super().__call__(x))


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


class RenamedCourseCNN(models.CNN):
    pass


class WrapsCourseCNN(nnx.Module):
    def __init__(self, *, rngs):
        self.net = models.CNN(rngs=rngs)

    def __call__(self, x):
        return self.net(x)


@pytest.mark.parametrize("answer, phrases", [
    (ChaptersCNN, ("206,922 parameters", "over the budget", "`dense`", "pool once more")),
    (FixedBatch, ("raised", "x.shape[0]")),
    (Softmax3, ("(N, 10)",)),
    (Probabilities, ("probabilities", "raw logits")),
    (WithBatchNorm, ("not nnx.Param", "BatchNorm")),
    (NeedsArgs, ("TypeError", "signature")),
    (NaNModel, ("NaN",)),
    ("CNN", ("should be a class",)),
    (lambda *, rngs: 3, ("not an nnx.Module",)),
    (models.CNN, ("course's models.CNN", "write this yourself")),
    (models.MLP, ("course's models.MLP",)),
    (RenamedCourseCNN, ("subclass of the course's models.CNN",)),
    (WrapsCourseCNN, ("models.CNN", "course's own")),
])
@pytest.mark.mistake
def test_model_checker_rejects_wrong_models(answer, phrases):
    result = ch05.check_model(answer)
    assert says(result, *phrases), msg(result)


def test_model_checker_reports_an_unwritten_model():
    class Stub(nnx.Module):
        def __init__(self, *, rngs):
            raise NotImplementedError("Exercise 1: write your code here")
    assert ch05.check_model(Stub).status == "not written"
    assert ch05.check_model(NotWritten("Exercise 1")).status == "not written"


@pytest.mark.mistake
def test_hidden_batch_sizes_catch_a_model_right_only_for_the_notebooks_batches():
    seed = checks.grading_seed("someone", 5)
    assert ch05.check_model(SmallBatchesOnly).passed  # the notebook's (4, 1)
    graded = ch05.LAB.grade({"FashionModel": SmallBatchesOnly}, seed=seed)[0]
    assert says(graded, "does not show (a batch of") and not graded.answer, msg(graded)
    assert ch05.LAB.grade({"FashionModel": Dense}, seed=seed)[0].passed


# -- Exercise 2 ---------------------------------------------------------------------------


def test_prediction_checker_accepts_the_arithmetic():
    result = ch05.check_prediction(Good, GOOD_PARAMS, GOOD_FLOPS)
    assert result.passed, msg(result)


@pytest.mark.parametrize("params, flops, phrase", [
    (GOOD_PARAMS - 8 - 10, GOOD_FLOPS, "biases"),  # weights only
    (GOOD_PARAMS * 4, GOOD_FLOPS, "bytes"),  # float32 bytes, not parameters
    (GOOD_PARAMS * 64, GOOD_FLOPS, "do not grow with the batch"),
    (GOOD_PARAMS + 1000, GOOD_FLOPS, "weights AND biases"),
    (GOOD_PARAMS, GOOD_FLOPS / 64, "per image"),
    (GOOD_PARAMS, GOOD_FLOPS / 3, "forward pass only"),
    (GOOD_PARAMS, GOOD_FLOPS / 2, "multiply-adds: XLA counts 2"),
    (GOOD_PARAMS, GOOD_FLOPS / 6, "multiply-adds of the forward pass only"),
    (GOOD_PARAMS, GOOD_FLOPS / 192, "one image's forward pass"),
])
@pytest.mark.mistake
def test_prediction_checker_names_each_mistake(params, flops, phrase):
    result = ch05.check_prediction(Good, params, flops)
    assert says(result, phrase), msg(result)
    assert result.answer  # the expected values only through checks.reveal
    assert f"{GOOD_PARAMS:,}" not in result.message + result.hint


@pytest.mark.parametrize("params, flops", [
    ("14,170", GOOD_FLOPS), (None, GOOD_FLOPS), (GOOD_PARAMS, float("nan")),
    (GOOD_PARAMS, np.ones(3)), (True, GOOD_FLOPS),
])
@pytest.mark.mistake
def test_prediction_checker_rejects_garbage_without_raising(params, flops):
    result = ch05.check_prediction(Good, params, flops)
    assert result.status == "failed", msg(result)


def test_prediction_of_a_model_that_does_not_build_fails_cleanly():
    result = ch05.check_prediction("CNN", GOOD_PARAMS, GOOD_FLOPS)
    assert says(result, "could not be built", "Exercise 1"), msg(result)


def test_the_prediction_is_recorded_then_locked_before_the_measurement_shows(capsys):
    stub = NotWritten("Exercise 2")
    assert ch05.check_prediction(Good, stub, stub).status == "not written"
    assert not hasattr(ch05, "record_prediction")  # LAB.predict replaces it
    assert ch05.LAB.find("Exercise 2").predicts == ("predicted_params", "predicted_step_flops")
    ch05.LAB.predict("Exercise 2", stub, stub)
    assert not ch05.LAB.predicted("Exercise 2")  # nothing recorded: no measurement
    assert "once your prediction is recorded" in capsys.readouterr().out
    ch05.LAB.predict("Exercise 2", GOOD_PARAMS, GOOD_FLOPS / 3)  # forward only
    assert ch05.LAB.predicted("Exercise 2")  # the measurement is shown: locked
    result = ch05.check_prediction(Good, GOOD_PARAMS, GOOD_FLOPS)  # edited after seeing it
    assert says(result, "forward pass only", "recorded before the measurement"), msg(result)
    card = ch05.LAB.scorecard({"FashionModel": Good, "predicted_params": GOOD_PARAMS,
                               "predicted_step_flops": GOOD_FLOPS})
    assert card.results[1].status == "failed"


# -- Exercise 3 ---------------------------------------------------------------------------


def test_step_checker_accepts_an_honest_step():
    result = ch05.check_train_step(honest_step)  # hidden inputs: the whole-lab test below
    assert result.passed, msg(result)


@pytest.mark.parametrize("kind, phrases", [
    ("unweighted", ("padding examples (weight 0) too",)),
    ("sum", ("sum over the batch",)),
    ("batch mean", ("divides by the batch size",)),
    ("raw pixels", ("0..255 pixels", "prepare_images")),
    ("loss after update", ("after the optimizer step",)),
    ("nan", ("NaN",)),
    ("no update", ("did not change",)),
    ("twice", ("twice as far", "exactly once")),
    ("by hand", ("differ from one optimizer update", "no update by hand")),
    ("unweighted accuracy", ("accuracy", "padding")),
    ("tuple", ("returned a tuple",)),
    ("no clip", ("unclipped gradient", "clip is active")),
    ("per array", ("clipped on its own norm", "global norm")),
    ("by value", ("unclipped gradient", "clipping by value")),
    ("always rescale", ("scaled up", "not active")),
    ("squared norm", ("squared norm",)),
    ("no grad_norm", ("lacks ['grad_norm']", "before clipping")),
    ("norm after clipping", ("grad_norm is the norm after clipping",)),
])
@pytest.mark.mistake
def test_step_checker_names_each_wrong_step(kind, phrases):
    result = ch05.check_train_step(make_step(kind))
    assert says(result, *phrases), msg(result)


@pytest.mark.mistake
def test_hidden_batches_catch_a_step_that_hard_codes_the_notebooks_padding():
    step = make_step("slices off the padding")  # right only when the last 16 of 64 are padding
    assert ch05.check_train_step(step).passed
    graded = ch05.LAB.find("Exercise 3").grade_hidden({"train_step": step},
                                                      checks.grading_seed("someone", 5))
    assert says(graded, "does not show (a batch of"), msg(graded)


def test_step_checker_wants_a_compiled_step():
    result = ch05.check_train_step(honest_step.fun if hasattr(honest_step, "fun") else
                                   (lambda m, o, b: None))
    assert says(result, "not compiled", "@nnx.jit"), msg(result)


@pytest.mark.mistake
def test_step_checker_refuses_the_course_step():
    ref = nnx.jit(answers.train_step)

    @nnx.jit
    def uses_course_loss(model, optimizer, batch, max_norm):
        graphdef, params = nnx.split(model, nnx.Param)
        (loss, logits), grads = jax.value_and_grad(train.loss_fn, has_aux=True)(
            params, graphdef, batch)
        optimizer.update(model, grads)
        return {"loss": loss, "accuracy": jnp.mean(logits.argmax(-1) == batch.labels),
                "grad_norm": optax.tree.norm(grads)}

    for step in (ref, uses_course_loss):
        result = ch05.check_train_step(step)
        assert says(result, "course's own function", "write this yourself"), msg(result)


def test_step_checker_reports_an_unwritten_step():
    @nnx.jit
    def step(model, optimizer, batch, max_norm):
        raise NotImplementedError("Exercise 3: write your code here")
    assert ch05.check_train_step(step).status == "not written"


# -- Exercise 4 ---------------------------------------------------------------------------


def test_pipeline_checker_accepts_an_honest_pipeline():
    result = ch05.check_fast_batches(honest_batches)
    assert result.passed, msg(result)


def _course_order(images, labels, batch_size, seed, epoch):
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    steps = len(images) // batch_size
    return rng, order, steps


def make_pipeline(kind):
    def pipeline(images, labels, batch_size, seed=0, epoch=0):
        if kind == "other shuffle":
            seed += 1
        rng, order, steps = _course_order(images, labels, batch_size, seed, epoch)
        for s in range(steps + (kind == "padded tail")):
            idx = order[s * batch_size:(s + 1) * batch_size]
            x = images[idx]
            if len(idx) < batch_size:  # a last, partial batch
                yield Batch(x, labels[idx].astype(np.int32), np.ones(len(idx), np.float32))
                return
            u = rng.random(64 if kind == "hard-coded 64" else batch_size)[:batch_size]
            flip = (u < 0.5)[:, None, None]
            mirrored = {"upside down": x[:, ::-1, :]}.get(kind, x[:, :, ::-1])
            x = {"no flips": x, "all flipped": mirrored,
                 "opposite flips": np.where(flip, x, mirrored)}.get(
                     kind, np.where(flip, mirrored, x))
            if kind == "floats":
                x = x.astype(np.float32) / 255
            yield Batch(x, labels[idx].astype(np.int32), np.ones(batch_size, np.float32))
    return pipeline


def still_slow(images, labels, batch_size, seed=0, epoch=0):
    """The learner's own per-example loop: right, but no faster."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(images))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        xs = []
        for i in order[start:start + batch_size]:
            image = [list(row) for row in images[i]]
            xs.append([row[::-1] for row in image] if rng.random() < 0.5 else image)
        yield Batch(np.array(xs, np.uint8), labels[order[start:start + batch_size]]
                    .astype(np.int32), np.ones(batch_size, np.float32))


@pytest.mark.parametrize("fn, phrases", [
    (make_pipeline("other shuffle"), ("other examples", "same generator")),
    (make_pipeline("no flips"), ("no image is mirrored",)),
    (make_pipeline("all flipped"), ("every image is mirrored",)),
    (make_pipeline("opposite flips"), ("opposite ones",)),
    (make_pipeline("upside down"), ("upside down",)),
    (make_pipeline("floats"), ("uint8",)),
    (make_pipeline("padded tail"), ("batches", "last full batch")),
    (still_slow, ("faster", "whole batches")),
    ("fast", ("should be a function",)),
    (answers.fast_batches, ("course's own function",)),
    (ch05.slow_batches, ("course's own function",)),
    (lambda im, lb, bs, seed=0, epoch=0: train.batches(im, lb, bs, seed=seed, epoch=epoch),
     ("course's own function",)),
])
@pytest.mark.mistake
def test_pipeline_checker_names_each_wrong_pipeline(fn, phrases):
    result = ch05.check_fast_batches(fn)
    assert says(result, *phrases), msg(result)


@pytest.mark.mistake
def test_hidden_batch_sizes_catch_a_pipeline_hard_coded_for_64():
    fn = make_pipeline("hard-coded 64")
    assert ch05.check_fast_batches(fn, timed=False).passed
    seed = checks.grading_seed("someone", 5)
    cases = ch05.LAB.find("Exercise 4").hidden(np.random.default_rng(seed))
    assert all(not ch05.check_fast_batches(fn, **kw).passed for _, kw in cases)
    assert all(ch05.check_fast_batches(honest_batches, **kw).passed for _, kw in cases)


def test_pipeline_checker_survives_a_pipeline_that_raises():
    def broken(images, labels, batch_size, seed=0, epoch=0):
        raise IndexError("oops")
    result = ch05.check_fast_batches(broken)
    assert result.status == "failed" and "IndexError" in result.message


def test_the_course_pipeline_is_the_slow_one_vectorised():
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (130, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, 130).astype(np.int32)
    for a, b in zip(answers.fast_batches(images, labels, 32, seed=2, epoch=1),
                    ch05.slow_batches(images, labels, 32, seed=2, epoch=1), strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


# -- Exercise 5 ---------------------------------------------------------------------------


def _templates(n, seed):
    rng = np.random.default_rng(seed)
    templates = np.random.default_rng(0).integers(0, 256, (10, 28, 28))
    y = np.arange(n, dtype=np.int32) % 10
    rng.shuffle(y)
    x = np.clip(templates[y] + rng.normal(0, 40, (n, 28, 28)), 0, 255).astype(np.uint8)
    return x, y


@pytest.fixture
def fake_fashion(monkeypatch):
    """A small learnable data set the checker trains and tests on instead of Fashion-MNIST."""
    train_x, train_y = _templates(640, 1)
    test_x, test_y = _templates(200, 2)
    monkeypatch.setitem(ch05._CACHE, "fashion", (train_x, train_y, test_x, test_y))
    return train_x, train_y, test_x, test_y


CONFIG = {"batch_size": 64, "learning_rate": 5e-3, "warmup_steps": 5}


def test_accuracy_checker_trains_honest_pieces_itself(fake_fashion):
    result = ch05.check_accuracy(Good, honest_step, honest_batches, CONFIG)
    assert result.passed and "after 3 epochs (30 steps)" in result.message, msg(result)
    again = ch05.check_accuracy(Good, honest_step, honest_batches, dict(CONFIG))
    assert again.passed and "the training run above" in again.message  # no second run


@pytest.mark.mistake
def test_a_pipeline_that_feeds_other_images_is_caught(fake_fashion):
    _, _, test_x, test_y = fake_fashion

    def test_set_instead(images, labels, batch_size, seed=0, epoch=0):
        yield from honest_batches(np.concatenate([test_x] * 4), np.concatenate([test_y] * 4),
                                  batch_size, seed, epoch)

    def with_extra_data(images, labels, batch_size, seed=0, epoch=0):
        yield from honest_batches(images, labels, batch_size, seed, epoch)
        yield from honest_batches(test_x, test_y, batch_size, seed, epoch)

    def stops_early(images, labels, batch_size, seed=0, epoch=0):
        yield from list(honest_batches(images, labels, batch_size, seed, epoch))[:3]

    for fn, phrase in ((test_set_instead, "differs from the expected one"),
                       (with_extra_data, "more batches than the epoch has"),
                       (stops_early, "stopped after 3 batches")):
        result = ch05.check_accuracy(Good, honest_step, fn, CONFIG)
        assert says(result, phrase, "Exercise 4"), msg(result)


@pytest.mark.mistake
def test_a_step_that_trains_on_anything_else_is_caught(fake_fashion):
    _, _, test_x, test_y = fake_fashion
    test_batch = Batch(test_x[:64], test_y[:64], np.ones(64, np.float32))

    @nnx.jit
    def on_the_test_set(model, optimizer, batch, max_norm):
        return honest_step(model, optimizer, test_batch, max_norm)

    @nnx.jit
    def also_on_the_test_set(model, optimizer, batch, max_norm):
        honest_step(model, optimizer, test_batch, max_norm)
        return honest_step(model, optimizer, batch, max_norm)

    for step in (on_the_test_set, also_on_the_test_set):
        result = ch05.check_accuracy(Good, step, honest_batches, CONFIG)
        assert says(result, "did not make one optimizer update", "Exercise 3"), msg(result)


class LooksUpTheTestSet(Good):
    """Trained before it is built: it finds each image's nearest test image."""

    def __init__(self, *, rngs):
        super().__init__(rngs=rngs)
        _, _, x, y = ch05._CACHE["fashion"]  # kept outside the model's state
        type(self).lookup = (x.reshape(len(x), -1) / 255.0, np.eye(10)[y] * 10)

    def __call__(self, x):
        table, answers = type(self).lookup
        d = jnp.sum((x.reshape(len(x), -1)[:, None] - table[None]) ** 2, -1)
        return jnp.asarray(answers)[jnp.argmin(d, -1)] + 0 * super().__call__(x)


@pytest.mark.parametrize("config, phrases", [
    ({**CONFIG, "epochs": 30}, ("exactly 3 epochs",)),
    ([64, 5e-3], ("should be a dict",)),
    ({"batch_size": 64}, ("no 'learning_rate'",)),
    ({**CONFIG, "learning_rate": "5e-3"}, ("string",)),
    ({**CONFIG, "batch_size": 4}, ("outside",)),
    ({**CONFIG, "batch_size": 64.0}, ("whole number",)),
    ({**CONFIG, "learning_rate": -1.0}, ("not a step size",)),
    ({**CONFIG, "warmup_steps": 1000}, ("warm-up steps",)),
])
def test_accuracy_checker_reads_the_config_strictly(fake_fashion, config, phrases):
    result = ch05.check_accuracy(Good, honest_step, honest_batches, config)
    assert says(result, *phrases), msg(result)


@pytest.mark.parametrize("answer, phrases", [
    ((LooksUpTheTestSet, honest_step, honest_batches), ("before any training",)),
    ((models.CNN, honest_step, honest_batches), ("course's models.CNN",)),
    ((ChaptersCNN, honest_step, honest_batches), ("over exercise 1's budget", "Exercise 1")),
    ((Good, nnx.jit(answers.train_step), honest_batches), ("course's own function",)),
    ((Good, honest_step, answers.fast_batches), ("course's own function",)),
    ((Good, inspect.unwrap(honest_step), honest_batches),
     ("not compiled",)),
    ((Good, "step", honest_batches), ("should be a function",)),
])
@pytest.mark.mistake
def test_accuracy_checker_refuses_shortcuts(fake_fashion, answer, phrases):
    result = ch05.check_accuracy(*answer, CONFIG)
    assert says(result, *phrases), msg(result)


@pytest.mark.mistake
def test_accuracy_checker_names_a_learning_rate_that_cannot_reach_the_target(fake_fashion):
    slow = ch05.check_accuracy(Good, honest_step, honest_batches,
                               {**CONFIG, "learning_rate": 1e-6})
    assert says(slow, "the target is 85%", "too small"), msg(slow)
    assert "learning_rate 0.005" in slow.answer  # the course's configuration, through checks.reveal


def test_accuracy_checker_reports_unwritten_pieces(fake_fashion):
    stub = NotWritten("Exercise 5")
    assert ch05.check_accuracy(Good, honest_step, honest_batches, stub).status == "not written"

    @nnx.jit
    def unwritten(model, optimizer, batch, max_norm):
        raise NotImplementedError("Exercise 3: write your code here")

    assert ch05.check_accuracy(Good, unwritten, honest_batches, CONFIG).status == "not written"


# -- the whole lab, as the grader sees it ----------------------------------------------------


def test_scorecard_counts_every_exercise(fake_fashion):
    card = ch05.LAB.scorecard({"FashionModel": Good})
    assert card.total() == "Lab 5: 1 of 5 passed"
    assert {e.kind for e in ch05.LAB.exercises} >= {"write", "predict", "apply"}
    assert all(e.hidden is not None for e in ch05.LAB.exercises[:1] + ch05.LAB.exercises[2:4])


def test_an_honest_lab_passes_the_grader_on_unseen_inputs(fake_fashion):
    namespace = {"FashionModel": Good, "predicted_params": GOOD_PARAMS,
                 "predicted_step_flops": GOOD_FLOPS, "train_step": honest_step,
                 "fast_batches": honest_batches, "fashion_config": CONFIG}
    results = ch05.LAB.grade(namespace, seed=checks.grading_seed("someone", 5))
    assert all(results), "\n".join(map(str, results))
    assert "unseen" in results[0].message and "unseen" in results[3].message
